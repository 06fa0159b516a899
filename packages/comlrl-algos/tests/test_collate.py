"""pack_token_rows: left-padded prompts shared by G completions, right-padded completions."""

from __future__ import annotations

import pytest
import torch
from comlrl.algos.rollout.sampling.collate import pack_token_rows
from hypothesis import given, settings
from hypothesis import strategies as st

PAD = 0
tokens = st.lists(st.integers(1, 50), max_size=6)


def _reference(
    prompts: list[list[int]], comps: list[list[int]], g: int
) -> tuple[torch.Tensor, ...]:
    """The row-by-row layout the preference recipes built before (a plain loop)."""
    s = max((len(p) for p in prompts), default=0)
    length = max(1, max((len(c) for c in comps), default=0))
    ids = torch.full((len(comps), s + length), PAD, dtype=torch.int64)
    attn = torch.zeros_like(ids)
    for row, c in enumerate(comps):
        p = prompts[row // g]
        ids[row, s - len(p) : s] = torch.tensor(p, dtype=torch.int64)
        ids[row, s : s + len(c)] = torch.tensor(c, dtype=torch.int64)
        attn[row, s - len(p) : s + len(c)] = 1
    return ids, attn, attn[:, s:].bool()


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 4), g=st.integers(1, 3))
def test_pack_token_rows_matches_the_row_by_row_layout(data: st.DataObject, n: int, g: int) -> None:
    prompts = [data.draw(tokens) for _ in range(n)]
    comps = [data.draw(tokens) for _ in range(n * g)]
    batch = pack_token_rows(prompts, comps, group_size=g, pad_token_id=PAD)
    ids, attn, mask = _reference(prompts, comps, g)
    assert torch.equal(batch.input_ids, ids)
    assert torch.equal(batch.attention_mask, attn)
    assert torch.equal(batch.completion_mask, mask)
    assert batch.group_size == g and not batch.behaviour_logprobs.any()


def test_pack_token_rows_checks_the_row_count() -> None:
    with pytest.raises(ValueError, match="3 completions for 2 prompts x group_size=2"):
        pack_token_rows([[1], [2]], [[3], [4], [5]], group_size=2, pad_token_id=PAD)
