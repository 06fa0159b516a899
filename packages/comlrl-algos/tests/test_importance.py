"""Sampler/trainer mismatch and truncated importance sampling (issue 31, item 3): the pure
functions against loop references, and a run whose sampler perturbs its behaviour
log-probs (a fake engine) against one that does not."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.sampling.backends import NativeBackend
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.settings import tis_level
from comlrl.estimators.importance import (
    sampler_mismatch,
    sequence_log_ratio,
    truncated_importance_weights,
)
from comlrl.estimators.losses import policy_loss
from hypothesis import given, settings
from hypothesis import strategies as st

F64 = torch.float64
PROPS = settings(max_examples=60, deadline=None)


def _inputs(b: int, length: int, seed: int, spread: float) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(b, length, generator=gen, dtype=F64) * 4
    behaviour = trainer + spread * torch.randn(b, length, generator=gen, dtype=F64)
    mask = torch.rand(b, length, generator=gen) < 0.7
    behaviour[~mask] = math.nan  # garbage on masked tokens must not leak
    return trainer, behaviour, mask


def _loop_weights(
    trainer: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float, level: str
) -> torch.Tensor:
    out = torch.ones_like(trainer)
    for i in range(trainer.shape[0]):
        seq = sum(
            float(trainer[i, t] - behaviour[i, t]) for t in range(trainer.shape[1]) if mask[i, t]
        )
        for t in range(trainer.shape[1]):
            if mask[i, t]:
                log_w = seq if level == "sequence" else float(trainer[i, t] - behaviour[i, t])
                out[i, t] = min(math.exp(log_w), cap) if log_w < 700 else cap
    return out


@PROPS
@given(
    b=st.integers(1, 4),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    spread=st.sampled_from((0.0, 0.05, 1.0, 5.0)),
    cap=st.sampled_from((1.0, 2.0, 10.0)),
    level=st.sampled_from(("token", "sequence")),
)
def test_truncated_weights_match_loop_reference(
    b: int, length: int, seed: int, spread: float, cap: float, level: str
) -> None:
    trainer, behaviour, mask = _inputs(b, length, seed, spread)
    got = truncated_importance_weights(trainer, behaviour, mask, cap=cap, level=level)  # type: ignore[arg-type]
    want = _loop_weights(trainer, behaviour, mask, cap, level)
    # float64 exp of the same sums in another order: 1e-12 relative
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert bool((got <= cap).all()) and bool((got > 0).all())


@PROPS
@given(
    b=st.integers(1, 4),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    spread=st.sampled_from((0.0, 0.05, 1.0)),
)
def test_mismatch_metrics_match_loop_reference(
    b: int, length: int, seed: int, spread: float
) -> None:
    trainer, behaviour, mask = _inputs(b, length, seed, spread)
    got = sampler_mismatch(trainer, behaviour, mask)
    diffs = [
        float(trainer[i, t] - behaviour[i, t])
        for i in range(b)
        for t in range(length)
        if mask[i, t]
    ]
    n = max(len(diffs), 1)
    assert got["num_tokens"] == len(diffs)
    assert got["mismatch_abs_logp_diff"] == pytest.approx(sum(map(abs, diffs)) / n, rel=1e-12)
    kl = sum(math.exp(d) - d - 1 for d in diffs) / n
    assert got["mismatch_kl"] == pytest.approx(kl, rel=1e-9, abs=1e-15)
    assert got["mismatch_kl"] >= 0
    if spread == 0.0:
        assert got["mismatch_abs_logp_diff"] == 0.0 and got["mismatch_kl"] == 0.0


def test_mismatch_metrics_on_the_device_are_the_host_values() -> None:
    g = torch.Generator().manual_seed(3)
    trainer, behaviour = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.4
    host = sampler_mismatch(trainer, behaviour, mask)
    dev = sampler_mismatch(trainer, behaviour, mask, sync=False)
    assert set(host) == set(dev)
    for key, value in dev.items():
        assert value.dim() == 0 and value.dtype == F64 and float(value) == host[key], key


@PROPS
@given(b=st.integers(1, 4), length=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_sequence_log_ratio_matches_loop_reference(b: int, length: int, seed: int) -> None:
    logp, old, mask = _inputs(b, length, seed, 0.5)
    got = sequence_log_ratio(logp, old, mask)
    for i in range(b):
        terms = [float(logp[i, t] - old[i, t]) for t in range(length) if mask[i, t]]
        want = sum(terms) / len(terms) if terms else 0.0
        assert float(got[i]) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_importance_weights_scale_each_tokens_policy_gradient() -> None:
    """``-w * A * logp``: the gradient of token t of sequence i is ``-w_it A_i / n_i / B``
    (seq_mean_token_mean); the KL term is not weighted."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    w = torch.tensor([[0.5, 2.0, 1.0], [1.5, 0.25, 7.0]], dtype=F64)
    loss, _ = policy_loss(logp, adv, mask, importance_weights=w)
    loss.backward()
    assert logp.grad is not None
    want = (
        torch.tensor(
            [[-0.5 * 2 / 3, -2.0 * 2 / 3, -1.0 * 2 / 3], [1.5 / 2, 0.25 / 2, 0.0]], dtype=F64
        )
        / 2
    )
    torch.testing.assert_close(logp.grad, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="importance_weights must be"):
        policy_loss(logp, adv, mask, importance_weights=torch.ones(3))


