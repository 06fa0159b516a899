"""CoMLRL 1.4.3's ``collaboration_mode="centralized"`` MADPO / MARLHF on our centralized
collaboration: one joint actor, its responses split into roles only for the task reward."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer

WORDS = ["<pad>", "<eos>", "<unk>", "yes", "no", "maybe", "task", "first", "second"]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _model(tokenizer: Any, seed: int = 0) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.eos_token_id,
        )
    )  # fmt: skip


class _Halves:
    """Role 0 writes the first half of the joint response's words, role 1 the rest."""

    def __init__(self) -> None:
        self.agent_prompts: list[list[str]] = []

    def build_prompt(self, item: dict[str, Any], agent_prompts: list[str]) -> str:
        self.agent_prompts.append(list(agent_prompts))
        return " ".join(agent_prompts)

    def parse_completion(self, completion: str, item: dict[str, Any], num_agents: int) -> list[str]:
        words = completion.split()
        half = (len(words) + 1) // 2
        return [" ".join(words[:half]), " ".join(words[half:])]


def _yes_count(first: list[str], second: list[str]) -> list[float]:
    """Role 0's "yes" count plus twice role 1's: the roles are scored, not the joint text."""
    return [float(first[0].split().count("yes") + 2 * second[0].split().count("yes"))]


ROWS = [{"prompt": "task"} for _ in range(4)]
FORMATTERS = [lambda ex: "first " + ex["prompt"], lambda ex: "second " + ex["prompt"]]
SAMPLING = dict(
    agent_devices="cpu", max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None,
    eval_interval=0, agent_learning_rate=1e-2, preference_num_candidates=4,
    preference_pairs_per_sample=2,
)  # fmt: skip


def test_centralized_madpo_trains_one_joint_actor_on_pairs_of_joint_responses() -> None:
    tok = _tokenizer()
    adapter = _Halves()
    trainer = MADPOTrainer(
        agents=[_model(tok)],
        tokenizer=tok,
        train_dataset=ROWS,
        reward_func=_yes_count,
        formatters=FORMATTERS,
        centralized_comparator_adapter=adapter,
        args=MADPOConfig(
            collaboration_mode="centralized", num_train_epochs=3, train_batch_size=2,
            rollout_buffer_size=2, **SAMPLING,
        ),
    )  # fmt: skip
    assert (trainer.num_agents, len(trainer.agents), trainer.args.num_agents) == (1, 1, 2)
    rows = trainer.train()
    assert adapter.agent_prompts[0] == ["first task", "second task"]
    pairs = trainer.preference_pairs
    assert pairs and rows
    for pair in pairs:  # each joint response was scored through its two roles
        for text, reward in (
            (pair.chosen[0], pair.chosen_reward),
            (pair.rejected[0], pair.rejected_reward),
        ):
            assert reward == _yes_count(*[[r] for r in adapter.parse_completion(text, {}, 2)])[0]
        assert pair.chosen_reward > pair.rejected_reward
    assert all("loss/agent_0" in r and "loss/agent_1" not in r for r in rows)
    # the same pairs every epoch: the joint DPO loss falls (reference-free, as 1.4.3)
    by_epoch: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        by_epoch[r["epoch"]].append(r["loss"])
    first, last = (sum(v) / len(v) for v in (by_epoch[1.0], by_epoch[3.0]))
    assert last < first


