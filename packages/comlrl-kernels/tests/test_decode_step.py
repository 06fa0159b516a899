"""DecodeStep (one C++ call per decode step) against its float64 torch spec.

The reference (``decode_step_reference``) runs the same step in float64 on the same
float32 weights and cache. The kernel sums in another order (GEMV partial sums, scores
as rank-1 updates) and uses a polynomial exp (~1e-7 relative), so it differs from the
exact value by float32 rounding: a few ulp per dot product, amplified by the layers by
however ill-conditioned the instance is (tiny hidden sizes can cancel in the residual
stream). The check is ``|logit - exact| <= 1e-5 * max|exact logit| + 4 * e32``, where
``e32`` is the error of torch's own float32 evaluation of the same spec on the same
instance (measured: ~1e-7 of max |logit| typically; 1.1e-5 for the kernel vs 6.4e-6 for
torch float32 on a hidden=2 case). A real error (a wrong head, slot, position or mask)
moves logits by O(1) of their scale.
"""

from __future__ import annotations

import math

import pytest
import torch
from comlrl.kernels import (
    BackendUnavailableError,
    DecodeLayerWeights,
    DecodeStep,
    _dispatch,
    decode_step_unavailable,
    use_backend,
)
from comlrl.kernels._decode_reference import decode_step_reference
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(
    decode_step_unavailable() is not None, reason=f"C++ decode step: {decode_step_unavailable()}"
)
# COMLRL_KERNELS_CPU_ISA: every build this CPU runs (base, avx2, avx512) and the automatic pick
ISAS = ["auto", *(_dispatch._cpu.isas() if _dispatch._cpu is not None else [])]
RTOL = 1e-5


