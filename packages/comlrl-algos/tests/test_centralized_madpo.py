"""Centralized MADPO: one joint policy writes every role's output, and the DPO loss is
taken on the log-probability of the whole joint response (``algo=centralized_madpo``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.cli.main import main
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
from comlrl.algos.recipes.preference.madpo.recipe import MADPORecipe
from comlrl.algos.recipes.preference.pairs import preference_pairs
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.rollout.joint_policy import SentenceRoles, centralized_callbacks
from comlrl.algos.rollout.tree import rollout
from comlrl.core import RewardBatch

EXAMPLES = [{"topic": t} for t in ("A fox", "A ship", "A bell", "A cat")]


def _role_prompts(example: Mapping[str, Any]) -> list[str]:
    return [f"{example['topic']} starts.", f"{example['topic']} ends."]


def _role_reward(completions: Sequence[Sequence[str]], examples: Sequence[Any]) -> RewardBatch:
    """Two roles: role 0's characters minus a third of role 1's (distinct for most texts)."""
    first, second = completions
    return RewardBatch(
        rewards=[float(len(a)) - len(b) / 3.0 for a, b in zip(first, second, strict=True)]
    )


def _hand_logprob(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``sum_t log pi(y_t | x, y_<t)`` of one row, by one forward pass of its real tokens."""
    prompt_len = ids.shape[0] - mask.shape[0]
    prompt = ids[:prompt_len][attention[:prompt_len].bool()]
    completion = ids[prompt_len:][mask.bool()]
    full = torch.cat([prompt, completion])[None]
    with torch.no_grad():
        logits = model(full, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, completion[:, None]).sum()


def test_joint_dpo_loss_equals_a_hand_computation_on_the_joint_responses(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    from comlrl.algos.models.loading import build_default_model

    formatter, reward = centralized_callbacks(_role_prompts, _role_reward, 2, SentenceRoles())
    env = CallbackEnvironment([formatter], reward)
    config = MADPOConfig(
        num_agents=1, num_candidates=4, max_new_tokens=12, batch_size=2, beta=0.5,
        learning_rate=1e-3, optimizer="sgd", device="cpu", seed=3,
    )  # fmt: skip
    ref = build_default_model(len(tiny_tokenizer), seed=1)  # differs from the policy
    agent = HFAgent(tiny_model, tiny_tokenizer, name="joint", prompt_format="raw")
    run = MADPORecipe([agent], config, environment=env, dataset=EXAMPLES, ref_models=[ref])
    ro = rollout(run.agents, EXAMPLES[:2], env, run.sampling, run.tree, rng=run.rng)
    pairs = preference_pairs(ro, pairs_per_prompt=2)
    assert len(pairs) >= 2 and all(len(p) == 1 for p in pairs.prompts)  # one joint policy
    # each joint response is scored as the roles' joint action it splits into
    for text, example, value in zip(
        (c[0] for c in pairs.chosen), pairs.examples, pairs.chosen_reward.tolist(), strict=True
    ):
        roles = SentenceRoles().parse_completion(text, example, 2)
        assert value == pytest.approx(len(roles[0]) - len(roles[1]) / 3.0)
    batch = pairs.batches[0]
    tiny_model.eval()
    margins = []
    for p in range(len(pairs)):
        logps = []
        for m in (tiny_model, ref):
            for row in (2 * p, 2 * p + 1):  # chosen, rejected
                args = (batch.input_ids[row], batch.attention_mask[row], batch.completion_mask[row])
                logps.append(_hand_logprob(m, *args))
        chosen, rejected, ref_chosen, ref_rejected = logps
        margins.append((chosen - ref_chosen) - (rejected - ref_rejected))
    # Rafailov et al. 2023, eq. 7, on the joint response: -log sigmoid(beta * margin)
    expected = torch.stack([-torch.nn.functional.logsigmoid(0.5 * m) for m in margins]).mean()
    before = [p.detach().clone() for p in tiny_model.parameters()]

    row = run.update(pairs)

    # float32 sums over <= 12 tokens of two tiny models: agree to ~1e-5
    assert row["loss"] == pytest.approx(float(expected), rel=1e-4, abs=1e-5)
    assert row["margin"] == pytest.approx(float(torch.stack(margins).mean()), rel=1e-4, abs=1e-4)
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters()))


def test_centralized_madpo_checks_its_keys_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "algo=centralized_madpo", f"output_dir={tmp_path / 'x'}"]
    assert main([*base, "models=[a,b]"]) == 2
    assert "trains one joint policy but models lists 2" in capsys.readouterr().err
    assert main([*base, "role_format=xml"]) == 2
    assert "role_format" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
