"""comlrl.trainers: CoMLRL 1.4.3's single-turn MAAC ``_collect_rollouts`` adapter."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.trainers import MAACTrainer
from comlrl.trainers._base import CompatTrainer


def _scripted(critic_type: str, rewards: list[float], generations: int = 3) -> Any:
    """A bare MAACTrainer with 1.4.3's hooks scripted; ``calls`` records the critic texts."""
    trainer: Any = MAACTrainer.__new__(MAACTrainer)
    trainer.args = SimpleNamespace(
        num_agents=2, num_turns=1, num_generations=generations, critic_type=critic_type,
        reference_kl_enabled=False,
    )  # fmt: skip
    trainer.agents = [None, None]
    trainer.reward_func = lambda *args, **kwargs: list(rewards)
    trainer.reward_processor = float
    trainer._resolve_turn_prompt = lambda item, a: f"p{a}"
    trainer._get_tokenizer = lambda a: SimpleNamespace(
        decode=lambda ids, **kw: f"a{a}:{ids.tolist()}"
    )
    seqs = torch.tensor([[7, 10 + g, 20 + g] for g in range(generations)])
    trainer._generate = lambda model, prompt, a: {
        "prompt_len": 1, "sequences": seqs + 100 * a, "attention_mask": torch.ones_like(seqs),
        "response_lens": [2] * generations, "reference_kls": [],
        "completions": [f"c{a}{g}" for g in range(generations)],
    }  # fmt: skip
    calls: list[str] = []

    def critic(text: str) -> dict[str, Any]:
        calls.append(text)
        ids = torch.tensor([[len(calls)]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "prompt_len": 1,
                "value": torch.tensor([0.5 * len(calls)])}  # fmt: skip

    trainer._critic_value_from_text = critic
    trainer._policy_eval = lambda model, ids, *a, **k: (ids[:, -1].float().neg(), None)
    trainer.calls = calls
    return trainer


def test_q_critic_reads_each_joint_action_and_agents_keep_their_own_rewards() -> None:
    trainer = _scripted("q", rewards=[1.0, 3.0])  # one value per agent
    samples = trainer._collect_rollouts({"prompt": "x"})
    assert [(s.agent_idx, s.metadata["generation_idx"]) for s in samples] == [
        (a, g) for a in range(2) for g in range(3)
    ]
    assert [s.reward.item() for s in samples] == [1.0] * 3 + [3.0] * 3
    assert trainer.calls == [
        f"[Agent 0] p0\n\n[Agent 1] p1\n\n[Joint Action]\n\n[Agent 0 action]\nc0{g}"
        f"\n\n[Agent 1 action]\nc1{g}"
        for g in range(3)
    ]
    # generation g's value comes from the g-th critic call, for both agents
    assert [s.old_value.item() for s in samples] == [0.5, 1.0, 1.5] * 2
    assert [s.old_logprob.item() for s in samples] == [-20, -21, -22, -120, -121, -122]
    assert samples[4].completion == "a1:[111, 121]"
    assert samples[4].metadata["value_target"].item() == 3.0


def test_v_critic_reads_the_joint_prompt_once_and_rewards_broadcast_per_generation() -> None:
    trainer = _scripted("v", rewards=[1.0, 2.0, 4.0])  # one value per joint action
    samples = trainer._collect_rollouts({"prompt": "x"})
    assert trainer.calls == ["[Agent 0] p0\n\n[Agent 1] p1"]
    assert [s.returns.item() for s in samples] == [1.0, 2.0, 4.0] * 2
    assert {s.old_value.item() for s in samples} == {0.5}
    assert all(s.metadata["adv_target"].item() == s.reward.item() for s in samples)


def test_collect_rollouts_names_missing_hooks_and_refuses_multi_turn() -> None:
    trainer: Any = MAACTrainer.__new__(MAACTrainer)
    trainer.args = SimpleNamespace(num_agents=2, num_turns=1, num_generations=2)
    with pytest.raises(NotImplementedError, match="_generate"):
        trainer._collect_rollouts({"prompt": "x"})
    trainer.args.num_turns = 2
    with pytest.raises(NotImplementedError, match="num_turns=2"):
        trainer._collect_rollouts({"prompt": "x"})


def test_evaluate_goes_through_collect_rollouts_only_when_a_subclass_defines_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(CompatTrainer, "evaluate", lambda self, n=None: {"ours": 1.0})
    monkeypatch.setattr(MAACTrainer, "_evaluate_rollouts143", lambda self, n=None: {"143": 1.0})

    class Custom(MAACTrainer):
        def _collect_rollouts(self, item: dict[str, Any]) -> list[Any]:
            return []

    assert MAACTrainer.__new__(MAACTrainer).evaluate() == {"ours": 1.0}
    assert Custom.__new__(Custom).evaluate() == {"143": 1.0}
