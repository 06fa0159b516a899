"""FlatRAdam's one-pass CPU step is bit for bit torch.optim.RAdam's single-tensor step.

Exact equality (``torch.equal``), no tolerance: both run the same float32 elementwise ops
in the same order on every element, only on one flat buffer instead of per tensor.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.flat_radam import FlatRAdam
from hypothesis import given, settings
from hypothesis import strategies as st

SHAPES = [(7,), (3, 5), (16, 8), (1,), (33,)]


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _set_grads(params: list[torch.nn.Parameter], gen: torch.Generator, skip: int = -1) -> None:
    for i, p in enumerate(params):
        scale = 10.0 ** float(torch.randint(-4, 1, (1,), generator=gen))
        g = torch.randn(p.shape, generator=gen) * scale
        p.grad = None if i == skip else g


def _assert_equal(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> None:
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y), float((x - y).abs().max().detach())


@settings(max_examples=20, deadline=None)
@given(
    lr=st.sampled_from([1e-3, 1e-2, 0.3]),
    weight_decay=st.sampled_from([0.0, 0.01]),
    decoupled=st.booleans(),
    betas=st.sampled_from([(0.9, 0.999), (0.5, 0.9)]),
    steps=st.integers(1, 12),
    seed=st.integers(0, 100),
)
def test_flat_steps_equal_torch_radam_bit_for_bit(
    lr: float,
    weight_decay: float,
    decoupled: bool,
    betas: tuple[float, float],
    steps: int,
    seed: int,
) -> None:
    kw = {"lr": lr, "betas": betas, "weight_decay": weight_decay}
    kw["decoupled_weight_decay"] = decoupled
    ours, theirs = _params(seed), _params(seed)
    opt_ours, opt_theirs = FlatRAdam(ours, **kw), torch.optim.RAdam(theirs, **kw)
    gen_a, gen_b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for _ in range(steps):
        _set_grads(ours, gen_a)
        _set_grads(theirs, gen_b)
        opt_ours.step()
        opt_theirs.step()
        _assert_equal(ours, theirs)
    for p, q in zip(ours, theirs, strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_ours.state[p][key], opt_theirs.state[q][key])


def test_the_rectified_phase_equals_torch_over_many_steps() -> None:
    """Past step 5 (beta2 = 0.999) RAdam switches to its adaptive, rectified step."""
    ours, theirs = _params(1), _params(1)
    opt_ours = FlatRAdam(ours, lr=1e-3, decoupled_weight_decay=True)
    opt_theirs = torch.optim.RAdam(theirs, lr=1e-3, decoupled_weight_decay=True)
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(200):
        _set_grads(ours, gen_a)
        _set_grads(theirs, gen_b)
        opt_ours.step()
        opt_theirs.step()
    _assert_equal(ours, theirs)


def test_state_dict_round_trips_with_torch_radam_both_ways() -> None:
    """The state dict has torch's format: a FlatRAdam checkpoint resumes in torch's RAdam
    and in a new FlatRAdam, and both continue exactly like an uninterrupted run."""
    ref, ours = _params(2), _params(2)
    opt_ref = torch.optim.RAdam(ref, lr=1e-2)
    opt_ours = FlatRAdam(ours, lr=1e-2)
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(8):
        _set_grads(ref, gen_a)
        _set_grads(ours, gen_b)
        opt_ref.step()
        opt_ours.step()
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in ours], "opt": opt_ours.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed_torch = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    resumed_flat = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt_t = torch.optim.RAdam(resumed_torch, lr=1e-2)
    opt_t.load_state_dict(copy.deepcopy(saved["opt"]))  # load_state_dict keeps the tensors
    opt_f = FlatRAdam(resumed_flat, lr=1e-2)
    opt_f.load_state_dict(copy.deepcopy(saved["opt"]))
    for _ in range(4):
        state = gen_a.get_state()
        _set_grads(ref, gen_a)
        for params in (resumed_torch, resumed_flat):
            gen_b.set_state(state)
            _set_grads(params, gen_b)
        opt_ref.step()
        opt_t.step()
        opt_f.step()
    _assert_equal(resumed_torch, ref)
    _assert_equal(resumed_flat, ref)


def test_a_parameter_without_gradient_is_skipped_as_torch_skips_it() -> None:
    """torch skips a parameter whose grad is None (its step count stays behind); the
    step counts then differ and FlatRAdam keeps taking torch's own step, exactly."""
    ours, theirs = _params(4), _params(4)
    opt_ours, opt_theirs = FlatRAdam(ours, lr=1e-2), torch.optim.RAdam(theirs, lr=1e-2)
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for i in range(9):
        skip = 2 if i == 3 else -1
        _set_grads(ours, gen_a, skip)
        _set_grads(theirs, gen_b, skip)
        opt_ours.step()
        opt_theirs.step()
        _assert_equal(ours, theirs)
    assert float(opt_ours.state[ours[2]]["step"]) == 8.0
    assert float(opt_ours.state[ours[0]]["step"]) == 9.0


def test_a_closure_takes_torchs_step_and_counts_once() -> None:
    ours, theirs = _params(6), _params(6)
    opt_ours, opt_theirs = FlatRAdam(ours, lr=1e-2), torch.optim.RAdam(theirs, lr=1e-2)
    gen_a, gen_b = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    for i in range(4):
        _set_grads(ours, gen_a)
        _set_grads(theirs, gen_b)
        if i == 2:
            assert opt_ours.step(lambda: 1.0) == 1.0
        else:
            opt_ours.step()
        opt_theirs.step()
        _assert_equal(ours, theirs)
    assert {float(opt_ours.state[p]["step"]) for p in ours} == {4.0}


def test_the_cpu_step_is_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built optimizer of ``optimizer="radam"`` is a FlatRAdam whose plain CPU step
    never runs torch's per-tensor step (the behaviour this adds)."""
    params = _params(0)
    opt = build_optimizer(params, "radam", lr=1e-3)
    assert isinstance(opt, FlatRAdam) and isinstance(opt, torch.optim.RAdam)
    calls: list[int] = []
    real = torch.optim.RAdam.step

    def counting(self, closure=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(self, closure)

    monkeypatch.setattr(torch.optim.RAdam, "step", counting)
    _set_grads(params, torch.Generator().manual_seed(0))
    opt.step()
    assert calls == []


def test_a_large_model_keeps_torchs_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above FLAT_MAX_ELEMENTS the flat temporaries would cost memory: torch's step."""
    from comlrl.algos.training.update import flat_radam

    monkeypatch.setattr(flat_radam, "FLAT_MAX_ELEMENTS", 10)
    ours, theirs = _params(9), _params(9)
    opt_ours, opt_theirs = FlatRAdam(ours, lr=1e-2), torch.optim.RAdam(theirs, lr=1e-2)
    gen_a, gen_b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    for _ in range(3):
        _set_grads(ours, gen_a)
        _set_grads(theirs, gen_b)
        opt_ours.step()
        opt_theirs.step()
    _assert_equal(ours, theirs)
    assert opt_ours._flat is None