def test_bad_tis_arguments_say_what_to_do() -> None:
    trainer, behaviour, mask = _inputs(2, 3, 0, 0.1)
    with pytest.raises(ValueError, match="cap C must be a finite number >= 1"):
        truncated_importance_weights(trainer, behaviour, mask, cap=0.5)
    with pytest.raises(ValueError, match="unknown TIS level 'tokens'"):
        truncated_importance_weights(trainer, behaviour, mask, level="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must have the shape"):
        sampler_mismatch(trainer, behaviour[:, :2], mask)


# --- a perturbed sampler in a real step ------------------------------------------------------

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]
NOISE = 0.3


class NoisyEngine:
    """A fake engine: the native sampler's completions, with N(0, NOISE) added to every
    behaviour log-prob (another engine's numerics, exaggerated). ``noise`` keeps the last
    draw, so the test knows the true ratio of every token."""

    name = "noisy"
    recompute_logprobs = False

    def __init__(self, model: Any, tok: Any) -> None:
        self.inner = NativeBackend(
            model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id]
        )
        self.gen = torch.Generator().manual_seed(11)
        self.noise: list[torch.Tensor] = []

    def sample(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ids, logp = self.inner.sample(*args, **kwargs)
        noise = NOISE * torch.randn(logp.shape, generator=self.gen)
        self.noise.append(noise)
        return ids, logp + noise

    def after_update(self) -> None:
        self.inner.after_update()


def _trainer(tok: Any, tmp: Any, noisy: bool, **overrides: Any) -> MultiAgentTrainer:
    torch.manual_seed(0)
    models = [build_default_model(len(tok), seed=i) for i in range(2)]
    agents = [
        HFAgent(m, tok, name=f"a{i}", backend=NoisyEngine(m, tok) if noisy else "native")
        for i, m in enumerate(models)
    ]
    config = TrainConfig(
        num_steps=1, batch_size=2, num_generations=4, max_new_tokens=6, learning_rate=0.1,
        optimizer="sgd", max_grad_norm=None, output_dir=str(tmp), progress=False,
        parallel_agents=False, seed=0, **overrides,
    )  # fmt: skip
    return MultiAgentTrainer(
        agents, config, dataset=DATA,
        reward_func=lambda c1, c2: [len(a) / 10.0 - len(b) / 20.0 for a, b in zip(c1, c2, strict=True)],
        formatters=[lambda ex: ex["text"]] * 2,
    )  # fmt: skip


def test_exact_sampler_logs_no_mismatch_and_keeps_tis_off(
    tiny_tokenizer: Any, tmp_path: Any
) -> None:
    trainer = _trainer(tiny_tokenizer, tmp_path, noisy=False)
    assert trainer.update_settings.tis_level is None  # auto: native sampler in float32
    row = trainer.step().row
    for a in range(2):
        # float32 decode step vs training forward: round-off only (measured ~1e-7)
        assert row[f"mismatch_abs_logp_diff/agent_{a}"] < 1e-5
        assert 0.0 <= row[f"mismatch_kl/agent_{a}"] < 1e-9
        assert f"tis_weight_mean/agent_{a}" not in row


def test_perturbed_sampler_is_measured_and_corrected(tiny_tokenizer: Any, tmp_path: Any) -> None:
    """The fake engine's noise shows in the metrics (E|N(0, s)| = s sqrt(2/pi); the k3 KL
    of a N(0, s) log-ratio is E[e^d - d - 1] = e^{s^2/2} - 1), TIS is on by default, and
    the step equals the loop reference: each token's policy-gradient term weighted by
    min(exp(-noise), 2)."""
    trainer = _trainer(tiny_tokenizer, tmp_path / "tis", noisy=True)
    assert trainer.update_settings.tis_level == "token"  # auto: another engine's log-probs
    before = [copy.deepcopy(a.model) for a in trainer.agents]
    result = trainer.step()
    row, ro = result.row, result.rollout
    assert ro is not None
    for a in range(2):
        # ~48 tokens of noise: the means are within ~30% of their expectations
        assert row[f"mismatch_abs_logp_diff/agent_{a}"] == pytest.approx(
            NOISE * math.sqrt(2 / math.pi), rel=0.3
        )
        assert row[f"mismatch_kl/agent_{a}"] == pytest.approx(math.exp(NOISE**2 / 2) - 1, rel=0.5)
        assert 0 < row[f"tis_weight_mean/agent_{a}"] <= 2.0
        assert row[f"ratio_mean/agent_{a}"] == 1.0  # on-policy: TIS, not the ratio, corrects

    # loop reference of agent 0's SGD step: loss = sum_i sum_t -w_it A_i logp_it / n_i / B
    adv = group_baseline.group_advantages(ro, estimator="grpo")[0][0]
    batch = ro.turns[0].agents[0].batch
    model = before[0]
    from comlrl.algos.models.logprobs import completion_logprobs

    logp = completion_logprobs(model, batch, slice(0, batch.num_prompts), temperature=1.0)
    mask = batch.completion_mask
    w = torch.exp(torch.clamp(logp.detach() - batch.behaviour_logprobs, max=math.log(2.0)))
    n = mask.sum(1).clamp(min=1)
    terms = torch.where(mask, -w * adv[:, None] * logp, torch.zeros(()))
    (terms.sum(1) / n).mean().backward()
    for p_ref, p_new in zip(model.parameters(), trainer.agents[0].model.parameters(), strict=True):
        assert p_ref.grad is not None
        # float32 forward/backward in another order: 1e-6 on weights of O(0.1)
        torch.testing.assert_close(
            p_new.detach(), p_ref.detach() - 0.1 * p_ref.grad, rtol=1e-5, atol=1e-6
        )


def test_tis_can_be_turned_off_or_forced(tiny_tokenizer: Any, tmp_path: Any) -> None:
    off = _trainer(tiny_tokenizer, tmp_path / "off", noisy=True, tis="off")
    assert off.update_settings.tis_level is None
    row = off.step().row
    assert row["mismatch_kl/agent_0"] > 0 and "tis_weight_mean/agent_0" not in row
    forced = _trainer(tiny_tokenizer, tmp_path / "seq", noisy=False, tis="sequence", tis_cap=3.0)
    assert (forced.update_settings.tis_level, forced.update_settings.tis_cap) == ("sequence", 3.0)
    assert tis_level("auto", []) is None