def test_centralized_marlhf_fits_its_reward_model_on_joint_text_then_trains_the_actor(
    tmp_path: Path,
) -> None:
    tok = _tokenizer()
    source = tmp_path / "reward_source"
    _model(tok, seed=1).save_pretrained(source)
    tok.save_pretrained(source)
    actor = _model(tok)
    before = {k: v.detach().clone() for k, v in actor.state_dict().items()}
    logged: list[Any] = []
    trainer = MARLHFTrainer(
        agents=[actor],
        tokenizer=tok,
        train_dataset=ROWS,
        eval_dataset=ROWS[:1],
        reward_func=_yes_count,
        formatters=FORMATTERS,
        centralized_comparator_adapter=_Halves(),
        eval_logger=lambda **kw: logged.append(kw["agent_completions_turns"]) or [],
        eval_aggregator=lambda rows, **kw: {},
        args=MARLHFConfig(
            collaboration_mode="centralized", num_train_epochs=1, train_batch_size=2,
            rollout_buffer_size=2, num_generations=2, reward_model_name=str(source),
            reward_model_device="cpu", reward_num_train_epochs=2, reward_learning_rate=1e-2,
            **SAMPLING,
        ),
    )  # fmt: skip
    assert trainer.reward_model is None  # 1.4.3 builds it when training starts
    trainer.train()
    assert trainer.reward_model_history and trainer.reward_model is not None
    assert trainer.preference_pairs and all(
        len(p.prompts[0]) == 1 for p in trainer.preference_pairs
    )
    assert any(not torch.equal(before[k], v) for k, v in actor.state_dict().items())
    assert trainer.env_step == len(ROWS) * 2  # joint actions scored by the RL stage
    metrics = trainer.evaluate(num_eval_samples=1)
    assert "eval/turn_1/reward_mean" in metrics
    assert len(logged[-1]) == 2  # the eval logger sees the two roles' outputs
    with pytest.raises(ValueError, match="align with their returns"):
        data = {"prompt_input_ids": torch.tensor([[3]]), "completion_input_ids": [[]]}
        trainer._compute_loss_with_gradients(actor, data, [1.0])


def test_centralized_magrpo_generate_completions_keeps_joint_ids_and_reference_kl() -> None:
    from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

    tok = _tokenizer()
    actor = _model(tok)
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=_Halves(),
        agents=[actor],
        tokenizer=tok,
        train_dataset=ROWS,
        reward_func=_yes_count,
        formatters=FORMATTERS,
        args=CentralizedMAGRPOConfig(
            agent_devices="cpu", max_new_tokens=5, num_generations=3, temperature=1.0,
            top_p=1.0, top_k=None, reference_kl_enabled=True, reference_devices=["cpu"],
        ),
    )  # fmt: skip
    data = trainer._generate_completions(actor, ROWS[:2], num_return_sequences=3)
    assert [p.tolist() for p in data["prompt_input_ids"]] == [
        tok.encode("first task second task")
    ] * 2
    ids = [c for row in data["completion_input_ids"] for c in row]
    assert data["response_lens"] == [len(c) for c in ids] and len(ids) == 6
    assert all(0 < n <= 5 for n in data["response_lens"])
    # the reference is a copy of the initial policy: KL 0 (float32 rounding only)
    assert data["reference_kls"] == pytest.approx([0.0] * 6, abs=1e-6)
    with torch.no_grad():
        actor.transformer.wte.weight.add_(torch.randn_like(actor.transformer.wte.weight))
    moved = trainer._generate_completions(actor, ROWS[:1], num_return_sequences=3)
    assert all(kl > 1e-4 for kl in moved["reference_kls"])


