"""group_advantages: every present backend against a per-group Python loop."""

from __future__ import annotations

import math

import pytest
import torch
from comlrl.kernels import group_advantages, use_backend
from comlrl.kernels._reference import group_advantages_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BASELINES = ["none", "mean", "loo", "max"]
SCALES = ["none", "group"]
HYP = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def loop_reference(
    rewards: list[float], groups: list[int], baseline: str, scale: str, eps: float
) -> list[float]:
    """Slow, obvious definition: one Python loop per group (tests only)."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        members = [i for i, gi in enumerate(groups) if gi == g]
        vals = [rewards[i] for i in members]
        n = len(vals)
        mean = sum(vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / n)  # population std
        for i in members:
            r = rewards[i]
            if baseline == "none":
                a = r
            elif baseline == "mean":
                a = r - mean
            elif baseline == "loo":
                a = 0.0 if n == 1 else r - (sum(vals) - r) / (n - 1)
            else:
                a = r - max(vals)
            if scale == "group":
                a = a / (std + eps)
            out[i] = a
    return out


def run(backend: str, device: torch.device, rewards: torch.Tensor, **kwargs) -> torch.Tensor:
    if kwargs.get("group_ids") is not None:
        kwargs["group_ids"] = kwargs["group_ids"].to(device)
    with use_backend(backend):
        return group_advantages(rewards.to(device), **kwargs).cpu()


# float64 rewards: agree with the loop to 1e-9; float32: rounding of inputs/outputs only.
TOL = {torch.float64: dict(atol=1e-9, rtol=1e-9), torch.float32: dict(atol=1e-5, rtol=1e-5)}


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_fixed_groups_match_the_loop_reference(
    backend: str, device: torch.device, baseline: str, scale: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(48, generator=gen, dtype=torch.float64).to(dtype)
    expected = loop_reference(
        rewards.double().tolist(), [i // 6 for i in range(48)], baseline, scale, 1e-6
    )
    got = run(backend, device, rewards, group_size=6, baseline=baseline, scale=scale)
    assert got.dtype == dtype
    torch.testing.assert_close(
        got.double(), torch.tensor(expected, dtype=torch.float64), **TOL[dtype]
    )


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("scale", SCALES)
def test_variable_unsorted_groups_match_the_loop_reference(
    backend: str, device: torch.device, baseline: str, scale: str
) -> None:
    gen = torch.Generator().manual_seed(1)
    ids = torch.tensor(
        [7, -3, 7, 100, 5, -3, 7, 5, 42, 7, 100, 5], dtype=torch.int64
    )  # 42: singleton
    rewards = torch.randn(ids.numel(), generator=gen, dtype=torch.float64)
    expected = loop_reference(rewards.tolist(), ids.tolist(), baseline, scale, 1e-6)
    got = run(backend, device, rewards, group_ids=ids, baseline=baseline, scale=scale)
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=1e-9
    )


@pytest.mark.parametrize("baseline", ["mean", "loo", "max"])
@pytest.mark.parametrize("scale", SCALES)
def test_singleton_groups_get_zero_advantage(
    backend: str, device: torch.device, baseline: str, scale: str
) -> None:
    rewards = torch.tensor([3.0, -1.5, 0.25])
    got = run(backend, device, rewards, group_size=1, baseline=baseline, scale=scale)
    torch.testing.assert_close(got, torch.zeros(3), atol=0, rtol=0)
    got = run(
        backend, device, rewards, group_ids=torch.tensor([0, 1, 2]), baseline=baseline, scale=scale
    )
    torch.testing.assert_close(got, torch.zeros(3), atol=0, rtol=0)


def test_singleton_groups_keep_the_reward_without_a_baseline(
    backend: str, device: torch.device
) -> None:
    rewards = torch.tensor([3.0, -1.5])
    got = run(backend, device, rewards, group_size=1, baseline="none")
    torch.testing.assert_close(got, rewards, atol=0, rtol=0)


@pytest.mark.parametrize("baseline", ["mean", "loo", "max"])
@pytest.mark.parametrize("scale", SCALES)
def test_all_equal_groups_get_zero_advantage(
    backend: str, device: torch.device, baseline: str, scale: str
) -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    got = run(backend, device, rewards, group_size=4, baseline=baseline, scale=scale)
    torch.testing.assert_close(got, torch.zeros(8), atol=0, rtol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("use_ids", [False, True])
def test_non_finite_reward_raises_naming_the_first_bad_index(
    backend: str, device: torch.device, bad: float, use_ids: bool
) -> None:
    rewards = torch.arange(12, dtype=torch.float32)
    rewards[7] = bad
    rewards[9] = float("nan")
    kwargs = dict(group_ids=torch.arange(12) % 3) if use_ids else dict(group_size=4)
    with pytest.raises(ValueError, match=r"rewards\[7\]"):
        run(backend, device, rewards, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), "exactly one"),
        (dict(group_size=2, group_ids=torch.zeros(6, dtype=torch.long)), "exactly one"),
        (dict(group_size=4), "divide"),
        (dict(group_size=0), "divide"),
        (dict(group_size=2, baseline="median"), "baseline"),
        (dict(group_size=2, scale="batch"), "scale"),
        (dict(group_ids=torch.zeros(5, dtype=torch.long)), r"\[M\]"),
        (dict(group_ids=torch.zeros(6)), "integer"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.zeros(6), **kwargs)


def test_empty_rewards_give_empty_advantages(backend: str, device: torch.device) -> None:
    got = run(backend, device, torch.zeros(0), group_size=4)
    assert got.shape == (0,)


def test_baselines_stay_distinct_under_group_scaling(backend: str, device: torch.device) -> None:
    """The z-score trap: normalizing the advantages would make all baselines equal."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 3.0, 2.0, 2.5, 0.0, 1.0])
    outs = {
        b: run(backend, device, rewards, group_size=4, baseline=b, scale="group") for b in BASELINES
    }
    for i, a in enumerate(BASELINES):
        for b in BASELINES[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b]), (a, b)


