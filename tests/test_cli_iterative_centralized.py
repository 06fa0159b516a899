"""``comlrl train algo=centralized_magrpo | centralized_madpo | madpo_iter | marlhf_iter |
centralized_madpo_iter | centralized_marlhf_iter``: the recipes that were
only reachable through ``comlrl.trainers`` run end to end from the command line (a few
steps of the built-in stories260k, in-process) and write the loop driver's outputs."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from test_cli_recipes import (  # noqa: E402  (the shared run checks)
    STORY,
    _assert_same_outputs,
    _assert_same_rows,
    _check_final,
    _interrupted_and_resumed,
)


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_centralized_magrpo_trains_one_joint_policy_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "central"
    argv = ["train", "algo=centralized_magrpo", "num_steps=3", "progress=false", *STORY]
    argv += ["batch_size=2", "log_samples=2", "save_every=1", "eval_every=2", "eval_limit=2"]
    assert main([*argv, f"output_dir={out}"]) == 0
    cap = capsys.readouterr()
    assert "1 policy for 2 roles (builtin:stories260k) on coop_story (4 examples), " in cap.err
    assert "centralized MAGRPO (one joint policy, sentences role format)" in cap.err
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # one trained policy, and the sentence split gives the story reward something to score
    assert "completion_len_mean/agent_0" in rows[0] and "completion_len_mean/agent_1" not in rows[0]
    assert max(r["reward_max"] for r in rows) > 0.0
    _check_final(out, 1)
    assert not (out / "final" / "agent_1").exists()
    assert [r["step"] for r in _rows(out / "eval.jsonl")] == [2]
    sample = _rows(out / "samples.jsonl")[0]
    assert len(sample["prompts"]) == 1 and "In the end," in sample["prompts"][0]
    assert (out / "config.yaml").read_text().startswith("algo: centralized_magrpo\n")
    run = tmp_path / "central-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3)
    _assert_same_outputs(run, out)


def test_centralized_magrpo_checks_its_keys_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "algo=centralized_magrpo", f"output_dir={tmp_path / 'x'}"]
    assert main([*base, "models=[a,b]"]) == 2
    assert "trains one joint policy but models lists 2" in capsys.readouterr().err
    assert main([*base, "role_format=xml"]) == 2
    assert "role_format" in capsys.readouterr().err
    assert main([*base, "estimator=rloo"]) == 2
    assert "fixes estimator='grpo'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_centralized_madpo_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "central_madpo"
    argv = ["train", "algo=centralized_madpo", "num_steps=3", "progress=false", *STORY]
    argv += ["batch_size=2", "save_every=1", "eval_split=test", "eval_limit=2", "eval_every=2"]
    assert main([*argv, f"output_dir={out}"]) == 0
    capsys.readouterr()
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2, 3]
    _check_final(out, 1)
    run = tmp_path / "central-madpo-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3)
    _assert_same_outputs(run, out)


def test_madpo_iter_runs_rounds_against_the_history_comparator_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "madpo_iter"
    argv = ["train", "algo=madpo_iter", "num_steps=4", "steps_per_round=2", "progress=false"]
    argv += [*STORY, "batch_size=2", "eval_split=test", "eval_limit=2", "eval_every=2"]
    argv += ["comparator=history", "comparator_history_k=2", "replay_mode=all_history"]
    assert main([*argv, f"output_dir={out}"]) == 0
    assert "MADPO-Iter against the history comparator, 2 rounds of 2 steps" in (
        capsys.readouterr().err
    )
    rows = _rows(out / "metrics.jsonl")
    assert [(r["step"], r["iteration"]) for r in rows] == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    # each round's training pairs are spread over its two steps (one shuffled pass)
    for first, second in (rows[:2], rows[2:]):
        assert first["num_pairs"] + second["num_pairs"] == first["iter/train_preference_pairs"]
    # all_history: round 2's pool holds both rounds' pairs
    assert rows[2]["iter/total_preference_pairs"] == (
        rows[0]["iter/current_preference_pairs"] + rows[2]["iter/current_preference_pairs"]
    )
    assert any("loss" in r for r in rows)
    evals = _rows(out / "eval.jsonl")
    assert [r["step"] for r in evals] == [0, 2, 4] and evals[0]["eval/margin"] == 0.0
    _check_final(out, 2)
    assert (out / "config.yaml").read_text().startswith("algo: madpo_iter\n")
    # stopped in the middle of round 2 (its comparator: the frozen initial policy; the
    # replay: both rounds; one of its two chunks of pairs left), resumed: the same run
    run = tmp_path / "madpo_iter-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 4, step=3)
    _assert_same_outputs(run, out)


def test_marlhf_iter_refits_the_reward_model_each_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "marlhf_iter"
    argv = ["train", "algo=marlhf_iter", "num_steps=2", "steps_per_round=1", "progress=false"]
    argv += [*STORY, "batch_size=2", "num_generations=2", "num_candidates=2", "eval_every=2"]
    argv += ["eval_limit=2", "comparator=model", "comparator_models=[builtin:stories260k]"]
    argv += ["scoring_reward=reward_model", "reward.num_epochs=1", "parallel_agents=false"]
    assert main([*argv, f"output_dir={out}"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: 2 steps")
    rows = _rows(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1.0, 2.0]
    # round 1 orders its pairs by the task reward (in [0, 1]), round 2 by round 1's reward
    # model, whose head starts at zero and moved by one small step: scores near 0
    assert rows[0]["iter/comparator_reward_mean"] > 0.05
    assert abs(rows[1]["iter/comparator_reward_mean"]) < 0.05
    # one fit per round (one epoch of one batch of <= 4 pairs)
    fits = _rows(out / "reward_model_metrics.jsonl")
    assert [f["iteration"] for f in fits] == [1.0, 2.0]
    assert (out / "final" / "reward_model" / "head.safetensors").is_file()
    # evaluation keeps the task reward
    assert [r["step"] for r in _rows(out / "eval.jsonl")] == [0, 2]
    _check_final(out, 2)


def test_marlhf_iter_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["train", "algo=marlhf_iter", "num_steps=3", "steps_per_round=1", "progress=false"]
    argv += [*STORY, "batch_size=2", "num_generations=2", "num_candidates=2"]
    argv += ["eval_every=0", "comparator=history", "comparator_history_k=2", "log_samples=2"]
    argv += ["replay_mode=lambda_decay", "replay_lambda=0.5", "scoring_reward=reward_model"]
    argv += ["reward.num_epochs=1", "reward.max_length=96", "parallel_agents=false"]
    out = tmp_path / "marlhf_iter"
    assert main([*argv, f"output_dir={out}"]) == 0
    capsys.readouterr()
    assert [r["iteration"] for r in _rows(out / "metrics.jsonl")] == [1.0, 2.0, 3.0]
    # stopped after round 2: round 3 orders its pairs with round 2's reward model, draws
    # from the replay of rounds 1-2, and samples the comparator (round 2's snapshot) on
    # the frozen agents' streams, all of which must come back from the checkpoint
    run = tmp_path / "marlhf_iter-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3, step=2)
    _assert_same_outputs(run, out)
    name = "reward_model_metrics.jsonl"
    assert [r["iteration"] for r in _rows(run / name)] == [1.0, 2.0, 3.0]
    _assert_same_rows(run / name, out / name)


def test_iterative_recipes_check_their_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "algo=madpo_iter", f"output_dir={tmp_path / 'x'}"]
    for extra, message in [
        (["replay_mode=nearest_k"], "replay_mode='nearest_k' needs replay_k"),
        (["comparator=model"], "comparator='model' needs comparator_models"),
        (["comparator=api"], "comparator='api' needs comparator_api_url"),
        (["comparator_api_url=http://x"], "comparator='api' needs comparator_api_url"),
        (["comparator_history_k=3"], "needs comparator='history'"),
        (["joint_mode=cross"], "set joint_mode=align"),
        (["num_collect_batches=2"], "unknown key"),
    ]:
        assert main([*base, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert main(["train", "algo=marlhf_iter", "scoring_reward=oracle"]) == 2
    assert "scoring_reward" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# the task runs of algo=centralized_madpo / centralized_marlhf need comlrl-envs' coop_story,
# so they live here rather than in comlrl-algos' own tests
def test_centralized_madpo_trains_one_joint_policy_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "central_madpo"
    argv = ["train", "algo=centralized_madpo", "num_steps=3", "progress=false"]
    argv += ["task.kwargs.limit=4", "max_new_tokens=24", "batch_size=2", f"output_dir={out}"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 policy for 2 roles (builtin:stories260k) on coop_story (4 examples)" in err
    assert "centralized MADPO (one joint policy, sentences role format)" in err
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # pairs of joint responses were found and the policy took DPO steps on them
    stepped = [r for r in rows if r["num_pairs"] > 0]
    assert stepped and all(r["grad_norm/agent_0"] > 0 for r in stepped)
    assert "loss/agent_1" not in stepped[0]
    assert (out / "final" / "agent_0").is_dir() and not (out / "final" / "agent_1").exists()
    assert (out / "config.yaml").read_text().startswith("algo: centralized_madpo\n")


def test_centralized_marlhf_fits_a_reward_model_then_trains_one_joint_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "central_marlhf"
    argv = ["train", "algo=centralized_marlhf", "num_steps=2", "progress=false"]
    argv += ["task.kwargs.limit=4", "max_new_tokens=24", "batch_size=2", "num_generations=2"]
    argv += ["num_candidates=3", "num_collect_batches=2", "reward.num_epochs=2"]
    argv += ["parallel_agents=false", f"output_dir={out}"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 policy for 2 roles (builtin:stories260k) on coop_story (4 examples), MARLHF" in err
    fit = _rows(out / "reward_model_metrics.jsonl")
    assert fit and all(r["grad_norm"] > 0 for r in fit)  # the reward model was fit on pairs
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert "completion_len_mean/agent_0" in rows[0] and "completion_len_mean/agent_1" not in rows[0]
    assert (out / "final" / "reward_model" / "head.safetensors").is_file()
    assert (out / "final" / "agent_0").is_dir() and not (out / "final" / "agent_1").exists()
    assert (out / "config.yaml").read_text().startswith("algo: centralized_marlhf\n")


class _StoryComparator(BaseHTTPRequestHandler):
    """A served comparator: every joint prompt gets the same two-sentence story."""

    prompts: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).prompts.append(body["prompt"])
        story = "Tom saw a big dog. The dog was happy and they played in the park."
        reply = json.dumps({"completions": [story] * int(body["num_return_sequences"])})
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_centralized_madpo_iter_runs_rounds_against_an_http_comparator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _StoryComparator.prompts = []
    httpd = HTTPServer(("127.0.0.1", 0), _StoryComparator)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/complete"
    out = tmp_path / "central_madpo_iter"
    argv = ["train", "algo=centralized_madpo_iter", "num_steps=2", "steps_per_round=1"]
    argv += ["task.kwargs.limit=4", "max_new_tokens=24", "batch_size=2", "progress=false"]
    argv += ["comparator=api", f"comparator_api_url={url}", f"replay_dir={tmp_path / 'replay'}"]
    try:
        assert main([*argv, f"output_dir={out}"]) == 0
    finally:
        httpd.shutdown()
        thread.join()
    assert "1 policy for 2 roles (builtin:stories260k) on coop_story" in capsys.readouterr().err
    # two rounds of two prompts: the served comparator saw the joint prompts
    assert len(_StoryComparator.prompts) == 4 and all(_StoryComparator.prompts)
    rows = _rows(out / "metrics.jsonl")
    assert [(r["step"], r["iteration"]) for r in rows] == [(1, 1.0), (2, 2.0)]
    for n, row in enumerate(rows, start=1):
        shard = json.loads((tmp_path / "replay" / f"iteration_{n:04d}.json").read_text())
        assert shard["num_pairs"] == row["iter/current_preference_pairs"]
        for pair in shard["pairs"]:  # one joint actor: one prompt, one response a side
            assert len(pair["prompts"]) == len(pair["chosen"]) == 1
            assert pair["prompts"][0] in _StoryComparator.prompts
    assert (out / "final" / "agent_0").is_dir() and not (out / "final" / "agent_1").exists()
    assert (out / "config.yaml").read_text().startswith("algo: centralized_madpo_iter\n")


def test_centralized_marlhf_iter_refits_its_reward_model_each_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "central_marlhf_iter"
    argv = ["train", "algo=centralized_marlhf_iter", "num_steps=2", "steps_per_round=1"]
    argv += ["task.kwargs.limit=4", "max_new_tokens=24", "batch_size=2", "num_generations=2"]
    argv += ["num_candidates=3", "reward.num_epochs=1", "parallel_agents=false"]
    argv += ["eval_every=0", "progress=false", f"output_dir={out}"]
    assert main(argv) == 0
    assert "1 policy for 2 roles (builtin:stories260k)" in capsys.readouterr().err
    rows = _rows(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1.0, 2.0]
    assert "completion_len_mean/agent_0" in rows[0] and "completion_len_mean/agent_1" not in rows[0]
    fits = _rows(out / "reward_model_metrics.jsonl")
    assert sorted({f["iteration"] for f in fits}) == [1.0, 2.0]
    assert (out / "final" / "reward_model" / "head.safetensors").is_file()
    assert (out / "config.yaml").read_text().startswith("algo: centralized_marlhf_iter\n")
