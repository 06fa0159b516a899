"""Claims of the docs about the update's numerics, checked against the code (issue 31, N4)."""

from __future__ import annotations

from pathlib import Path

import torch
from comlrl.algos.rollout.sampling.draw import filtered_scores
from comlrl.core import SamplingParams
from comlrl.kernels import token_logprobs

ROOT = Path(__file__).resolve().parents[1]


def test_real_models_page_says_the_update_uses_the_full_tempered_softmax() -> None:
    """N4: the page said the update uses the truncated (top-p/top-k) distribution; it uses
    ``log_softmax(logits / T)`` over the whole vocabulary, which this test computes."""
    text = " ".join((ROOT / "docs" / "real-models.md").read_text().split())
    assert "truncated distribution the update uses" not in text
    assert "The update optimises the full tempered softmax" in text

    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.7, top_p=0.5, top_k=4)
    tokens = filtered_scores(logits, params).argmax(-1)
    full = torch.log_softmax(logits / 0.7, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    truncated = filtered_scores(logits, params).log_softmax(-1).gather(1, tokens[:, None])
    got = token_logprobs(logits, tokens, temperature=0.7)
    # the update's log-prob (the kernel) is the full softmax's: fp32 round-off only
    torch.testing.assert_close(got, full, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, truncated.squeeze(1))
