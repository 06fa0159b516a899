"""Every policy-gradient recipe takes tools end to end (issue 29, item 1).

A scripted backend writes a fenced Python call and then an answer, as token ids, so each
row makes one tool call per turn whatever the random tiny model would write; its NaN
behaviour log-probs are measured by the tool loop with the real model, so the first
importance ratio of a step is 1 only if the update sees exactly the sampled sequence
(prompt, model segments, observations) with observations masked out.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.actor_critic.recipe import IACTrainer, MAACTrainer
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.tool_calls import sample_with_tools
from comlrl.algos.rollout.toolbox import ToolBox
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams, Tool
from comlrl.core.tools import TOOL_FORMATS, ToolCall, ToolFormat, ToolResult

CODE = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
EXAMPLES = [{"q": f"What is {i} * 7?"} for i in range(2, 6)]


def _exec_python(code: str) -> str:
    """A test stand-in for the sandboxed Python tool (the test's own code only)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 - the scripts below are the test's own
    return out.getvalue().strip()


PYTHON = Tool("python", "Run Python code and read what it prints.", CODE, run=_exec_python)


class ScriptedBackend:
    """Writes ``script(context_text)`` for every row (then EOS), NaN log-probs."""

    name = "native"
    recompute_logprobs = False
    supports_stop = False

    def __init__(self, tokenizer: Any, script: Callable[[str], str]) -> None:
        self.tokenizer, self.script = tokenizer, script

    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: Any = None,
        stop: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows: list[list[int]] = []
        for p in range(input_ids.shape[0]):
            context = self.tokenizer.decode(input_ids[p][attention_mask[p].bool()].tolist())
            for _ in range(params.num_generations):
                ids = self.tokenizer(self.script(context), add_special_tokens=False)["input_ids"]
                rows.append(list(ids)[: params.max_new_tokens - 1] + [self.tokenizer.eos_token_id])
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return ids, torch.full(ids.shape, float("nan"))

    def after_update(self) -> None:
        """Nothing to do."""


def script(context: str) -> str:
    """One call per turn: answer once this turn's text (after the question) holds a result."""
    turn = context[max(context.rfind("What is"), context.rfind("#revise")) :]
    if "```output\n" in turn:
        return "So the answer follows.\nAnswer: 42"
    return "Let me compute.\n```python\nprint(6 * 7)\n```\nignored tail"


def _reward(a: Sequence[str], b: Sequence[str]) -> list[float]:
    return [float("Answer: 42" in x) + 0.5 * len(y) % 3 for x, y in zip(a, b)]


def _transition(  # type: ignore[no-untyped-def]
    prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent
):
    return [f"{prompt} #revise {a}" for a in range(num_agents)]


def _agents(tok: Any, lora: bool = False) -> list[HFAgent]:
    out = []
    for i in range(2):
        model = build_default_model(len(tok), seed=i)
        backend = ScriptedBackend(tok, script)
        out.append(HFAgent(model, tok, name=f"agent_{i}", prompt_format="raw", backend=backend))
    return out


def _with_tools(trainer: Any) -> Any:
    """Give agent 0 the python tool and agent 1 none, in the trainer's own environment."""
    trainer.env.toolboxes = (ToolBox((PYTHON,), fallback_format="python"), None)
    return trainer


def _settings(tmp: Path, **kw: Any) -> dict[str, Any]:
    base = dict(
        num_steps=2, batch_size=2, num_generations=2, max_new_tokens=48, learning_rate=1e-3,
        clip_ratio=0.2, output_dir=str(tmp), progress=False, parallel_agents=False,
        log_samples=2,
    )  # fmt: skip
    return {**base, **kw}


def _check(row: Mapping[str, Any], tmp: Path) -> None:
    assert row["tool_calls_mean/agent_0"] >= 1.0, row
    assert "tool_calls_mean/agent_1" not in row
    assert row["tool_error_fraction"] == 0.0
    ratio = [v for k, v in row.items() if "ratio_mean" in k and "agent_0" in k]
    assert ratio, sorted(row)
    for v in ratio:  # float32 segment prefill vs the full forward: ~1e-6
        assert abs(v - 1.0) < 1e-3, row
    text = (tmp / "samples.jsonl").read_text()
    assert "```output\\n42" in text


@pytest.mark.parametrize("turns", [1, 2])
def test_magrpo_steps_with_tools(tiny_tokenizer: Any, tmp_path: Path, turns: int) -> None:
    cfg = TrainConfig(**_settings(tmp_path, num_turns=turns))
    trainer = _with_tools(
        MultiAgentTrainer(
            _agents(tiny_tokenizer), cfg, dataset=EXAMPLES, reward_func=_reward,
            formatters=[lambda ex: ex["q"]] * 2, transition=_transition if turns > 1 else None,
        )
    )  # fmt: skip
    history = trainer.train()
    assert len(history) == 2
    _check(history[0], tmp_path)
    if turns == 2:
        assert history[0]["turn_1/tool_calls_mean/agent_0"] >= 1.0


def test_seq_sum_steps_with_tools_inside_the_budget(tiny_tokenizer: Any, tmp_path: Path) -> None:
    """``loss_reduction=seq_sum`` divides by the budget of the model's tokens
    (``max_new_tokens``); the observations inside a completion make it wider than that
    budget, and the update must not take the width for the model's tokens."""
    budget = 32
    agent = _agents(tiny_tokenizer)[0]
    box = ToolBox((PYTHON,), fallback_format="python")
    batch = sample_with_tools(agent, [EXAMPLES[0]["q"]], SamplingParams(2, budget), box).batch
    assert int(batch.completion_mask.sum(dim=1).max()) <= budget < batch.completion_mask.shape[1]
    cfg = TrainConfig(**_settings(tmp_path, max_new_tokens=budget, loss_reduction="seq_sum"))
    trainer = _with_tools(
        MultiAgentTrainer(
            _agents(tiny_tokenizer), cfg, dataset=EXAMPLES, reward_func=_reward,
            formatters=[lambda ex: ex["q"]] * 2,
        )
    )  # fmt: skip
    history = trainer.train()
    assert len(history) == 2
    _check(history[0], tmp_path)


def test_lora_agents_train_with_tools(
    tiny_tokenizer: Any, tmp_path: Path, letter_format: None
) -> None:
    """LoRA adapters on the native backend (real decoding, the stop hook) with tools."""
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'comlrl-algos[lora]'")
    from comlrl.algos.models.lora import is_lora_policy

    cfg = TrainConfig(**_settings(tmp_path, lora={"r": 4}, max_new_tokens=16))
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer,
                name=f"agent_{i}", prompt_format="raw")
        for i in range(2)
    ]  # fmt: skip
    trainer = MultiAgentTrainer(
        agents, cfg, dataset=EXAMPLES, reward_func=_reward, formatters=[lambda ex: ex["q"]] * 2
    )
    box = ToolBox((ECHO,), fallback_format="letter", max_tool_calls=2)
    trainer.env.toolboxes = (box, None)
    assert all(is_lora_policy(a.model) for a in trainer.agents)
    history = trainer.train()
    row = history[0]
    assert row["tool_calls_mean/agent_0"] > 0 and "tool_calls_mean/agent_1" not in row
    ratio = [v for k, v in row.items() if "ratio_mean" in k and "agent_0" in k]
    assert ratio and all(abs(v - 1.0) < 1e-3 for v in ratio), row
    assert "[ok]" in (tmp_path / "samples.jsonl").read_text()