def test_madpo_reference_kl_enabled_is_dpo_against_the_frozen_initial_actor() -> None:
    """1.4.3 loads reference copies for ``reference_kl_enabled`` and never reads them;
    here they are the DPO reference: at the first step policy == reference, so every
    pair's margin is 0 and the loss is ln 2, which the reference-free loss is not."""
    tok = _tokenizer()
    losses = {}
    for enabled in (True, False):
        trainer = MADPOTrainer(
            agents=[_model(tok)],
            tokenizer=tok,
            train_dataset=ROWS,
            reward_func=_yes_count,
            formatters=FORMATTERS,
            centralized_comparator_adapter=_Halves(),
            args=MADPOConfig(
                collaboration_mode="centralized", num_train_epochs=2, train_batch_size=2,
                rollout_buffer_size=2, reference_kl_enabled=enabled,
                reference_devices=["cpu"] if enabled else None, **SAMPLING,
            ),
        )  # fmt: skip
        refs = trainer.reference_models
        assert len(refs) == (1 if enabled else 0)
        initial = {k: v.clone() for k, v in trainer.agents[0].state_dict().items()}
        rows = trainer.train()
        losses[enabled] = rows[0]["loss"]
        if enabled:
            ref = refs[0]
            assert ref is not trainer.agents[0] and not ref.training
            assert all(not p.requires_grad for p in ref.parameters())
            for name, tensor in ref.state_dict().items():  # still the initial weights
                torch.testing.assert_close(tensor, initial[name], rtol=0, atol=0)
            assert rows[0]["margin"] == 0.0
    torch.testing.assert_close(torch.tensor(losses[True]), torch.log(torch.tensor(2.0)))
    assert abs(losses[False] - float(torch.log(torch.tensor(2.0)))) > 1e-4


# --- centralized MARLHF with an actor-critic RL stage (rl_algorithm="iac" / "maac") ------
def _centralized_ac_marlhf(tmp_path: Path, tok: Any, **fields: Any) -> MARLHFTrainer:
    source = tmp_path / "reward_source"
    if not source.exists():
        _model(tok, seed=1).save_pretrained(source)
        tok.save_pretrained(source)
    options: dict[str, Any] = dict(
        collaboration_mode="centralized", rl_algorithm="iac", num_train_epochs=1,
        train_batch_size=2, rollout_buffer_size=2, num_generations=2,
        reward_model_name=str(source), reward_model_device="cpu", reward_num_train_epochs=2,
        reward_learning_rate=1e-2, **SAMPLING,
    )  # fmt: skip
    options.update(fields)
    return MARLHFTrainer(
        agents=[_model(tok)],
        tokenizer=tok,
        train_dataset=ROWS,
        eval_dataset=ROWS[:1],
        reward_func=_yes_count,
        formatters=FORMATTERS,
        centralized_comparator_adapter=_Halves(),
        args=MARLHFConfig(**options),
    )


def test_centralized_marlhf_iac_trains_the_joint_actor_and_the_critic_assigned_after_construction(
    tmp_path: Path,
) -> None:
    tok = _tokenizer()
    trainer = _centralized_ac_marlhf(
        tmp_path, tok, reference_kl_enabled=True, reference_devices=["cpu"]
    )
    critic = _model(tok, seed=2)
    trainer.critic_sources = [critic]  # as 1.4.3's scripts do, after construction
    actor = trainer.agents[0]
    actor_before = actor.transformer.wte.weight.detach().clone()
    critic_before = critic.transformer.wte.weight.detach().clone()
    rows = trainer.train()
    assert (trainer.num_agents, len(trainer.optimizers)) == (1, 1)
    assert trainer.rl_trainer.critics == [critic]  # the assigned critic, not a loaded one
    assert not torch.equal(actor_before, actor.transformer.wte.weight)
    assert not torch.equal(critic_before, critic.transformer.wte.weight)
    assert all(torch.isfinite(p).all() for p in actor.parameters())
    assert len(rows) == 2 and all("value_loss/agent_0" in r for r in rows)
    assert trainer.env_step == len(ROWS) * 2  # joint actions the RL stage scored
    # the RL reward is the reward model's score (the task reward is a whole "yes" count)
    assert any(r["reward_min"] != round(r["reward_min"]) for r in rows)
    assert trainer.rl_trainer.env.reward is not trainer.rl_trainer.eval_reward
    assert rows[-1]["kl/agent_0"] > 0  # the reference-KL shaping is on
    logged: list[Any] = []
    trainer.eval_logger = lambda **kw: logged.append(kw["agent_completions_turns"]) or []
    trainer.eval_aggregator = lambda rows, **kw: {}
    metrics = trainer.evaluate(num_eval_samples=1)
    assert metrics["eval/turn_1/reward_mean"] == round(metrics["eval/turn_1/reward_mean"])
    assert len(logged[-1]) == 2  # evaluation splits the joint response into the roles
    with pytest.raises(AttributeError, match="once the actor-critic RL stage is built"):
        trainer.critic_sources = [critic]


