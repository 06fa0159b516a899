"""Advantage estimators against per-group loop references, and their properties."""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import pytest
import torch
from comlrl.estimators.advantages import (
    Scale,
    compute_advantages,
    return_moments,
    std_from_moments,
)
from comlrl.estimators.losses import policy_loss
from comlrl.estimators.registry import ESTIMATORS, Estimator, register_estimator
from hypothesis import assume, given, settings
from hypothesis import strategies as st

NAMES = ("reinforce", "grpo", "rloo", "remax")
BASELINE_OF = {"reinforce": "none", "grpo": "mean", "rloo": "loo", "remax": "loo_max"}
SCALES: tuple[Scale, ...] = ("none", "group", "batch")
EPS = 1e-6
# float64 inputs; the loop reference differs only by summation order.
TOL: dict[str, Any] = {"rtol": 1e-9, "atol": 1e-9}
PROPS = settings(max_examples=40, deadline=None)


def _pstd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def loop_reference(
    returns: list[float], group_ids: list[int], baseline: str, scale: Scale, eps: float = EPS
) -> list[float]:
    """Slow, obviously-correct advantages: one Python loop per group and per sample."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    batch_std = _pstd(returns) if returns else 0.0
    out = [0.0] * len(returns)
    for members in groups.values():
        values = [returns[i] for i in members]
        n = len(values)
        mean = sum(values) / n
        std = _pstd(values)
        for i in members:
            r = returns[i]
            if baseline == "none":
                b = 0.0
            elif baseline == "mean":
                b = mean
            elif baseline == "loo":
                b = (sum(values) - r) / (n - 1) if n > 1 else r
            elif baseline == "max":
                b = max(values)
            elif baseline == "loo_max":
                others = [returns[j] for j in members if j != i]
                b = max(others) if others else r
            else:
                raise AssertionError(baseline)
            a = r - b
            if scale == "group":
                a = a / (std + eps)
            elif scale == "batch":
                a = a / (batch_std + eps)
            out[i] = a
    return out


# Rewards on a quarter grid: exact in binary, and the all-equal / tied cases that
# matter (max ties, zero variance) come up often.
reward = st.integers(-20, 20).map(lambda x: x / 4)


@st.composite
def fixed_groups(draw: st.DrawFn, min_size: int = 1) -> torch.Tensor:
    p = draw(st.integers(1, 5))
    g = draw(st.integers(min_size, 6))
    values = draw(st.lists(reward, min_size=p * g, max_size=p * g))
    return torch.tensor(values, dtype=torch.float64).reshape(p, g)


@st.composite
def variable_groups(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    labels = draw(
        st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True)
    )
    ids = [label for label, size in zip(labels, sizes, strict=False) for _ in range(size)]
    ids = draw(st.permutations(ids))
    values = draw(st.lists(reward, min_size=len(ids), max_size=len(ids)))
    return torch.tensor(values, dtype=torch.float64), torch.tensor(ids)


def _fixed_ids(returns: torch.Tensor) -> list[int]:
    p, g = returns.shape
    return [i // g for i in range(p * g)]


# --- agreement with the loop reference ---------------------------------------------


@PROPS
@given(returns=fixed_groups(), name=st.sampled_from(NAMES), scale=st.sampled_from(SCALES))
def test_fixed_groups_match_loop_reference(returns: torch.Tensor, name: str, scale: Scale) -> None:
    got = compute_advantages(returns, estimator=name, scale=scale)
    want = loop_reference(returns.flatten().tolist(), _fixed_ids(returns), BASELINE_OF[name], scale)
    torch.testing.assert_close(got.flatten(), torch.tensor(want, dtype=torch.float64), **TOL)


@PROPS
@given(data=variable_groups(), name=st.sampled_from(NAMES), scale=st.sampled_from(SCALES))
def test_variable_groups_match_loop_reference(
    data: tuple[torch.Tensor, torch.Tensor], name: str, scale: Scale
) -> None:
    returns, ids = data
    got = compute_advantages(returns, estimator=name, group_ids=ids, scale=scale)
    want = loop_reference(returns.tolist(), ids.tolist(), BASELINE_OF[name], scale)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), **TOL)


@PROPS
@given(returns=fixed_groups(), name=st.sampled_from(NAMES), scale=st.sampled_from(SCALES))
def test_fixed_groups_equal_flat_groups_with_ids(
    returns: torch.Tensor, name: str, scale: Scale
) -> None:
    p, g = returns.shape
    ids = torch.arange(p).repeat_interleave(g)
    fixed = compute_advantages(returns, estimator=name, scale=scale)
    flat = compute_advantages(returns.flatten(), estimator=name, group_ids=ids, scale=scale)
    torch.testing.assert_close(fixed.flatten(), flat, **TOL)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", NAMES)
def test_torch_fallback_without_kernels_matches_loop_reference(
    name: str, scale: Scale, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the compiled extension, comlrl.kernels' torch reference serves: it must agree.
    monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "torch")
    gen = torch.Generator().manual_seed(11)
    returns = torch.randint(-3, 4, (5, 4), generator=gen).double()
    returns[0] = 1.0  # an all-equal group
    got = compute_advantages(returns, estimator=name, scale=scale)  # type: ignore[arg-type]
    want = loop_reference(returns.flatten().tolist(), _fixed_ids(returns), BASELINE_OF[name], scale)
    torch.testing.assert_close(got.flatten(), torch.tensor(want, dtype=torch.float64), **TOL)
    ids = torch.tensor([4, 9, 4, -1, 9, 9, 4, 2])
    flat = torch.randn(8, generator=gen, dtype=torch.float64)
    got = compute_advantages(flat, estimator=name, group_ids=ids, scale=scale)  # type: ignore[arg-type]
    want = loop_reference(flat.tolist(), ids.tolist(), BASELINE_OF[name], scale)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), **TOL)


def test_torch_fallback_matches_kernels_package_when_installed() -> None:
    from comlrl.kernels import group_advantages, use_backend

    gen = torch.Generator().manual_seed(0)
    returns = torch.randint(-4, 5, (6, 5), generator=gen).double() / 2
    ids = torch.tensor([3, 3, 0, 7, 7, 7, 1, 1, 1, 1])
    flat = torch.randn(10, generator=gen, dtype=torch.float64)
    dense = torch.unique(ids, return_inverse=True)[1]
    group_scales: tuple[Literal["none", "group"], ...] = ("none", "group")
    for baseline, scale in itertools.product(("none", "mean", "loo", "max"), group_scales):
        got = group_advantages(
            returns.flatten(), group_size=5, baseline=baseline, scale=scale, eps=EPS
        )
        with use_backend("torch"):
            want = group_advantages(
                returns.flatten(),
                group_ids=torch.arange(6).repeat_interleave(5),
                baseline=baseline,
                scale=scale,
                eps=EPS,
            )
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)
        got = group_advantages(flat, group_ids=dense, baseline=baseline, scale=scale, eps=EPS)
        with use_backend("torch"):
            want = group_advantages(flat, group_ids=dense, baseline=baseline, scale=scale, eps=EPS)
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)


# --- properties ----------------------------------------------------------------------


@PROPS
@given(
    data=variable_groups(), name=st.sampled_from(("grpo", "rloo")), scale=st.sampled_from(SCALES)
)
def test_mean_and_loo_advantages_have_zero_mean_per_group(
    data: tuple[torch.Tensor, torch.Tensor], name: str, scale: Scale
) -> None:
    returns, ids = data
    a = compute_advantages(returns, estimator=name, group_ids=ids, scale=scale)
    for label in ids.unique():
        group = a[ids == label]
        torch.testing.assert_close(
            group.mean(), torch.zeros((), dtype=torch.float64), atol=1e-9, rtol=0
        )


@PROPS
@given(
    returns=fixed_groups(),
    name=st.sampled_from(("grpo", "rloo", "remax")),
    scale=st.sampled_from(("none", "group")),
    shift=reward,
    which=st.integers(0, 4),
)
def test_adding_a_constant_to_a_group_leaves_baselined_advantages_unchanged(
    returns: torch.Tensor, name: str, scale: Scale, shift: float, which: int
) -> None:
    shifted = returns.clone()
    shifted[which % returns.shape[0]] += shift
    torch.testing.assert_close(
        compute_advantages(shifted, estimator=name, scale=scale),
        compute_advantages(returns, estimator=name, scale=scale),
        **TOL,
    )


@PROPS
@given(data=variable_groups(), scale=st.sampled_from(SCALES))
def test_remax_is_positive_only_for_the_sole_group_max_and_zero_at_tied_maxima(
    data: tuple[torch.Tensor, torch.Tensor], scale: Scale
) -> None:
    # Leave-one-out max: b_i = max of the other samples. Every sample but the one that
    # alone holds the group max gets r - max <= 0 (0 at tied maxima); that one gets
    # max - second max > 0; a singleton gets 0.
    returns, ids = data
    a = compute_advantages(returns, estimator="remax", group_ids=ids, scale=scale)
    for label in ids.unique():
        in_group = ids == label
        group = returns[in_group]
        at_max = in_group & (returns == group.max())
        if group.numel() > 1 and int(at_max.sum()) == 1:
            assert bool((a[at_max] > 0).all())
            assert bool((a[in_group & ~at_max] < 0).all())
        else:
            assert bool((a[at_max] == 0).all())
            assert bool((a[in_group] <= 0).all())


@PROPS
@given(data=variable_groups())
def test_remax_baseline_does_not_depend_on_the_samples_own_return(
    data: tuple[torch.Tensor, torch.Tensor],
) -> None:
    # Unbiasedness: changing r_i leaves b_i = r_i - A_i unchanged (groups of >= 2).
    returns, ids = data
    i = 0
    assume(int((ids == ids[i]).sum()) >= 2)
    before = returns - compute_advantages(returns, estimator="remax", group_ids=ids, scale="none")
    moved = returns.clone()
    moved[i] = moved[i] + 7.25
    after = moved - compute_advantages(moved, estimator="remax", group_ids=ids, scale="none")
    assert after[i].item() == before[i].item()


def test_remax_unique_best_sample_gets_its_margin_over_the_runner_up() -> None:
    # The group max with the sample itself included gave [-2, 0, -3]: the best sample was
    # never reinforced. Leave-one-out: the best beats the runner-up by 2.
    returns = torch.tensor([[1.0, 3.0, 0.0], [2.0, 2.0, 1.0]])
    torch.testing.assert_close(
        compute_advantages(returns, estimator="remax"),
        torch.tensor([[-2.0, 2.0, -3.0], [0.0, 0.0, -1.0]]),
        rtol=0,
        atol=0,
    )


@PROPS
@given(returns=fixed_groups(min_size=2), scale=st.sampled_from(("none", "group")))
def test_loo_is_g_over_g_minus_one_times_mean_for_fixed_groups(
    returns: torch.Tensor, scale: Scale
) -> None:
    g = returns.shape[1]
    loo = compute_advantages(returns, estimator="rloo", scale=scale)
    mean = compute_advantages(returns, estimator="grpo", scale=scale)
    torch.testing.assert_close(loo, g / (g - 1) * mean, **TOL)


@PROPS
@given(data=variable_groups(), scale=st.sampled_from(SCALES))
def test_estimators_stay_distinct_under_every_scale(
    data: tuple[torch.Tensor, torch.Tensor], scale: Scale
) -> None:
    returns, ids = data
    # Distinctness needs a group that varies (else mean/loo/max all give 0) whose mean
    # and max are non-zero (else REINFORCE coincides with mean or max on it), of 3 or more
    # samples: for G = 2 the best other sample is the mean of the others, so remax = rloo.
    first = ids == ids[0]
    group = returns[first]
    assume(group.numel() >= 3 and _pstd(group.tolist()) > 0)
    assume(group.mean().abs() > 1e-3 and group.max().abs() > 1e-3)
    results = {
        n: compute_advantages(returns, estimator=n, group_ids=ids, scale=scale) for n in NAMES
    }
    for x, y in itertools.combinations(NAMES, 2):
        assert not torch.allclose(results[x], results[y], rtol=1e-6, atol=1e-9), (x, y, scale)


def test_four_estimators_give_different_advantages_and_gradients_with_group_scale() -> None:
    returns = torch.tensor([[1.0, 0.0, 0.0, 0.5], [2.0, 1.0, 3.0, 1.0]])
    logprobs = torch.full((8, 3), -1.0)
    mask = torch.ones(8, 3, dtype=torch.bool)
    advs: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    for name in NAMES:
        a = compute_advantages(returns, estimator=name, scale="group")
        lp = logprobs.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, a.flatten(), mask)
        loss.backward()
        assert lp.grad is not None
        advs[name], grads[name] = a, lp.grad
    # Hand-computed for group 0 (mean 0.375, population std 0.4146...).
    std0 = math.sqrt(((1 - 0.375) ** 2 + 2 * 0.375**2 + 0.125**2) / 4)
    torch.testing.assert_close(
        advs["remax"][0],
        torch.tensor([0.5, -1.0, -1.0, -0.5]) / (std0 + EPS),
        rtol=1e-6,
        atol=1e-6,
    )
    for x, y in itertools.combinations(NAMES, 2):
        assert not torch.allclose(advs[x], advs[y], rtol=1e-4, atol=1e-4), (x, y)
        assert not torch.allclose(grads[x], grads[y], rtol=1e-4, atol=1e-6), (x, y)


# --- edge cases ----------------------------------------------------------------------


@pytest.mark.parametrize("scale", SCALES)
def test_singleton_groups_give_zero_advantage_for_baselined_estimators(scale: Scale) -> None:
    returns = torch.tensor([[3.0], [-1.0]])
    for name in ("grpo", "rloo", "remax"):
        a = compute_advantages(returns, estimator=name, scale=scale)
        torch.testing.assert_close(a, torch.zeros(2, 1), rtol=0, atol=0)
    ids = torch.tensor([0, 1, 1, 2])
    flat = torch.tensor([5.0, 1.0, 2.0, -2.0])
    for name in ("grpo", "rloo", "remax"):
        a = compute_advantages(flat, estimator=name, group_ids=ids, scale=scale)
        assert a[0].item() == 0.0 and a[3].item() == 0.0


@pytest.mark.parametrize("scale", SCALES)
def test_all_equal_groups_give_zero_advantage_for_baselined_estimators(scale: Scale) -> None:
    returns = torch.tensor([[2.0, 2.0, 2.0], [0.0, 1.0, 2.0]])
    for name in ("grpo", "rloo", "remax"):
        a = compute_advantages(returns, estimator=name, scale=scale)
        torch.testing.assert_close(a[0], torch.zeros(3), rtol=0, atol=0)
        assert bool((a[1] != 0).any())


def test_reinforce_is_the_raw_return_and_divides_zero_variance_groups_by_eps() -> None:
    returns = torch.tensor([[2.0, 2.0], [1.0, 3.0]])
    torch.testing.assert_close(compute_advantages(returns, estimator="reinforce"), returns)
    scaled = compute_advantages(returns, estimator="reinforce", scale="group", eps=1e-3)
    # Documented: no baseline, so a zero-variance group gets r / eps.
    torch.testing.assert_close(scaled[0], torch.tensor([2e3, 2e3]), rtol=1e-6, atol=0)
    torch.testing.assert_close(scaled[1], torch.tensor([1.0, 3.0]) / (1.0 + 1e-3))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_returns_raise_naming_the_index(bad: float) -> None:
    returns = torch.zeros(3, 4)
    returns[2, 1] = bad
    with pytest.raises(ValueError, match=r"returns\[\(2, 1\)\]"):
        compute_advantages(returns)
    flat = torch.zeros(5)
    flat[3] = bad
    with pytest.raises(ValueError, match=r"returns\[3\]"):
        compute_advantages(flat, group_ids=torch.zeros(5, dtype=torch.long))


def test_empty_returns_give_empty_advantages() -> None:
    assert compute_advantages(torch.zeros(0, 4)).shape == (0, 4)
    out = compute_advantages(torch.zeros(0), group_ids=torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)


def test_output_dtype_is_float32_or_float64() -> None:
    assert compute_advantages(torch.ones(2, 3, dtype=torch.float64)).dtype == torch.float64
    assert compute_advantages(torch.ones(2, 3, dtype=torch.bfloat16)).dtype == torch.float32
    a = compute_advantages(torch.tensor([[1, 0, 0]]), estimator="rloo")
    torch.testing.assert_close(a, torch.tensor([[1.0, -0.5, -0.5]]))


def test_input_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="need group_ids"):
        compute_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="already define the groups"):
        compute_advantages(torch.zeros(2, 2), group_ids=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[P, G\] or flat \[M\]"):
        compute_advantages(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="unknown scale 'std'"):
        compute_advantages(torch.zeros(2, 2), scale="std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps must be > 0"):
        compute_advantages(torch.zeros(2, 2), eps=0.0)
    with pytest.raises(ValueError, match="shape \\[M\\] = \\[4\\]"):
        compute_advantages(torch.zeros(4), group_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        compute_advantages(torch.zeros(4), group_ids=torch.zeros(4))


# --- registry ------------------------------------------------------------------------


def test_registry_has_the_four_estimators_and_their_multi_agent_aliases() -> None:
    for name, alias in zip(NAMES, ("mareinforce", "magrpo", "marloo", "maremax"), strict=False):
        assert ESTIMATORS[alias] is ESTIMATORS[name]
        assert ESTIMATORS[name].baseline == BASELINE_OF[name]
        assert ESTIMATORS[name].reference
    returns = torch.tensor([[1.0, 2.0, 4.0]])
    torch.testing.assert_close(
        compute_advantages(returns, estimator="marloo"),
        compute_advantages(returns, estimator="rloo"),
    )


def test_unknown_estimator_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown estimator 'ppo'.*'grpo'"):
        compute_advantages(torch.zeros(1, 2), estimator="ppo")


def test_registered_callable_baseline_is_used() -> None:
    def median_baseline(returns: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
        medians = torch.stack([returns[ids == g].median() for g in range(n)])
        return medians[ids]

    try:
        est = register_estimator("median_test", median_baseline, aliases=("ma_median_test",))
        assert ESTIMATORS["ma_median_test"] is est
        returns = torch.tensor([[1.0, 2.0, 10.0], [0.0, 0.0, 3.0]])
        a = compute_advantages(returns, estimator="median_test")
        torch.testing.assert_close(a, torch.tensor([[-1.0, 0.0, 8.0], [0.0, 0.0, 3.0]]))
        scaled = compute_advantages(returns, estimator=est, scale="group")
        want = a / (returns.std(dim=1, correction=0, keepdim=True) + EPS)
        torch.testing.assert_close(scaled, want)
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("median_test", "mean")
    finally:
        ESTIMATORS.pop("median_test", None)
        ESTIMATORS.pop("ma_median_test", None)


def test_register_rejects_unknown_baselines() -> None:
    with pytest.raises(ValueError, match="unknown baseline 'median'"):
        register_estimator("x_test", "median")
    with pytest.raises(TypeError, match="callable"):
        register_estimator("x_test", 3)  # type: ignore[arg-type]
    assert "x_test" not in ESTIMATORS


def test_estimator_objects_can_be_passed_directly() -> None:
    est = Estimator(name="adhoc", baseline="max")
    returns = torch.tensor([[1.0, 3.0]])
    torch.testing.assert_close(
        compute_advantages(returns, estimator=est), torch.tensor([[-2.0, 0.0]])
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=3, max_size=6),
        min_size=1,
        max_size=4,
    ).filter(
        # a varying group whose max is non-zero (else ReMax coincides with REINFORCE on it)
        lambda rows: (
            len({len(r) for r in rows}) == 1
            and all(max(r) - min(r) > 1e-2 and abs(max(r)) > 1e-2 for r in rows)
        )
    )
)
def test_default_scales_follow_each_estimators_definition(rows) -> None:  # type: ignore[no-untyped-def]
    """Under defaults GRPO is (r - mean) / (std + eps) (DeepSeekMath eq. 3); RLOO, ReMax
    (r minus the best of the other samples) and REINFORCE are unscaled. (Distinctness is checked on a fixed group below: on some groups
    two definitions coincide, e.g. [0, 0, 0, 0, 2], where 1 / std = G / (G - 1).)"""
    returns = torch.tensor(rows, dtype=torch.float64)
    mean, std = returns.mean(dim=1, keepdim=True), returns.std(dim=1, keepdim=True, correction=0)
    torch.testing.assert_close(compute_advantages(returns), (returns - mean) / (std + 1e-6))
    g = returns.shape[1]
    torch.testing.assert_close(
        compute_advantages(returns, estimator="rloo"), g / (g - 1) * (returns - mean)
    )
    top2 = returns.topk(2, dim=1).values
    sole = (returns == top2[:, :1]) & (top2[:, :1] > top2[:, 1:])
    loo_max = torch.where(sole, top2[:, 1:], top2[:, :1])
    torch.testing.assert_close(compute_advantages(returns, estimator="remax"), returns - loo_max)
    torch.testing.assert_close(compute_advantages(returns, estimator="reinforce"), returns)


def test_default_estimators_give_distinct_advantages() -> None:
    """The four estimators' defaults differ on an ordinary group."""
    returns = torch.tensor([[0.0, 1.0, 3.0, 7.0]], dtype=torch.float64)
    outs = [
        compute_advantages(returns, estimator=n) for n in ("grpo", "rloo", "remax", "reinforce")
    ]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(outs[i], outs[j]), (i, j)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-100, 100, allow_nan=False), min_size=0, max_size=6),
        min_size=1,
        max_size=4,
    )
)
def test_summed_shard_moments_give_the_std_of_the_whole_batch(shards: list[list[float]]) -> None:
    """Data parallel ``scale="batch"``: moments add over shards, so the std of the summed
    moments is the population std of the concatenated batch (float64 sums: 1e-9 relative
    to the returns' magnitude is far above their cancellation error at |r| <= 100)."""
    whole = [r for shard in shards for r in shard]
    assume(whole)
    total = sum(return_moments(torch.tensor(s, dtype=torch.float64)) for s in shards)
    want = torch.tensor(whole, dtype=torch.float64).std(correction=0).item()
    assert std_from_moments(total) == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_batch_std_replaces_the_local_std_of_scale_batch() -> None:
    shard = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    whole = torch.cat([shard, torch.tensor([[5.0, -3.0]])])
    want = compute_advantages(whole, estimator="rloo", scale="batch")[:2]
    std = std_from_moments(return_moments(whole))
    got = compute_advantages(shard, estimator="rloo", scale="batch", batch_std=std)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    local = compute_advantages(shard, estimator="rloo", scale="batch")
    assert not torch.allclose(local, want)  # the shard's own std is another divisor
    with pytest.raises(ValueError, match="batch_std=1.0 is the divisor of scale='batch'"):
        compute_advantages(shard, estimator="rloo", scale="group", batch_std=1.0)
    with pytest.raises(ValueError, match="batch_std must be a finite number >= 0"):
        compute_advantages(shard, estimator="rloo", scale="batch", batch_std=-1.0)
    with pytest.raises(ValueError, match=r"moments must be \[3\]"):
        std_from_moments(torch.zeros(2))
    assert std_from_moments(torch.zeros(3)) == 0.0