def make_case(
    *,
    prompts: int = 2,
    group: int = 2,
    kv_heads: int = 2,
    rep: int = 2,
    head_dim: int = 8,
    hidden: int = 24,
    inter: int = 40,
    vocab: int = 33,
    layers: int = 2,
    prefix: int = 5,
    pad: list[int] | None = None,
    steps: int = 3,
    biases: bool = False,
    tied: bool = False,
    seed: int = 0,
) -> dict:  # type: ignore[type-arg]
    """Random float32 weights, a prompt cache with left padding ``pad[p]`` per prompt,
    NaN-filled completion slots (a slot read before it is written poisons the logits),
    and rotary tables of per-row positions."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    heads = kv_heads * rep
    w = 1 / math.sqrt(hidden)

    def lin(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return rnd(n, k, scale=1 / math.sqrt(k)), (rnd(n, scale=0.3) if biases else None)

    layer_list = [
        DecodeLayerWeights(
            norm1=1 + rnd(hidden, scale=0.3),
            eps1=1e-5,
            q=lin(heads * head_dim, hidden),
            k=lin(kv_heads * head_dim, hidden),
            v=lin(kv_heads * head_dim, hidden),
            o=lin(hidden, heads * head_dim),
            norm2=1 + rnd(hidden, scale=0.3),
            eps2=1e-6,
            gate=lin(inter, hidden),
            up=lin(inter, hidden),
            down=lin(hidden, inter),
        )
        for _ in range(layers)
    ]
    embed = rnd(vocab, hidden)
    pad = pad if pad is not None else [0] * prompts
    bias = torch.zeros(prompts, prefix)
    for p, n in enumerate(pad):
        bias[p, :n] = float("-inf")
    rows = prompts * group
    # [B, T]: a row's first new token sits right after its prompt's real tokens
    pos = torch.tensor([prefix - n for n in pad]).repeat_interleave(group)[:, None]
    pos = pos + torch.arange(steps)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = pos[..., None].float() * inv  # [B, T, D/2]
    ang = torch.cat([ang, ang], dim=-1)
    half = head_dim // 2
    sin = ang.sin()
    return dict(
        model=dict(
            embed=embed,
            layers=layer_list,
            final_norm=1 + rnd(hidden, scale=0.3),
            final_eps=1e-5,
            lm_head=embed if tied else rnd(vocab, hidden, scale=w),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            scaling=head_dim**-0.5,
        ),
        cache=dict(
            prefix_keys=[rnd(prompts, kv_heads, head_dim, prefix) for _ in range(layers)],
            prefix_values=[rnd(prompts, kv_heads, prefix, head_dim) for _ in range(layers)],
            keys=[
                torch.full((prompts, kv_heads, group, head_dim, steps), float("nan"))
                for _ in range(layers)
            ],
            values=[
                torch.full((prompts, kv_heads, group, steps, head_dim), float("nan"))
                for _ in range(layers)
            ],
            prefix_bias=bias,
            cos=ang.cos().contiguous(),
            sin=torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).contiguous(),
        ),
        tokens=torch.randint(0, vocab, (steps, rows), generator=gen),
    )


def double_cache(cache: dict) -> dict:  # type: ignore[type-arg]
    return {
        k: [t.double() for t in v] if isinstance(v, list) else v.double() for k, v in cache.items()
    }


def double_model(model: dict) -> dict:  # type: ignore[type-arg]
    def d(
        lin: tuple[torch.Tensor, torch.Tensor | None],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return lin[0].double(), None if lin[1] is None else lin[1].double()

    out = dict(model)
    out["embed"] = model["embed"].double()
    out["final_norm"] = model["final_norm"].double()
    out["lm_head"] = model["lm_head"].double()
    out["layers"] = [
        DecodeLayerWeights(
            norm1=lw.norm1.double(),
            eps1=lw.eps1,
            q=d(lw.q),
            k=d(lw.k),
            v=d(lw.v),
            o=d(lw.o),
            norm2=lw.norm2.double(),
            eps2=lw.eps2,
            gate=d(lw.gate),
            up=d(lw.up),
            down=d(lw.down),
        )
        for lw in model["layers"]
    ]
    return out


def run_both(case: dict) -> tuple[list[torch.Tensor], list[torch.Tensor], dict, dict]:  # type: ignore[type-arg]
    """Every step through the kernel and the float64 reference; returns the kernel's
    logits, the reference's ``(float64, float32)`` logits per step, and both caches
    after the last step."""
    step = DecodeStep(**case["model"])
    cache = case["cache"]
    ref_cache = double_cache(cache)
    ref_model = double_model(case["model"])
    cache32 = {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in cache.items()}
    step.start(**cache)
    got, want = [], []
    for slot, tokens in enumerate(case["tokens"]):
        got.append(step(tokens, slot).clone())
        exact = decode_step_reference(**ref_model, **ref_cache, tokens=tokens, slot=slot)
        f32 = decode_step_reference(**case["model"], **cache32, tokens=tokens, slot=slot)
        want.append((exact, f32))
    return got, want, cache, ref_cache


def assert_close_rel(got: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Within ``RTOL`` of the largest exact |logit| plus 4x torch float32's own error."""
    exact, f32 = want
    assert torch.isfinite(got).all(), "non-finite logits (a NaN slot was read?)"
    scale = float(exact.abs().max())
    e32 = float((f32.double() - exact).abs().max())
    err = float((got.double() - exact).abs().max())
    assert err <= RTOL * scale + 4 * e32, (
        f"max |error| {err:.3g} > {RTOL} * {scale:.3g} + 4 * {e32:.3g} (torch float32's error)"
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("biases,tied", [(False, False), (True, True)])
def test_steps_equal_the_float64_spec(
    monkeypatch: pytest.MonkeyPatch, isa: str, biases: bool, tied: bool
) -> None:
    monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", isa)
    case = make_case(pad=[0, 3], steps=4, biases=biases, tied=tied)
    got, want, cache, ref_cache = run_both(case)
    for g, w in zip(got, want):
        assert_close_rel(g, w)
    for name in ("keys", "values"):  # every slot written, like the reference wrote it
        for a, b in zip(cache[name], ref_cache[name]):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.integers(1, 3),
    group=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    rep=st.integers(1, 5),  # 5: one pass of 4 query heads' scores and one of 1
    head_dim=st.sampled_from([2, 4, 8, 16, 64]),
    hidden=st.integers(1, 40),
    inter=st.integers(1, 48),
    layers=st.integers(1, 2),
    prefix=st.integers(1, 70),  # several 8-position vectors of the score pass, and tails
    data=st.data(),
    steps=st.integers(1, 4),
    biases=st.booleans(),
    tied=st.booleans(),
    isa=st.sampled_from(ISAS),
    seed=st.integers(0, 2**16),
)
def test_any_shape_padding_and_rows_match_the_spec(
    prompts: int,
    group: int,
    kv_heads: int,
    rep: int,
    head_dim: int,
    hidden: int,
    inter: int,
    layers: int,
    prefix: int,
    data: st.DataObject,
    steps: int,
    biases: bool,
    tied: bool,
    isa: str,
    seed: int,
) -> None:
    pad = data.draw(st.lists(st.integers(0, prefix - 1), min_size=prompts, max_size=prompts))
    case = make_case(
        prompts=prompts,
        group=group,
        kv_heads=kv_heads,
        rep=rep,
        head_dim=head_dim,
        hidden=hidden,
        inter=inter,
        layers=layers,
        prefix=prefix,
        pad=pad,
        steps=steps,
        biases=biases,
        tied=tied,
        seed=seed,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMLRL_KERNELS_CPU_ISA", isa)
        got, want, _, _ = run_both(case)
    for g, w in zip(got, want):
        assert_close_rel(g, w)


def test_many_rows_and_threads_match_the_spec() -> None:
    """34 rows (past the 4-row GEMV tile) and a long prompt whose attention is split
    over 2 threads (>= 1M multiply-adds per thread)."""
    case = make_case(
        prompts=17,
        group=2,
        kv_heads=1,
        rep=4,
        head_dim=64,
        hidden=64,
        prefix=600,
        pad=[i * 7 for i in range(17)],
        layers=1,
        steps=2,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, want, _, _ = run_both(case)
    finally:
        torch.set_num_threads(before)
    for g, w in zip(got, want):
        assert_close_rel(g, w)


@pytest.mark.parametrize("isa", ISAS)
def test_a_model_above_the_transpose_threshold_matches_the_spec(
    monkeypatch: pytest.MonkeyPatch, isa: str
) -> None:
    """4.8M linear weight elements (> 2**22): the step streams the weights through the
    few-row GEMV instead of transposed copies; 6 rows (a tile of 4 and one of 2)."""
    monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", isa)
    case = make_case(
        prompts=3,
        group=2,
        kv_heads=2,
        rep=4,
        head_dim=64,
        hidden=512,
        inter=1024,
        vocab=2000,
        layers=1,
        prefix=4,
        pad=[0, 1, 3],
        steps=2,
        biases=True,
    )
    got, want, _, _ = run_both(case)
    for g, w in zip(got, want):
        assert_close_rel(g, w)


def test_in_place_weight_updates_are_seen_from_the_next_start() -> None:
    case = make_case(steps=1)
    step = DecodeStep(**case["model"])
    step.start(**case["cache"])
    before = step(case["tokens"][0], 0).clone()
    with torch.no_grad():  # as an optimizer step would
        for lw in case["model"]["layers"]:
            lw.down[0].mul_(-1.0)
        case["model"]["lm_head"].mul_(2.0)
    got, want, _, _ = run_both(case)  # a new start on the same weights
    step.start(**case["cache"])
    again = step(case["tokens"][0], 0)
    assert_close_rel(got[0], want[0])
    assert_close_rel(again, want[0])
    assert not torch.allclose(before, again)


def test_logits_go_into_a_given_buffer() -> None:
    case = make_case()
    step = DecodeStep(**case["model"])
    step.start(**case["cache"])
    out = torch.full((4, 40), float("nan"))[:, :33]  # rows with a stride > V
    got = step(case["tokens"][0], 0, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(out).all()


def test_bad_inputs_raise_clear_errors() -> None:
    case = make_case()
    model, cache = case["model"], case["cache"]
    with pytest.raises(ValueError, match="embed is torch.float64"):
        DecodeStep(**{**model, "embed": model["embed"].double()})
    with pytest.raises(ValueError, match="on meta"):
        DecodeStep(**{**model, "final_norm": torch.empty(24, device="meta")})
    with pytest.raises(ValueError, match="lm_head has shape"):
        DecodeStep(**{**model, "lm_head": model["lm_head"][:, :5]})
    with pytest.raises(ValueError, match="not a multiple of kv_heads"):
        DecodeStep(**{**model, "num_heads": 3})
    with pytest.raises(ValueError, match="q_proj weight is"):
        DecodeStep(**{**model, "head_dim": 4})
    with pytest.raises(ValueError, match="rows must be contiguous"):
        DecodeStep(**{**model, "embed": model["embed"].t().contiguous().t()})
    step = DecodeStep(**model)
    with pytest.raises(ValueError, match="start"):
        step(case["tokens"][0], 0)
    with pytest.raises(ValueError, match=r"prefix_values\[1\] has shape"):
        step.start(
            **{
                **cache,
                "prefix_values": [cache["prefix_values"][0], cache["prefix_values"][0][:, :, :2]],
            }
        )
    with pytest.raises(ValueError, match="cos has shape"):
        step.start(**{**cache, "cos": cache["cos"][:2].contiguous()})
    step.start(**cache)
    with pytest.raises(ValueError, match="int64"):
        step(case["tokens"][0].int(), 0)
    with pytest.raises(ValueError, match=r"tokens\[1\] = 33 is outside \[0, 33\)"):
        step(torch.tensor([0, 33, 0, 0]), 0)
    with pytest.raises(ValueError, match="slot 3 is outside"):
        step(case["tokens"][0], 3)


def test_forcing_the_torch_backend_makes_it_unavailable() -> None:
    with use_backend("torch"):
        assert "torch" in (decode_step_unavailable() or "")
        with pytest.raises(BackendUnavailableError):
            DecodeStep(**make_case()["model"])
    assert _dispatch._cpu is not None and decode_step_unavailable() is None
