"""The preference recipes' optimizer step reports the gradient norm with or without clipping."""

from __future__ import annotations

import math

import pytest
import torch
from comlrl.algos.recipes.preference.encoding import clipped_optimizer_step


@pytest.mark.parametrize("max_grad_norm", [None, 0.5, 1e6])
def test_step_reports_the_pre_clip_gradient_norm(max_grad_norm: float | None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    model(torch.randn(5, 4)).pow(2).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    expected = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    norm = clipped_optimizer_step(model, optimizer, max_grad_norm)

    # float32 sums of ~15 squares: relative error well under 1e-6
    assert norm == pytest.approx(expected, rel=1e-6)
    scale = 1.0 if max_grad_norm is None else min(1.0, max_grad_norm / (expected + 1e-6))
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - scale * g, rtol=1e-5, atol=1e-6)