@pytest.mark.parametrize("cls", [IACTrainer, MAACTrainer])
def test_actor_critic_steps_with_tools(tiny_tokenizer: Any, tmp_path: Path, cls: Any) -> None:
    cfg = ActorCriticConfig(**_settings(tmp_path, num_turns=2, critic_learning_rate=1e-3))
    trainer = _with_tools(
        cls(
            _agents(tiny_tokenizer), cfg, dataset=EXAMPLES, reward_func=_reward,
            formatters=[lambda ex: ex["q"]] * 2, transition=_transition,
        )
    )  # fmt: skip
    history = trainer.train()
    assert len(history) == 2
    _check(history[0], tmp_path)


class LetterFormat(ToolFormat):
    """Test-only format: a call is everything up to and including the first ``e`` of a
    segment (a random byte-level model writes one often), a call of the ``echo`` tool."""

    name = "letter"
    closers = ("e",)

    def find_call(self, text: str) -> tuple[int, int] | None:
        at = text.find("e")
        return None if at < 0 else (0, at + 1)

    def parse(self, call_text: str) -> ToolCall:
        return ToolCall("echo", {"text": call_text}, call_text)

    def describe(self, tools: Sequence[Tool]) -> str:
        return "Write e to call echo."

    def result_text(self, result: ToolResult) -> str:
        return f"[{result.content}]"


