"""CoMLRL 1.4.3's iterative preference trainers (MADPOIter / MARLHFIter) in comlrl.trainers."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers import UnsupportedFieldError
from comlrl.trainers._iterative import (
    IterPair,
    PreferenceReplay,
    lambda_decay_weights,
    select_comparison_pairs,
)
from comlrl.trainers.preference import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterTrainer,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PROMPTS = ["Once upon a time", "The cat sat", "Lily had a red", "Tom went to the"]


# --- pair selection and replay (pure) -----------------------------------------------------
def test_pairs_compare_index_k_with_index_k_and_skip_ties() -> None:
    cur, cmp = [1.0, 0.0, 2.0, 5.0], [0.0, 0.0, 3.0, 1.0]
    got = select_comparison_pairs(cur, cmp, "all", None, random.Random(0))
    assert got == [
        (("current", 0), ("comparator", 0)),
        (("comparator", 2), ("current", 2)),
        (("current", 3), ("comparator", 3)),
    ]
    # comparator_reward: highest comparator reward first (3, 1, 0), then the limit
    got = select_comparison_pairs(cur, cmp, "comparator_reward", 2, random.Random(0))
    assert [w[1] for w, _ in got] == [2, 3]
    # reward_gap: largest |gap| first (4 at k=3, then 1, 1)
    assert select_comparison_pairs(cur, cmp, "reward_gap", 1, random.Random(0))[0][0] == (
        "current",
        3,
    )
    # a shorter comparator list compares only the first min(K, K') joint actions
    assert select_comparison_pairs(cur, cmp[:1], "all", None, random.Random(0)) == got[:0] + [
        (("current", 0), ("comparator", 0))
    ]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=8),
    st.lists(st.integers(-3, 3), min_size=1, max_size=8),
    st.sampled_from(["reward_gap", "all", "random", "comparator_reward"]),
    st.integers(1, 5),
)
def test_every_pair_prefers_the_higher_reward(
    cur: list[int], cmp: list[int], mode: str, limit: int
) -> None:
    sides = {"current": cur, "comparator": cmp}
    got = select_comparison_pairs(cur, cmp, mode, limit, random.Random(0))
    untied = sum(a != b for a, b in zip(cur, cmp, strict=False))
    assert len(got) == (untied if mode == "all" else min(limit, untied))
    for (ws, wk), (ls, lk) in got:
        assert wk == lk and ws != ls and sides[ws][wk] > sides[ls][lk]


def _pair(round_index: int, i: int) -> IterPair:
    return IterPair(round_index, {"i": i}, ("p",), ("c",), ("r",), ((1,),), ((2,),), ((3,),),
                    1.0, 0.0, "current", "comparator")  # fmt: skip


def _rounds(replay: PreferenceReplay, sizes: list[int]) -> list[list[IterPair]]:
    return [replay.add_and_select([_pair(r, i) for i in range(n)]) for r, n in enumerate(sizes)]


def test_replay_current_trains_on_this_rounds_pairs_only() -> None:
    out = _rounds(PreferenceReplay("current", None, None, None, random.Random(0)), [3, 2, 4])
    assert [sorted(p.round for p in o) for o in out] == [[0] * 3, [1] * 2, [2] * 4]


def test_replay_nearest_k_mixes_the_last_k_rounds() -> None:
    replay = PreferenceReplay("nearest_k", 2, None, 60, random.Random(0))
    out = _rounds(replay, [5, 5, 5, 5])
    assert {p.round for p in out[3]} == {2, 3} and len(out[3]) == 60
    # 60 draws over 2 rounds of 5 pairs: whole passes, so each pair of a round appears
    # at least 60 // 2 // 5 - (slack) times; the rounds split roughly evenly (binomial,
    # p = 1/2, n = 60: outside [15, 45] has probability < 1e-4; seeded anyway)
    counts = [sum(p.round == r for p in out[3]) for r in (2, 3)]
    assert 15 <= counts[0] <= 45 and sum(counts) == 60
    # default sample size: this round's pair count
    replay = PreferenceReplay("nearest_k", 3, None, None, random.Random(0))
    out = _rounds(replay, [4, 6, 2])
    assert len(out[2]) == 2 and {p.round for p in out[0]} == {0}


def test_replay_all_history_and_lambda_decay_weight_the_rounds() -> None:
    out = _rounds(PreferenceReplay("all_history", None, None, 300, random.Random(0)), [4, 4, 4])
    assert {p.round for p in out[2]} == {0, 1, 2}
    # lambda = 0: the newest round only; lambda = 1: uniform
    out = _rounds(PreferenceReplay("lambda_decay", None, 0.0, 50, random.Random(0)), [4, 4, 4])
    assert {p.round for p in out[2]} == {2}
    assert lambda_decay_weights(3, 1.0) == [1 / 3] * 3
    torch.testing.assert_close(  # exact arithmetic up to float64 rounding
        torch.tensor(lambda_decay_weights(3, 0.5), dtype=torch.float64),
        torch.tensor([0.125, 0.25, 0.5], dtype=torch.float64) / 0.875,
    )
    out = _rounds(PreferenceReplay("lambda_decay", None, 0.5, 700, random.Random(0)), [4, 4, 4])
    counts = [sum(p.round == r for p in out[2]) for r in range(3)]
    # expected 100, 200, 400 of 700; binomial sd <= 13, so +-60 is > 4.5 sd
    for got, want in zip(counts, [100, 200, 400], strict=True):
        assert abs(got - want) <= 60, counts


@pytest.mark.parametrize(
    ("mode", "k", "lam", "size"),
    [("current", None, None, None), ("nearest_k", 2, None, 7), ("all_history", None, None, None),
     ("lambda_decay", None, 0.5, 9)],
)  # fmt: skip
def test_replay_on_disk_draws_what_the_memory_replay_draws(
    mode: str, k: int | None, lam: float | None, size: int | None, tmp_path: Path
) -> None:
    sizes = [3, 0, 5, 2]
    memory = _rounds(PreferenceReplay(mode, k, lam, size, random.Random(4)), sizes)
    replay = PreferenceReplay(mode, k, lam, size, random.Random(4), shard_dir=tmp_path / "r")
    disk = _rounds(replay, sizes)
    assert disk == memory
    # only the files and counts stay in memory; each file holds its round's pairs
    assert [len(r) for r in replay.rounds] == sizes
    assert all(not isinstance(r, list) for r in replay.rounds)
    saved = json.loads((tmp_path / "r" / "iteration_0003.json").read_text())
    assert saved["iteration"] == 3 and saved["num_pairs"] == 5
    assert [p["example"] for p in saved["pairs"]] == [{"i": i} for i in range(5)]


def test_replay_on_disk_resumes_from_its_state_and_reports_a_lost_shard(tmp_path: Path) -> None:
    replay = PreferenceReplay("all_history", None, None, 6, random.Random(1), shard_dir=tmp_path)
    _rounds(replay, [2, 3])
    state = replay.state_dict()
    again = PreferenceReplay("all_history", None, None, 6, random.Random(9), shard_dir=tmp_path)
    again.load_state_dict(json.loads(json.dumps(state)))  # plain values survive JSON
    nxt = [_pair(2, i) for i in range(2)]
    assert again.add_and_select(nxt) == replay.add_and_select(nxt)
    (tmp_path / "iteration_0001.json").unlink()
    with pytest.raises(FileNotFoundError):
        for _ in range(20):  # some draw of 6 over 4 rounds picks round 1
            replay.add_and_select([_pair(9, 0)])


# --- config and unsupported settings ------------------------------------------------------
def test_iterative_config_normalises_aliases_and_checks_modes() -> None:
    cfg = MADPOIterConfig(preference_replay_mode="k", preference_replay_k=2,
                          comparator_policy="previous")  # fmt: skip
    assert (cfg.preference_replay_mode, cfg.comparator_policy) == ("nearest_k", "history")
    assert cfg.comparator_history_k == 1
    cfg = MARLHFIterConfig(preference_scoring_reward="learned", num_generations=2)
    assert cfg.preference_scoring_reward == "reward_model"
    for kwargs, field in (
        ({"num_iterations": 0}, "num_iterations"),
        ({"preference_replay_mode": "nearest_k"}, "preference_replay_k"),
        ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5},
         "preference_replay_lambda"),
        ({"preference_replay_sample_size": 4}, "preference_replay_sample_size"),
        ({"comparator_policy": "model"}, "comparator_model_name"),
        ({"comparator_history_k": 2}, "comparator_history_k"),
        ({"comparator_policy": "nobody"}, "comparator_policy"),
        ({"pair_selection": "best"}, "pair_selection"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            MADPOIterConfig(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (MADPOIterTrainer, {"comparator_generation_mode": "centralized"},
         "comparator_generation_mode"),
        (MADPOIterTrainer, {"comparator_devices": "cuda:1"}, "comparator_devices"),
        (MADPOIterTrainer, {"joint_mode": "cross"}, "joint_mode"),
        (MARLHFIterTrainer, {"comparator_generation_mode": "centralized"},
         "comparator_generation_mode"),
    ],
)  # fmt: skip
def test_unsupported_iterative_settings_fail_before_any_model_loads(
    cls: Any, kwargs: dict[str, Any], field: str
) -> None:
    config = MADPOIterConfig if cls is MADPOIterTrainer else MARLHFIterConfig
    with pytest.raises(UnsupportedFieldError, match=rf"\.{field}="):
        cls(
            agent_model="/nonexistent/model",  # loading it would raise OSError instead
            train_dataset=[{"prompt": "x"}],
            reward_func=lambda c1, c2: [0.0],
            args=config(**kwargs),
        )


# --- short runs on stories260k ------------------------------------------------------------
def _longer_second(c1: list[str], c2: list[str]) -> list[float]:
    # deterministic, and its ties (equal lengths) are rare with sampled text
    return [float(len(c2[0]) - len(c1[0]))]


def _assert_saved_equal(path: Path, model: Any) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path)
    for name, tensor in model.state_dict().items():  # a float32 round trip is exact
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)


def test_madpo_iter_rounds_replay_history_comparator_and_save(
    stories260k: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    trainer = MADPOIterTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=[{"prompt": p} for p in PROMPTS],
        reward_func=_longer_second,
        args=MADPOIterConfig(
            num_iterations=3, rollout_buffer_size=2, preference_num_candidates=3,
            preference_pairs_per_sample=2, max_new_tokens=8, agent_learning_rate=1e-3,
            comparator_policy="history", comparator_history_k=2,
            preference_replay_mode="nearest_k", preference_replay_k=2,
            policy_checkpoint_dir=str(tmp_path / "policies"),
        ),
    )  # fmt: skip
    initial = {k: v.clone() for k, v in trainer.agents[0].state_dict().items()}
    history = trainer.train()
    rounds = trainer.round_history
    assert [r["iter/current_iteration"] for r in rounds] == [1.0, 2.0, 3.0]
    for r in rounds:  # at most 2 pairs per prompt, 4 prompts
        assert 1 <= r["iter/current_preference_pairs"] <= 2 * len(PROMPTS)
        # nearest_k draws as many pairs as this round generated
        assert r["iter/train_preference_pairs"] == r["iter/current_preference_pairs"]
    # one DPO step per train_batch_size (2) training pairs, one pass per round
    want = sum(math.ceil(r["iter/train_preference_pairs"] / 2) for r in rounds)
    assert len(history) == want
    assert [h["iteration"] for h in history] == sorted(h["iteration"] for h in history)
    # reference-free, as 1.4.3 (log pi_ref = 0): the first step's margin is the policy's own
    # log-prob gap (with a frozen reference it would be exactly 0 and the loss log 2)
    assert history[0]["margin"] != 0.0 and math.isfinite(history[0]["loss"])
    # k = 2: rounds 0 and 1 compare with the initial policy (snapshot 0; round 0's is the
    # current policy itself), round 2 with the policy after round 0 (snapshot 1); no
    # snapshot outlives the last round that reads it
    assert trainer.rounds.comparator.used == [0, 0, 1]
    assert trainer.rounds.comparator.snapshots == {}
    # the policy checkpoints: initial and after each round, as 1.4.3 names them
    names = sorted(p.name for p in (tmp_path / "policies").iterdir())
    assert names == ["initial", "iteration_0000", "iteration_0001", "iteration_0002"]
    _assert_saved_equal(tmp_path / "policies" / "initial" / "agent_0", _as_model(initial))
    # round 2's comparator held exactly the weights written after round 0
    comparator = trainer.rounds.comparator.frozen[1].model
    _assert_saved_equal(tmp_path / "policies" / "iteration_0000" / "agent_1", comparator)
    paths = trainer.save_model(tmp_path / "out")
    assert [p.name for p in paths] == ["agent_0", "agent_1"]
    _assert_saved_equal(paths[0], trainer.agents[0])
    assert any(not torch.equal(initial[k], v) for k, v in trainer.agents[0].state_dict().items())


def _as_model(state: dict[str, torch.Tensor]) -> Any:
    class _State:
        def state_dict(self) -> dict[str, torch.Tensor]:
            return state

    return _State()


def test_marlhf_iter_refits_the_reward_model_each_round_then_runs_rl(
    stories260k: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    task_calls: list[int] = []

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        task_calls.append(1)
        return [float(len(c2[0]) > len(c1[0]))]

    from comlrl.utils import set_reward_range

    monkeypatch.chdir(tmp_path)  # reward_distributions/ goes to the working directory
    trainer = MARLHFIterTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=[{"prompt": p} for p in PROMPTS],
        reward_func=set_reward_range(reward, 0.0, 1.0),
        args=MARLHFIterConfig(
            num_iterations=2, num_train_epochs=1, rollout_buffer_size=4,
            preference_num_candidates=4, max_new_tokens=8, agent_learning_rate=1e-3,
            reward_learning_rate=1e-3, reward_train_batch_size=2, reward_model_device=None,
            num_generations=2, eval_interval=0, comparator_policy="model",
            comparator_model_name=stories260k, preference_replay_mode="all_history",
            log_reward_distribution=True,
        ),
    )  # fmt: skip
    before = {k: v.clone() for k, v in trainer.agents[0].state_dict().items()}
    history = trainer.train()
    rounds = trainer.round_history
    assert len(rounds) == 2
    # each round: 4 prompts x (4 current + 4 comparator) joint actions scored by the task
    # reward, nothing else (the RL stage is rewarded by the model)
    assert len(task_calls) == 2 * len(PROMPTS) * 8
    # one RL step per round (4 prompts, batch 4, 1 epoch), tagged with its round
    assert [h["iteration"] for h in history] == [1.0, 2.0]
    # the reward model is refitted every round that has pairs, 2 epochs in batches of 2
    per_round = [
        2 * math.ceil(r["iter/train_preference_pairs"] / 2)
        for r in rounds
        if r["iter/train_preference_pairs"]
    ]
    assert len(trainer.reward_model_history) == sum(per_round)
    # the learned reward is a real-valued score, the task reward a 0/1 indicator
    assert {history[-1]["reward_min"], history[-1]["reward_max"]} - {0.0, 1.0}
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[0].state_dict().items())
    # log_reward_distribution: each round's histogram over the task reward's 0/1 values
    for r in (1, 2):
        data = json.loads(
            (tmp_path / "reward_distributions" / f"iteration_{r:04d}.json").read_text()
        )
        counts = data["candidate"]["target"]["counts"]
        assert sum(counts) == len(PROMPTS) * 4 and counts[0] + counts[-1] == sum(counts)
    paths = trainer.save_model(tmp_path / "marlhf_iter")
    assert [p.name for p in paths] == ["agent_0", "agent_1"]
    _assert_saved_equal(paths[1], trainer.agents[1])


class _FakeRun:
    """A W&B run that keeps what is logged (no wandb import, no network)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, Any]]] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.rows.append((step, values))

    def finish(self) -> None:
        pass