@pytest.mark.parametrize(
    ("sources", "error", "message"),
    [
        (lambda tok: [_model(tok), _model(tok)], ValueError, "has 2 entries.*exactly 1 critic"),
        (lambda tok: [], ValueError, "has 0 entries"),
        (lambda tok: [42], TypeError, r"critic_sources\[0\] is a int \(42\)"),
        (lambda tok: [""], ValueError, r"critic_sources\[0\] is an empty model name"),
        (lambda tok: _model(tok), TypeError, "must be a list of critic sources.*got GPT2LMHeadModel"),
        (lambda tok: "gpt2", TypeError, "must be a list of critic sources.*got str: .gpt2."),
    ],
)  # fmt: skip
def test_centralized_marlhf_bad_critic_sources_fail_when_assigned_and_when_given(
    tmp_path: Path, sources: Any, error: type[Exception], message: str
) -> None:
    tok = _tokenizer()
    trainer = _centralized_ac_marlhf(tmp_path, tok)
    with pytest.raises(error, match=message):
        trainer.critic_sources = sources(tok)
    assert trainer.critic_sources is None  # the bad value was not kept
    with pytest.raises(error, match=message):
        MARLHFTrainer(
            agents=[_model(tok)],
            tokenizer=tok,
            train_dataset=ROWS,
            reward_func=_yes_count,
            formatters=FORMATTERS,
            critics=sources(tok),
            args=MARLHFConfig(
                collaboration_mode="centralized", rl_algorithm="maac",
                reward_model_device="cpu", **SAMPLING,
            ),
        )  # fmt: skip


def test_centralized_marlhf_without_a_critic_source_fails_before_sampling_pairs(
    tmp_path: Path,
) -> None:
    tok = _tokenizer()
    trainer = _centralized_ac_marlhf(tmp_path, tok, rl_algorithm="maac")
    before = trainer.agents[0].transformer.wte.weight.detach().clone()
    # model objects, no critic_model_name, no critic_sources: nothing to load a critic from
    with pytest.raises(ValueError, match="critic_model_name is None.*critic_sources"):
        trainer.train()
    # it stopped before the reward model, the pairs and the RL stage
    assert trainer.reward_model is None and not trainer.preference_pairs
    assert trainer.rl_trainer.critics == []  # still the front (value heads, no critic)
    assert torch.equal(before, trainer.agents[0].transformer.wte.weight)
    shared = _centralized_ac_marlhf(tmp_path, tok, use_separate_critic=False)
    with pytest.raises(ValueError, match="critic_sources need use_separate_critic=True"):
        shared.critic_sources = [_model(tok)]


def test_decentralized_marlhf_refuses_critic_sources_it_would_not_use(tmp_path: Path) -> None:
    tok = _tokenizer()
    source = tmp_path / "reward_source"
    _model(tok, seed=1).save_pretrained(source)
    tok.save_pretrained(source)
    trainer = MARLHFTrainer(
        agents=[_model(tok), _model(tok)],
        tokenizer=tok,
        train_dataset=ROWS,
        reward_func=_yes_count,
        formatters=FORMATTERS,
        critics=[_model(tok, seed=2), _model(tok, seed=3)],
        args=MARLHFConfig(
            rl_algorithm="iac", num_generations=2, reward_model_name=str(source),
            reward_model_device="cpu", **SAMPLING,
        ),
    )  # fmt: skip
    given = trainer.rl_trainer.critics
    with pytest.raises(AttributeError, match="pass critics= to MARLHFTrainer"):
        trainer.critic_sources = [_model(tok), _model(tok)]
    assert trainer.rl_trainer.critics == given