ECHO = Tool(
    "echo", "Say ok.", {"type": "object", "properties": {"text": {"type": "string"}}},
    run=lambda text: "ok",
)  # fmt: skip


def _paused_at_calls(transcript: str) -> bool:
    """Every model segment before a result ends within one token (<= 16 characters of a
    byte-level token) after its first ``e``: generation paused at the call's token."""
    parts = re.split(r"\[(?:ok|Error[^\]]*)\]", transcript)
    return all("e" in p and len(p) - p.index("e") - 1 <= 16 for p in parts[:-1])


@pytest.fixture
def letter_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TOOL_FORMATS, "letter", LetterFormat)


def _sampled_update(agent: HFAgent, model: Any) -> tuple[Any, dict[str, float]]:
    """Sample 4 rows with the echo tool, then one update at lr 0: (samples, stats)."""
    box = ToolBox((ECHO,), fallback_format="letter", max_tool_calls=3)
    samples = sample_with_tools(agent, ["Hello there", "Tell me"], SamplingParams(2, 24), box)
    batch = samples.batch
    settings = UpdateSettings(clip_ratio=0.2, max_completion_length=batch.completion_mask.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return samples, update_policy(model, opt, [batch], [adv], settings)


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_real_decoding_backends_pause_at_calls_and_train_model_tokens_only(
    tiny_tokenizer: Any, letter_format: None, backend: str
) -> None:
    torch.manual_seed(0)
    model = build_default_model(len(tiny_tokenizer), seed=3)
    agent = HFAgent(model, tiny_tokenizer, prompt_format="raw", backend=backend)
    agent.seed(7)
    samples, stats = _sampled_update(agent, model)
    results = [r for group in samples.completions for c in group for r in c.tool_results]
    assert results and all(r.content == "ok" or r.error == "limit" for r in results)
    for group in samples.completions:
        for c in group:  # each call ends on its first "e": the model's text has a result after it
            assert c.transcript.count("[") >= len(c.tool_results)
            assert _paused_at_calls(c.transcript), c.transcript
    batch = samples.batch
    s = batch.prompt_length
    observed = batch.attention_mask[:, s:].bool() & ~batch.completion_mask
    assert bool(observed.any())  # observations are in the sequence, outside the mask
    assert bool((batch.behaviour_logprobs[~batch.completion_mask] == 0).all())
    assert abs(stats["ratio_mean"] - 1.0) < 1e-4, stats
    assert stats["clip_fraction"] == 0.0


def test_vllm_path_truncates_after_the_fact_at_the_first_call(
    tiny_tokenizer: Any, letter_format: None
) -> None:
    """vLLM has no stop hook: the engine writes past a call, and the tool loop keeps the
    tokens up to the first closed call only, runs it and resumes after the result."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from comlrl.algos.rollout.sampling.vllm_backend import VLLMBackend
    from test_generation_backends import (  # the vLLM fakes
        FAKE_API,
        ModelEngine,
        state_dict_sender,
    )

    torch.manual_seed(0)
    model = build_default_model(len(tiny_tokenizer), seed=3)
    eos = [int(tiny_tokenizer.eos_token_id)]
    backend = VLLMBackend(
        model, pad_token_id=int(tiny_tokenizer.pad_token_id), eos_token_ids=eos,
        engine=ModelEngine(model), api=FAKE_API, weight_sender=state_dict_sender,
    )  # fmt: skip
    assert not getattr(backend, "supports_stop", False)
    agent = HFAgent(model, tiny_tokenizer, eos_token_ids=eos, backend=backend, prompt_format="raw")
    samples, stats = _sampled_update(agent, model)
    results = [r for group in samples.completions for c in group for r in c.tool_results]
    assert results
    for group in samples.completions:
        for c in group:
            # each segment that made a call ends in the token of its first "e"
            assert _paused_at_calls(c.transcript), c.transcript
    assert bool((samples.batch.behaviour_logprobs[~samples.batch.completion_mask] == 0).all())
    assert abs(stats["ratio_mean"] - 1.0) < 1e-4, stats
