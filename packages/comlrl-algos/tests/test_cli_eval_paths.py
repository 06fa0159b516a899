"""Where ``comlrl eval`` writes ``eval.jsonl`` (:func:`comlrl.algos.cli.eval.default_output_dir`)."""

from __future__ import annotations

from pathlib import Path

from comlrl.algos.cli.eval import default_output_dir


def test_a_checkpoint_of_a_run_is_evaluated_into_the_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "x"
    (run / "final" / "agent_0").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    out = default_output_dir(run / "final" / "agent_0", run / "config.yaml")
    assert out == run / "evals" / "final"


def test_a_model_outside_a_run_is_never_written_beside(tmp_path: Path) -> None:
    """A shared or downloaded model folder may be a read-only cache: before, a ``.gguf``
    file's evaluation went to ``<its folder>/eval``."""
    gguf = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default_output_dir(gguf, None) == Path("runs/eval/SmolLM2-135M-Instruct.Q4_1")
    assert default_output_dir(tmp_path / "qwen", None) == Path("runs/eval/qwen")
    assert default_output_dir("builtin:stories260k", None) == Path("runs/eval/builtin-stories260k")
    for model in (gguf, tmp_path / "qwen"):
        assert tmp_path not in (Path.cwd() / default_output_dir(model, None)).parents
