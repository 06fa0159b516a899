"""GSPO (Zheng et al. 2025, arXiv 2507.18071): the sequence-level importance ratio and clip
of ``policy_loss(importance_level="sequence")``, against a loop reference (issue 31, item 4)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.estimators.losses import policy_loss
from hypothesis import given, settings
from hypothesis import strategies as st

F64 = torch.float64
REDUCTIONS = ("seq_mean_token_mean", "token_mean", "seq_sum")


def loop_gspo(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip: tuple[float, float] | None,
    reduction: str,
    max_len: int,
) -> torch.Tensor:
    """GSPO's objective written out per completion with scalar ops (differentiable):
    ``s_i = exp((1/|y_i|) sum_t (logp_it - old_it))``,
    ``l_i = -min(s_i A_i, clip(s_i, 1 - lo, 1 + hi) A_i)``, then the reduction of ``l_i``
    given to each of the completion's ``n_i`` tokens."""
    b, length = logp.shape
    total = torch.zeros((), dtype=F64)
    tokens = 0
    for i in range(b):
        ts = [t for t in range(length) if mask[i, t]]
        tokens += len(ts)
        if not ts:
            continue
        log_s = sum((logp[i, t] - old[i, t]) for t in ts) / len(ts)
        s = torch.exp(log_s)
        term = s * adv[i]
        if clip is not None:
            term = torch.minimum(term, torch.clamp(s, 1 - clip[0], 1 + clip[1]) * adv[i])
        l_i = -term
        if reduction == "seq_mean_token_mean":
            total = total + l_i / b
        elif reduction == "token_mean":
            total = total + l_i * len(ts)
        else:
            total = total + l_i * len(ts) / (max_len * b)
    if reduction == "token_mean":
        total = total / max(tokens, 1)
    return total


@settings(max_examples=80, deadline=None)
@given(
    b=st.integers(1, 4),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    reduction=st.sampled_from(REDUCTIONS),
    clip=st.sampled_from((None, (0.2, 0.2), (3e-4, 4e-4), (0.1, 0.3))),
    spread=st.sampled_from((0.0, 0.01, 0.5)),
)
def test_sequence_level_loss_and_gradient_match_loop_reference(
    b: int, length: int, seed: int, reduction: str, clip: tuple[float, float] | None, spread: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    base = -torch.rand(b, length, generator=gen, dtype=F64) * 3
    old = base + spread * torch.randn(b, length, generator=gen, dtype=F64)
    adv = torch.randn(b, generator=gen, dtype=F64)
    mask = torch.rand(b, length, generator=gen) < 0.7
    got_logp = base.clone().requires_grad_(True)
    want_logp = base.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        got_logp, adv, mask, old_logprobs=old, clip_ratio=clip, importance_level="sequence",
        reduction=reduction, max_completion_length=length + 2,  # type: ignore[arg-type]
    )  # fmt: skip
    want = loop_gspo(want_logp, old, adv, mask, clip, reduction, length + 2)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)  # float64, other order
    loss.backward()
    if want.requires_grad:
        want.backward()
    want_grad = want_logp.grad if want_logp.grad is not None else torch.zeros_like(base)
    assert got_logp.grad is not None
    torch.testing.assert_close(got_logp.grad, want_grad, rtol=1e-9, atol=1e-12)
    assert bool((got_logp.grad[~mask] == 0).all())
    # one ratio per completion: every valid token of a sequence shares it
    if mask.any():
        assert metrics["ratio_min"] > 0


