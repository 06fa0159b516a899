"""The iterative recipes' state survives a step checkpoint: pairs, replay, comparator
snapshots and the round in progress come back from ``torch.load(weights_only=True)``
equal, and a resumed replay draws what the saved one would have. (The whole-run check,
a stopped and resumed ``comlrl train algo=madpo_iter|marlhf_iter`` equal to an
uninterrupted one, is in ``tests/test_cli_iterative_centralized.py``.)"""

from __future__ import annotations

import io
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.recipe import (
    MADPOIterRecipe,
    MARLHFIterRecipe,
    RoundState,
)
from comlrl.algos.recipes.preference.iterative.replay import REPLAY_MODES, PreferenceReplay
from comlrl.algos.recipes.preference.pairs import IterPair
from comlrl.algos.training.run import checkpoint as ckpt
from hypothesis import given, settings
from hypothesis import strategies as st


def _through_a_checkpoint(state: Any) -> Any:
    """``state`` saved and read back as a step checkpoint's ``training_state.pt`` is."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _pair(round_index: int, i: int) -> IterPair:
    return IterPair(
        round=round_index,
        example={"prompt": f"story {i}", "id": i, "tags": ["a", "b"]},
        prompts=("p0", "p1"),
        chosen=(f"c{i}", "c"),
        rejected=("r", f"r{i}"),
        prompt_ids=((1, 2, 3), (4,)),
        chosen_ids=((5, i), (6,)),
        rejected_ids=((7,), (8, 9)),
        chosen_reward=1.0 + i,
        rejected_reward=-0.5,
        chosen_source="current",
        rejected_source="comparator",
    )


def test_a_pair_and_a_round_in_progress_come_back_equal() -> None:
    pair = _pair(2, 7)
    assert IterPair.from_state(_through_a_checkpoint(pair.to_state())) == pair
    round_state = RoundState({"iter/current_iteration": 3.0}, [[pair], [], [_pair(2, 8)]])
    back = RoundState.from_state(_through_a_checkpoint(round_state.state_dict()))
    assert back == round_state


def _replay(mode: str, seed: int) -> PreferenceReplay:
    k = 2 if mode == "nearest_k" else None
    lam = 0.6 if mode == "lambda_decay" else None
    return PreferenceReplay(mode, k, lam, 5 if mode != "current" else None, random.Random(seed))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(REPLAY_MODES),
    st.lists(st.integers(0, 4), min_size=1, max_size=5),
    st.integers(0, 4),
    st.integers(0, 2**16),
)
def test_a_resumed_replay_draws_what_the_saved_one_would_have(
    mode: str, sizes: list[int], next_size: int, seed: int
) -> None:
    saved = _replay(mode, seed)
    for r, size in enumerate(sizes):
        saved.add_and_select([_pair(r, i) for i in range(size)])
    resumed = _replay(mode, seed + 1)  # another stream: the state must replace it
    resumed.load_state_dict(_through_a_checkpoint(saved.state_dict()))
    following = [_pair(len(sizes), i) for i in range(next_size)]
    assert resumed.add_and_select(following) == saved.add_and_select(following)
    assert resumed.rounds == saved.rounds


def _agent(value: float) -> Any:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return SimpleNamespace(model=model, tokenizer=None)


def test_history_snapshots_come_back_from_a_checkpoint() -> None:
    agents = [_agent(0.0)]
    cmp = Comparator("history", agents, history_k=2, num_rounds=4)
    cmp.start()
    for r in range(2):
        with torch.no_grad():
            agents[0].model.weight.fill_(float(r + 1))
        cmp.finish_round(r)
    cmp.used = [0, 1]
    resumed = Comparator("history", [_agent(9.0)], history_k=2, num_rounds=4)
    resumed.load_state_dict(_through_a_checkpoint(cmp.state_dict()))
    assert sorted(resumed.snapshots) == sorted(cmp.snapshots) == [1, 2]
    for i in cmp.snapshots:
        torch.testing.assert_close(
            resumed.snapshots[i][0]["weight"], cmp.snapshots[i][0]["weight"], atol=0, rtol=0
        )
    assert resumed.used == [0, 1] and resumed.frozen is None


def test_a_comparator_without_frozen_agents_refuses_saved_frozen_streams() -> None:
    state = Comparator("current", [_agent(0.0)]).state_dict()
    state["frozen_generators"] = [torch.Generator().get_state()]
    with pytest.raises(ValueError, match="1 frozen agents; this run's comparator \\('current'"):
        Comparator("current", [_agent(0.0)]).load_state_dict(state)


@pytest.mark.parametrize(
    ("resume", "written_by", "wanted"),
    [
        (MADPOIterRecipe, None, "madpo_iter"),
        (MADPOIterRecipe, "marlhf_iter", "madpo_iter"),
        (MARLHFIterRecipe, "madpo_iter", "marlhf_iter"),
    ],
)
def test_an_iterative_resume_refuses_another_recipes_checkpoint(
    tmp_path: Path, resume: Any, written_by: str | None, wanted: str
) -> None:
    state: dict[str, Any] = {"format": ckpt.FORMAT, "step": 2}
    if written_by is not None:
        state[ckpt.RECIPE_STATE] = {"recipe": written_by}
    torch.save(state, tmp_path / ckpt.STATE_FILE)
    # refused before the run is touched (no run is needed to see it)
    with pytest.raises(ckpt.CheckpointError, match=f"holds no {wanted} rounds"):
        resume.resume(SimpleNamespace(algo=resume.algo), tmp_path)