def test_half_precision_rewards_are_computed_in_float32(backend: str, device: torch.device) -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    got = run(backend, device, rewards, group_size=2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, torch.tensor([-0.5, 0.5, -0.5, 0.5], dtype=torch.bfloat16))


groups_strategy = st.lists(st.integers(1, 6), min_size=1, max_size=8)
reward_value = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


@st.composite
def grouped_rewards(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = draw(groups_strategy)
    labels = draw(st.permutations([g for g, n in enumerate(sizes) for _ in range(n)]))
    values = draw(st.lists(reward_value, min_size=len(labels), max_size=len(labels)))
    return torch.tensor(values, dtype=torch.float64), torch.tensor(labels, dtype=torch.int64)


@HYP
@given(data=grouped_rewards(), baseline=st.sampled_from(BASELINES), scale=st.sampled_from(SCALES))
def test_property_matches_loop_reference(
    backend: str,
    device: torch.device,
    data: tuple[torch.Tensor, torch.Tensor],
    baseline: str,
    scale: str,
) -> None:
    rewards, ids = data
    expected = loop_reference(rewards.tolist(), ids.tolist(), baseline, scale, 1e-6)
    got = run(backend, device, rewards, group_ids=ids, baseline=baseline, scale=scale)
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=1e-9
    )


@HYP
@given(data=grouped_rewards(), baseline=st.sampled_from(["mean", "loo"]))
def test_property_zero_mean_per_group(
    backend: str, device: torch.device, data: tuple[torch.Tensor, torch.Tensor], baseline: str
) -> None:
    rewards, ids = data
    adv = run(backend, device, rewards, group_ids=ids, baseline=baseline)
    sums = torch.zeros(int(ids.max()) + 1, dtype=torch.float64).index_add_(0, ids, adv)
    torch.testing.assert_close(sums, torch.zeros_like(sums), atol=1e-9, rtol=0)


