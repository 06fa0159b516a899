"""The MAGRPO scripts of CoMLRL's task repositories (OpenMLRL's LLM_Collab_Writing,
LLM_Collab_Code_Completion, LLM_Collab_Minecraft) run here unchanged in shape: what they
import, how they build the trainer (``dataset_type=`` of CoMLRL 1.4.0-1.4.2, an
``agent_model`` + ``agents`` pair of models loaded from it), train and save; and what a run
leaves on disk (issue 40, items 20-23).

Each test below is written here after the shape of one repository's ``train_magrpo.py``
(their own config overrides only: a local model, few examples, few tokens); no code is
copied from them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

#: CoMLRL 1.4.3's install_requires (its setup.py): distribution -> the module it imports as
REQUIRES_143 = {
    "datasets": "datasets",
    "numpy": "numpy",
    "openai": "openai",
    "packaging": "packaging",
    "pyyaml": "yaml",
    "tqdm": "tqdm",
    "transformers": "transformers",
    "wandb": "wandb",
}


def test_compat_installs_what_1_4_3_installs() -> None:
    """Scripts import what 1.4.3 brought along (the Writing repository's actor-critic
    scripts start with ``import wandb``)."""
    declared = {
        re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower()
        for r in importlib.metadata.requires("comlrl-compat") or []
    }
    missing = sorted(set(REQUIRES_143) - declared)
    assert not missing, f"comlrl-compat does not require {missing}"
    for module in REQUIRES_143.values():
        assert importlib.util.find_spec(module) is not None, f"import {module} fails"


# --- the repositories' MAGRPO script shapes ---------------------------------------------------


@pytest.fixture
def local_model(stories260k: str) -> str:
    return stories260k


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")  # their wandb_config, sent nowhere


def _dataset(rows: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(rows)


def _tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _wandb_config(kind: str) -> dict[str, Any]:
    return {
        "project": kind,
        "entity": None,
        "name": f"{kind}-magrpo",
        "dir": None,
        "tags": ["magrpo", kind],
        "config_sections": {"dataset": {"type": kind}, "output": {"verbose": False}},
    }


def _summary_reward(*agent_completions: list[str], batch_items: Any = None, prompts: Any = None):  # type: ignore[no-untyped-def]
    a, b = agent_completions[0], agent_completions[1]
    return [min(len(x), len(y)) / 20.0 for x, y in zip(a, b)]


def test_a_writing_magrpo_script_runs(local_model: str, tmp_path: Path) -> None:
    """LLM_Collab_Writing: ``agent_model`` by name, one tokenizer, ``model_config`` with a
    dtype and special tokens, ``dataset_type``, eval logger/aggregator, a scaling reward
    processor, ``trainer.verbose``, ``train()``, ``save_model``."""
    tokenizer = _tokenizer(local_model)
    args = MAGRPOConfig(
        num_turns=1, num_train_epochs=1, agent_learning_rate=5e-6, logging_steps=50,
        num_generations=2, max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=None,
        num_agents=2, parallel_training="none", agent_devices=["cpu"],
        early_termination_threshold=-0.2, rollout_buffer_size=1, train_batch_size=1,
        advantage_normalization=True, eval_interval=20, eval_num_samples=1, eval_batch_size=1,
    )  # fmt: skip
    kwargs: dict[str, Any] = {
        "agent_model": local_model,
        "agents": None,
        "num_agents": 2,
        "model_config": {"torch_dtype": "float32", "special_tokens": {}},
        "reward_func": _summary_reward,
        "formatters": [lambda ex: f"Summary: {ex['prompt']}", lambda ex: f"More: {ex['prompt']}"],
        "args": args,
        "train_dataset": _dataset([{"prompt": "Once upon a time"}, {"prompt": "The dog"}]),
        "eval_dataset": _dataset([{"prompt": "Tim had a"}]),
        "tokenizer": tokenizer,
        "wandb_config": _wandb_config("tldr"),
        "dataset_type": "tldr",
        "eval_logger": lambda *, agent_completions_turns, **_: [],
        "eval_aggregator": lambda metrics, num_turns=1: {},
        "reward_processor": RewardProcessors.scale(factor=1.0),
    }
    with pytest.warns(DeprecationWarning, match="dataset_type"):
        trainer = MAGRPOTrainer(**kwargs)
    trainer.verbose = False
    trainer.train()
    saved = trainer.save_model(tmp_path / "final_model")
    assert [p.name for p in saved] == ["agent_0", "agent_1"]


def test_a_code_completion_magrpo_script_runs(local_model: str, tmp_path: Path) -> None:
    """LLM_Collab_Code_Completion: the config's fields filtered by
    ``inspect.signature(MAGRPOConfig.__init__)``, two turns with ``discount=0.9``, an
    ``external_transition`` wrapper taking ``**kwargs``, ``dataset_type``."""
    candidate = {
        "num_turns": 2, "num_train_epochs": 1, "agent_learning_rate": 1e-5, "logging_steps": 1,
        "num_generations": 2, "max_new_tokens": 6, "temperature": 0.6, "top_p": 0.6,
        "top_k": None, "num_agents": 2, "parallel_training": "none", "agent_devices": ["cpu"],
        "discount": 0.9, "joint_mode": "aligned", "early_termination_threshold": 2.0,
        "rollout_buffer_size": 1, "train_batch_size": 1, "advantage_normalization": True,
        "eval_interval": 10, "eval_num_samples": 1, "eval_batch_size": 1,
        "external_prompt_passthrough": False, "not_a_field": 1,
    }  # fmt: skip
    params = set(inspect.signature(MAGRPOConfig.__init__).parameters) - {"self"}
    args = MAGRPOConfig(**{k: v for k, v in candidate.items() if k in params})

    def transition(
        prompt: str,
        agent_completions: list[str],
        num_agents: int | None = None,
        prompt_history_per_agent: Any = None,
        response_history_per_agent: Any = None,
        **_kwargs: Any,
    ) -> list[str]:
        return [f"{prompt}\nYour code failed: {c[:10]}" for c in agent_completions]

    with pytest.warns(DeprecationWarning, match="dataset_type"):
        trainer = MAGRPOTrainer(
            agent_model=local_model,
            agents=None,
            num_agents=2,
            model_config={"torch_dtype": None, "special_tokens": {}},
            reward_func=lambda a, b: [float(len(x) > len(y)) for x, y in zip(a, b)],
            formatters=[lambda ex: f"Complete: {ex['prompt']}"] * 2,
            args=args,
            train_dataset=_dataset([{"prompt": "class A:"}]),
            eval_dataset=_dataset([{"prompt": "class B:"}]),
            tokenizer=_tokenizer(local_model),
            wandb_config=_wandb_config("classeval"),
            dataset_type="classeval",
            external_transition=transition,
        )
    trainer.verbose = False
    rows = trainer.train()  # rewards never above 2.0: every episode reaches turn 2
    assert any(k.startswith("turn_1/") for k in rows[-1])


def test_a_minecraft_magrpo_script_runs_with_agent_model_and_its_loaded_agents(
    local_model: str,
) -> None:
    """LLM_Collab_Minecraft: the agents loaded by the script from ``agent_model``'s name
    and passed with it (1.4.2's form, which 1.4.3 refuses: a deprecation warning here), one
    tokenizer, a shifting reward processor, ``dataset_type``."""
    from transformers import AutoModelForCausalLM

    agents = [AutoModelForCausalLM.from_pretrained(local_model) for _ in range(2)]
    args = MAGRPOConfig(
        num_agents=2, num_turns=2, num_train_epochs=1, agent_learning_rate=1e-5,
        num_generations=2, max_new_tokens=6, discount=0.9, early_termination_threshold=-0.1,
        rollout_buffer_size=1, train_batch_size=1, eval_interval=2, eval_num_samples=1,
    )  # fmt: skip
    processor = RewardProcessors.shift(value=-1.0)
    with pytest.warns(DeprecationWarning) as record:
        trainer = MAGRPOTrainer(
            agent_model=local_model,
            agents=agents,
            num_agents=2,
            reward_func=lambda a, b: [0.5 * (len(x) + len(y) > 10) for x, y in zip(a, b)],
            formatters=[lambda ex: f"Build: {ex['prompt']}"] * 2,
            args=args,
            train_dataset=_dataset([{"prompt": "a house"}]),
            eval_dataset=None,
            tokenizer=_tokenizer(local_model),
            wandb_config=_wandb_config("house_build"),
            dataset_type="house_build",
            reward_processor=processor,
            external_transition=lambda **kw: ["Place blocks again."] * kw["num_agents"],
        )
    assert {"dataset_type", "agents= alone"} <= {
        m for w in record for m in ("dataset_type", "agents= alone") if m in str(w.message)
    }
    assert trainer.agents[0] is agents[0]  # the script's own models are trained
    before = agents[0].lm_head.weight.detach().clone()
    trainer.train()
    assert not torch.equal(before, agents[0].lm_head.weight)


def test_a_conflicting_agent_model_and_agents_pair_names_them_not_their_repr(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    with pytest.raises(ValueError, match="conflict") as info:
        MAGRPOTrainer(
            agent_model="org/other-model",
            agents=[tiny_model, tiny_model],
            tokenizer=tiny_tokenizer,
            reward_func=lambda a, b: [0.0] * len(a),
            args=MAGRPOConfig(num_turns=1),
        )
    message = str(info.value)
    assert "org/other-model" in message and len(message) < 400, message
    assert "Linear(" not in message and "Embedding(" not in message


# --- what a run leaves on disk ----------------------------------------------------------------


def _footprint(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_train_without_checkpoint_dir_leaves_nothing_on_disk(
    tiny_model: Any, tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.4.3 writes only what the script saves; here the run's folder is temporary and
    deleted when train() returns (or raises), and a run with checkpoint_dir writes there
    only."""
    import copy

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def by_length(a: list[str], b: list[str]) -> list[float]:
        return [float(len(x)) for x in a]

    def build(reward: Any = by_length) -> MAGRPOTrainer:
        return MAGRPOTrainer(
            agents=[tiny_model, copy.deepcopy(tiny_model)],
            tokenizer=tiny_tokenizer,
            train_dataset=[{"prompt": "Once"}, {"prompt": "The dog"}],
            reward_func=reward,
            args=MAGRPOConfig(
                num_turns=1,
                num_generations=2,
                max_new_tokens=4,
                eval_interval=0,
                num_train_epochs=1,
            ),
        )

    trainer = build()
    assert len(trainer.train()) == 1
    assert list(scratch.iterdir()) == [] and _footprint(scratch) == 0
    trainer.train()  # a second run: still nothing left
    assert list(scratch.iterdir()) == []

    def boom(a: list[str], b: list[str]) -> list[float]:
        raise RuntimeError("reward failed")

    failing = build(boom)
    with pytest.raises(RuntimeError, match="reward failed") as info:
        failing.train()
    assert list(scratch.iterdir()) == []
    assert any("temporary folder" in note for note in getattr(info.value, "__notes__", []))

    kept = build()
    kept.train(checkpoint_dir=tmp_path / "run")
    assert list(scratch.iterdir()) == [] and (tmp_path / "run" / "metrics.jsonl").is_file()
