"""Units of data parallel training that need no process group.

``shard_bounds`` splits the global batch over the ranks; ``derive_seed`` keys the sampling
streams by prompt. torch.distributed is never initialised here (the multi-process runs are
in tests/test_distributed.py).
"""

from __future__ import annotations

import pytest
import torch
from comlrl.algos.models.gradient_sync import GradientSync
from comlrl.algos.models.ranks import rank_and_world, shard_bounds
from comlrl.algos.rollout.tree import derive_seed
from hypothesis import given, settings
from hypothesis import strategies as st

WORLD = st.integers(min_value=1, max_value=64)
PER_RANK = st.integers(min_value=1, max_value=64)
KEY = st.tuples(
    st.integers(min_value=0, max_value=2**31),  # run seed
    st.integers(min_value=0, max_value=10**6),  # step
    st.integers(min_value=0, max_value=4096),  # prompt's place in the global batch
)


def test_no_process_group_means_one_rank() -> None:
    assert rank_and_world() == (0, 1)


@settings(max_examples=200, deadline=None)
@given(world=WORLD, per=PER_RANK)
def test_shards_are_contiguous_disjoint_and_cover_the_batch(world: int, per: int) -> None:
    batch = world * per
    bounds = [shard_bounds(batch, r, world) for r in range(world)]
    assert bounds[0][0] == 0
    assert bounds[-1][1] == batch
    for (_, hi), (next_lo, _) in zip(bounds, bounds[1:], strict=False):
        assert hi == next_lo  # rank r+1 starts where rank r stops: no gap, no overlap
    assert all(hi - lo == per for lo, hi in bounds)  # every rank rolls out the same number
    covered = [i for lo, hi in bounds for i in range(lo, hi)]
    assert covered == list(range(batch))


@settings(max_examples=200, deadline=None)
@given(world=st.integers(min_value=2, max_value=64), per=PER_RANK, extra=st.integers(1, 63))
def test_a_batch_that_does_not_divide_by_the_ranks_is_refused(
    world: int, per: int, extra: int
) -> None:
    batch = world * per + 1 + extra % (world - 1)  # a remainder in [1, world - 1]
    assert batch % world
    with pytest.raises(
        ValueError, match=rf"batch_size={batch}.*{world} ranks.*multiple of {world}"
    ):
        shard_bounds(batch, 0, world)


@settings(max_examples=300, deadline=None)
@given(key=KEY, turn=st.integers(0, 8), node=st.integers(0, 64), agent=st.integers(0, 8))
def test_the_same_key_gives_the_same_seed_and_stream(
    key: tuple[int, int, int], turn: int, node: int, agent: int
) -> None:
    a = derive_seed(derive_seed(derive_seed(*key), turn, node), agent)
    b = derive_seed(derive_seed(derive_seed(*key), turn, node), agent)
    assert a == b
    assert 0 <= a < 2**63  # fits torch.Generator.manual_seed
    draws = [torch.rand(8, generator=torch.Generator().manual_seed(s)) for s in (a, b)]
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)  # same stream, bit for bit


@settings(max_examples=300, deadline=None)
@given(first=KEY, second=KEY)
def test_distinct_keys_give_distinct_seeds_and_streams(
    first: tuple[int, int, int], second: tuple[int, int, int]
) -> None:
    if first == second:
        return
    a, b = derive_seed(*first), derive_seed(*second)
    # 63-bit BLAKE2b digests: a collision among a few hundred keys has probability ~1e-14
    assert a != b
    draws = [torch.rand(8, generator=torch.Generator().manual_seed(s)) for s in (a, b)]
    assert not torch.equal(draws[0], draws[1])


def test_seed_parts_are_not_concatenated_ambiguously() -> None:
    # (1, 23) and (12, 3) would collide if the parts were joined without a separator
    assert derive_seed(1, 23) != derive_seed(12, 3)
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(5) != derive_seed(5, 0)


def test_gradient_sync_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="process group"):
        GradientSync(torch.nn.Linear(2, 2), "ddp")


def test_gradient_sync_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="data_parallel='zero3'.*'ddp', 'fsdp2', 'none'"):
        GradientSync(torch.nn.Linear(2, 2), "zero3")