@HYP
@given(
    data=grouped_rewards(),
    baseline=st.sampled_from(["mean", "loo", "max"]),
    scale=st.sampled_from(SCALES),
    shift=st.floats(-50, 50),
)
def test_property_shift_invariance(
    backend: str,
    device: torch.device,
    data: tuple[torch.Tensor, torch.Tensor],
    baseline: str,
    scale: str,
    shift: float,
) -> None:
    rewards, ids = data
    a = run(backend, device, rewards, group_ids=ids, baseline=baseline, scale=scale, eps=1e-3)
    b = run(
        backend, device, rewards + shift, group_ids=ids, baseline=baseline, scale=scale, eps=1e-3
    )
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@HYP
@given(data=grouped_rewards(), scale=st.sampled_from(SCALES))
def test_property_max_baseline_is_never_positive(
    backend: str, device: torch.device, data: tuple[torch.Tensor, torch.Tensor], scale: str
) -> None:
    rewards, ids = data
    adv = run(backend, device, rewards, group_ids=ids, baseline="max", scale=scale)
    assert (adv <= 0).all()


@HYP
@given(
    g=st.integers(2, 8),
    groups=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from(SCALES),
)
def test_property_loo_is_g_over_g_minus_1_times_mean(
    backend: str, device: torch.device, g: int, groups: int, seed: int, scale: str
) -> None:
    rewards = torch.randn(
        g * groups, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    loo = run(backend, device, rewards, group_size=g, baseline="loo", scale=scale)
    mean = run(backend, device, rewards, group_size=g, baseline="mean", scale=scale)
    torch.testing.assert_close(loo, mean * g / (g - 1), atol=1e-12, rtol=1e-12)


@pytest.mark.cuda
def test_cuda_fixed_groups_take_one_kernel_launch() -> None:
    from torch.profiler import ProfilerActivity, profile

    rewards = torch.randn(4096, device="cuda")
    group_advantages(rewards, group_size=8)  # warm up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with use_backend("cuda"):
            group_advantages(rewards, group_size=8, baseline="loo", scale="group")
        torch.cuda.synchronize()
    kernels = [
        e
        for e in prof.events()
        if e.device_type.name == "CUDA"
        and "memcpy" not in e.name.lower()
        and "memset" not in e.name.lower()
    ]
    names = sorted({e.name for e in kernels})
    assert len([e for e in kernels if "advantages_kernel" in e.name]) == 1, names
    assert all("advantages_kernel" in n for n in names), names


@pytest.mark.parametrize("baseline", BASELINES)
def test_sparse_huge_labels_match_the_loop_reference(
    backend: str, device: torch.device, baseline: str
) -> None:
    """Labels far apart (no dense shift possible) go through compaction first."""
    ids = torch.tensor([10**12, -(10**12), 10**12, 5, 5, -(10**12), 7], dtype=torch.int64)
    rewards = torch.tensor([1.0, 2.0, 4.0, -1.0, 0.5, 3.0, 9.0], dtype=torch.float64)
    expected = loop_reference(rewards.tolist(), ids.tolist(), baseline, "group", 1e-6)
    got = run(backend, device, rewards, group_ids=ids, baseline=baseline, scale="group")
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=1e-9
    )


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_groups_larger_than_a_warp_and_a_block(
    backend: str, device: torch.device, baseline: str, scale: str, dtype: torch.dtype
) -> None:
    """Group sizes around 32 and 256 (the CUDA kernel reduces across warps and loops over a
    block of 256 threads), mixed with singletons, shuffled; and fixed groups of 1024."""
    gen = torch.Generator().manual_seed(5)
    sizes = [1, 2, 31, 32, 33, 255, 256, 257, 1000, 3001]
    labels = torch.cat([torch.full((s,), g, dtype=torch.int64) for g, s in enumerate(sizes)])
    labels = labels[torch.randperm(labels.numel(), generator=gen)]
    rewards = (torch.randn(labels.numel(), generator=gen, dtype=torch.float64) * 3 + 1).to(dtype)
    atol, rtol = TOL[dtype]["atol"], TOL[dtype]["rtol"]
    expected = group_advantages_reference(
        rewards.double(), group_ids=labels, baseline=baseline, scale=scale
    )
    got = run(backend, device, rewards, group_ids=labels, baseline=baseline, scale=scale)
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=rtol)
    fixed = rewards[:4096]
    expected = group_advantages_reference(
        fixed.double(), group_size=1024, baseline=baseline, scale=scale
    )
    got = run(backend, device, fixed, group_size=1024, baseline=baseline, scale=scale)
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=rtol)