class _Html:
    __module__ = "wandb"  # log_row passes wandb's media objects through

    def __init__(self, html: str) -> None:
        self.html = html


def test_log_reward_distribution_writes_each_rounds_histograms_and_charts(
    stories260k: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.4.3's ``log_reward_distribution=True``: per round a JSON file under
    ``<output_dir>/reward_distributions`` whose candidate counts cover every sampled joint
    action (4 prompts x 3 candidates per side) and whose selected counts cover both sides
    of each training pair, and W&B charts logged with the round's row."""
    import sys
    import xml.etree.ElementTree as ET
    from types import SimpleNamespace

    from comlrl.utils import set_reward_range

    run = _FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=lambda **_: run, Html=_Html))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_DISABLED", raising=False)

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        return [min(1.0, len(c2[0]) / 40)]

    args = MADPOIterConfig(
        num_iterations=2, rollout_buffer_size=2, preference_num_candidates=3,
        preference_pairs_per_sample=2, max_new_tokens=8, log_reward_distribution=True,
    )  # fmt: skip
    kwargs = {"agent_model": stories260k, "num_agents": 2, "args": args,
              "train_dataset": [{"prompt": p} for p in PROMPTS]}  # fmt: skip
    with pytest.raises(ValueError, match="reward_range"):
        MADPOIterTrainer(reward_func=reward, **kwargs)
    torch.manual_seed(0)
    trainer = MADPOIterTrainer(
        reward_func=set_reward_range(reward, 0.0, 1.0),
        wandb_config={"project": "p", "output_dir": str(tmp_path)},
        **kwargs,
    )
    trainer.train()
    folder = tmp_path / "reward_distributions"
    assert sorted(p.name for p in folder.iterdir()) == [
        "iteration_0001.json",
        "iteration_0002.json",
    ]
    for r, row in enumerate(trainer.round_history):
        data = json.loads((folder / f"iteration_{r + 1:04d}.json").read_text())
        assert (data["iteration"], data["num_bins"], len(data["bin_edges"])) == (r + 1, 16, 17)
        for side in ("target", "comparator"):
            assert sum(data["candidate"][side]["counts"]) == len(PROMPTS) * 3
        selected = sum(sum(data["selected"][s]["counts"]) for s in ("target", "comparator"))
        assert selected == 2 * row["iter/train_preference_pairs"]
    logged = [values for _, values in run.rows if "iter/current_iteration" in values]
    assert len(logged) == 2
    chart = logged[0]["iter/reward_distribution/iteration_0001/bar_plot"]
    svg = ET.fromstring(chart.html)[0]  # well-formed SVG in a <div>
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert logged[0]["iter/reward_distribution/target_sample_count"] == len(PROMPTS) * 3
    assert all(isinstance(v, float) for v in trainer.round_history[0].values())
