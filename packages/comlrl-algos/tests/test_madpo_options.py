"""MADPO's options that keep CoMLRL 1.4.3's MADPO: pairs built once from the initial policy
(``pair_source="initial"``, ``num_epochs``), a random choice of a prompt's pairs
(``pair_selection="random"``) and a reference-free loss (``reference_free``); each is a
field of :class:`MADPOConfig`, so ``comlrl train algo=madpo`` takes it too."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
from comlrl.algos.recipes.preference.madpo.initial_pairs import within_prompt_pairs
from comlrl.algos.recipes.preference.madpo.recipe import MADPORecipe
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.training.config.rl import ConfigError
from hypothesis import given, settings
from hypothesis import strategies as st

EXAMPLES = [{"topic": t} for t in ("A fox", "A ship", "A bell", "A cat", "A map")]


def _reward(first: Sequence[str], second: Sequence[str], **_: Any) -> list[float]:
    """Longer joint answers score higher (distinct for most sampled texts)."""
    return [float(len(a) + 0.5 * len(b)) for a, b in zip(first, second)]


def _run(tiny_tokenizer: Any, **fields: Any) -> Any:
    from comlrl.algos.models.loading import build_default_model

    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}",
                prompt_format="raw")
        for i in range(2)
    ]  # fmt: skip
    env = CallbackEnvironment([lambda ex: ex["topic"], lambda ex: ex["topic"] + " then"], _reward)
    base = dict(num_candidates=3, max_new_tokens=6, batch_size=2, learning_rate=1e-3,
                optimizer="sgd", device="cpu", seed=1, pairs_per_prompt=2)  # fmt: skip
    return MADPORecipe(agents, MADPOConfig(**{**base, **fields}), environment=env, dataset=EXAMPLES)


def _count_rollouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the rollouts MADPO's steps sample."""
    from comlrl.algos.recipes.preference.madpo import recipe

    calls = [0]
    original = recipe.rollout

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(recipe, "rollout", counted)
    return calls


def test_initial_pairs_are_built_once_and_every_pass_trains_on_each_once(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tiny_tokenizer, pair_source="initial", num_epochs=2)
    pairs = list(run.pairs)
    assert pairs and all(p.chosen_reward > p.rejected_reward for p in pairs)
    # 5 prompts, at most 2 pairs each; steps: 2 passes of ceil(P / 2)
    assert len(pairs) <= 10 and {p.example["topic"] for p in pairs} <= {
        e["topic"] for e in EXAMPLES
    }
    assert run.config.num_steps == 2 * math.ceil(len(pairs) / 2)
    calls = _count_rollouts(monkeypatch)
    trained = 0
    for _ in range(math.ceil(len(pairs) / 2)):  # the first pass
        row = run.step().row
        trained += int(row["num_pairs"])
        assert "margin" in row and "loss/agent_1" in row
    assert calls[0] == 0  # no sampling after setup
    assert trained >= len(pairs) and run.data.epoch == 1  # each pair once in pass 1
    assert run.pairs == pairs


def test_online_pairs_sample_every_step(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tiny_tokenizer)
    assert run.pairs is None
    calls = _count_rollouts(monkeypatch)
    run.step()
    run.step()
    assert calls[0] == 2  # one rollout per step


def test_initial_pairs_resume_exactly(tiny_tokenizer: Any, tmp_path: Path) -> None:
    fields = dict(pair_source="initial", num_epochs=2)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    whole = _run(tiny_tokenizer, **fields, output_dir=a, save_every=1, progress=False).train()
    ckpt = tmp_path / "a" / "checkpoints" / "step-000002"
    resumed = _run(tiny_tokenizer, **fields, output_dir=b, progress=False)  # same pairs
    resumed.resume(ckpt)
    rest = resumed.train()
    assert [r["step"] for r in rest] == [r["step"] for r in whole][2:]
    for got, want in zip(rest, whole[2:]):
        # same float32 ops from bit-identical state (see tests/test_cli_recipes.py)
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)


def test_reference_free_loss_has_a_margin_before_training(tiny_tokenizer: Any) -> None:
    # against the initial policy the first step's margin is exactly 0; with log pi_ref = 0
    # it is the policy's own log-ratio margin, not 0
    ref = _run(tiny_tokenizer, pair_source="initial").step().row
    free_run = _run(tiny_tokenizer, pair_source="initial", reference_free=True)
    assert free_run.ref_models == [None, None]
    free = free_run.step().row
    assert ref["margin"] == 0.0
    assert abs(free["margin"]) > 1e-3


def test_option_combinations_that_mean_nothing_fail() -> None:
    with pytest.raises(ValueError, match="num_epochs"):
        MADPOConfig(num_epochs=2)
    with pytest.raises(ValueError, match="pair_source"):
        MADPOConfig(pair_source="initial", iterative={})
    config = MADPOConfig(iterative={})
    assert config.iterative is not None and config.iterative.pair_selection == "comparator_reward"


def test_reference_free_refuses_reference_models(tiny_tokenizer: Any) -> None:
    from comlrl.algos.models.loading import build_default_model

    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    env = CallbackEnvironment([lambda ex: ex["topic"]] * 2, _reward)
    with pytest.raises(ConfigError, match="reference_free"):
        MADPORecipe(
            agents,
            MADPOConfig(reference_free=True),
            environment=env,
            dataset=EXAMPLES,
            ref_models=[None] * 2,
        )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=2, max_size=6),
    st.integers(1, 6),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.integers(0, 10),
)
def test_within_prompt_pairs_keep_untied_pairs_above_the_gap(
    rewards: list[int], limit: int, min_gap: float, seed: int
) -> None:
    valid = {
        (w, lo) for w in range(len(rewards)) for lo in range(len(rewards))
        if rewards[w] > rewards[lo] and rewards[w] - rewards[lo] >= min_gap
    }  # fmt: skip
    gap = within_prompt_pairs(rewards, selection="reward_gap", limit=limit, min_gap=min_gap,
                              rng=random.Random(seed))  # fmt: skip
    rnd = within_prompt_pairs(rewards, selection="random", limit=limit, min_gap=min_gap,
                              rng=random.Random(seed))  # fmt: skip
    assert len(gap) == len(rnd) == min(limit, len(valid))
    assert set(gap) <= valid and set(rnd) <= valid and len(set(rnd)) == len(rnd)
    gaps = sorted((rewards[w] - rewards[lo] for w, lo in valid), reverse=True)
    assert [rewards[w] - rewards[lo] for w, lo in gap] == gaps[:limit]  # the largest gaps


def test_random_selection_draws_other_pairs_than_the_largest_gaps() -> None:
    rewards = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # 15 pairs, 1 kept
    picks = {
        within_prompt_pairs(rewards, selection="random", limit=1, min_gap=0.0,
                            rng=random.Random(s))[0]
        for s in range(20)
    }  # fmt: skip
    assert len(picks) > 1 and (5, 0) in within_prompt_pairs(
        rewards, selection="reward_gap", limit=1, min_gap=0.0, rng=random.Random(0)
    )
