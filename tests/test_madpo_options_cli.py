"""``comlrl train algo=madpo`` takes the MADPO options that keep CoMLRL 1.4.3's behaviour
(``pair_source=initial``, ``num_epochs``, ``reference_free``, ``pair_selection``) on a task
of comlrl-envs (``coop_story``, the default task): a cross-package test."""

from __future__ import annotations

import json
from pathlib import Path

from comlrl.algos.cli.main import main


def test_the_cli_takes_the_options(tmp_path: Path) -> None:
    out = tmp_path / "madpo"
    argv = ["train", "algo=madpo", "progress=false", "task.kwargs.limit=4", "max_new_tokens=8"]
    argv += ["batch_size=2", "pair_source=initial", "num_epochs=1", "reference_free=true"]
    argv += ["pair_selection=random", "pairs_per_prompt=1", f"output_dir={out}"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    saved = (out / "config.yaml").read_text()
    assert "pair_source: initial" in saved and "reference_free: true" in saved
    # one pass over at most 4 pairs (4 prompts, 1 pair each), 2 per step
    assert 1 <= len(rows) <= 2 and sum(r["num_pairs"] for r in rows) <= 4