def test_one_ratio_per_completion_unlike_the_token_level_ratio() -> None:
    """Token ratios (2, 0.5) average to 1.25 per token but their geometric mean, GSPO's
    sequence ratio, is 1: nothing is clipped at the sequence level."""
    logp = torch.tensor([[math.log(2.0), math.log(0.5)]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([1.0], dtype=F64)
    _, token = policy_loss(logp, adv, mask, old_logprobs=old, clip_ratio=0.2)
    _, seq = policy_loss(
        logp, adv, mask, old_logprobs=old, clip_ratio=0.2, importance_level="sequence"
    )
    assert token["ratio_mean"] == pytest.approx(1.25) and token["clip_fraction"] == 0.5
    assert seq["ratio_mean"] == pytest.approx(1.0) and seq["clip_fraction"] == 0.0


def test_on_policy_sequence_level_equals_token_level_per_sequence_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    base = -torch.rand(3, 5, generator=gen, dtype=F64)
    mask = torch.rand(3, 5, generator=gen) < 0.8
    adv = torch.randn(3, generator=gen, dtype=F64)
    grads = []
    for level in ("token", "sequence"):
        logp = base.clone().requires_grad_(True)
        policy_loss(logp, adv, mask, importance_level=level)[0].backward()  # type: ignore[arg-type]
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


def test_sequence_level_refuses_per_token_advantages_and_unknown_levels() -> None:
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="one advantage per completion"):
        policy_loss(logp, torch.zeros(2, 3), mask, importance_level="sequence")
    with pytest.raises(ValueError, match="unknown importance_level 'seq'"):
        policy_loss(logp, torch.zeros(2), mask, importance_level="seq")  # type: ignore[arg-type]


def test_config_and_settings_carry_the_level() -> None:
    cfg = TrainConfig(importance_level="sequence", clip_ratio=0.2)
    assert cfg.importance_level == "sequence"
    assert UpdateSettings(importance_level="sequence").importance_level == "sequence"


def test_a_gspo_run_takes_its_steps(tiny_tokenizer: Any, tmp_path: Any) -> None:
    """A group-baseline step with ``importance_level=sequence``, two passes per batch (the
    second off-policy: its sequence ratios move from 1)."""
    torch.manual_seed(0)
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    before = [p.detach().clone() for p in agents[0].model.parameters()]
    config = TrainConfig(
        num_steps=1, batch_size=2, num_generations=4, max_new_tokens=6, learning_rate=1e-2,
        output_dir=str(tmp_path), progress=False, parallel_agents=False, seed=0,
        importance_level="sequence", clip_ratio=0.2, num_iterations=2,
    )  # fmt: skip
    trainer = MultiAgentTrainer(
        agents, config, dataset=[{"text": f"x = {i}"} for i in range(4)],
        reward_func=lambda c1, c2: [len(a) / 10.0 for a in c1],
        formatters=[lambda ex: ex["text"]] * 2,
    )  # fmt: skip
    assert trainer.update_settings.importance_level == "sequence"
    row = trainer.step().row
    assert row["ratio_mean/agent_0"] != 1.0  # averaged over a pass at 1 and one after a step
    moved = [not torch.equal(p, q) for p, q in zip(before, agents[0].model.parameters())]
    assert any(moved)


def test_gspo_on_a_pretrained_model_takes_the_mean_over_completions() -> None:
    """A pretrained model's default reduction is the token mean, which would weigh GSPO's
    per-completion terms by length: asked for GSPO, the default is GSPO's mean over
    completions instead (an explicit value still wins)."""
    hub = "Qwen/Qwen2.5-0.5B-Instruct"
    gspo = TrainConfig(models=[hub], importance_level="sequence", clip_ratio=3e-4)
    assert gspo.loss_reduction == "seq_mean_token_mean"
    assert gspo.model_defaults().filled["loss_reduction"] == "seq_mean_token_mean"
    assert TrainConfig(models=[hub]).loss_reduction == "token_mean"
    given = TrainConfig(models=[hub], importance_level="sequence", loss_reduction="token_mean")
    assert given.loss_reduction == "token_mean"
    # --print-config says so before anything loads; the command line reads the same defaults
    from comlrl.algos.cli import main as cli

    assert "# warning: importance_level=sequence (GSPO) with loss_reduction=token_mean" in (
        cli._config_text("magrpo", given)
    )
    assert "importance_level=sequence" not in cli._config_text("magrpo", gspo)
    _, from_cli = cli._fresh_config(
        cli.parse_args(["train", "--model", hub, "importance_level=sequence", "clip_ratio=3e-4"])
    )
    assert from_cli.loss_reduction == "seq_mean_token_mean"


@pytest.mark.parametrize("reduction", ["token_mean", "seq_sum"])
def test_gspo_with_a_length_weighted_reduction_warns(reduction: str) -> None:
    from comlrl.algos.training.run.diagnostics import TrainingWarning

    with pytest.warns(
        TrainingWarning, match=f"importance_level=sequence .GSPO. with loss_reduction={reduction}"
    ):
        UpdateSettings(
            importance_level="sequence", loss_reduction=reduction, max_completion_length=8
        )  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        UpdateSettings(importance_level="sequence", loss_reduction="seq_mean_token_mean")
        UpdateSettings(importance_level="token", loss_reduction=reduction, max_completion_length=8)  # type: ignore[arg-type]
