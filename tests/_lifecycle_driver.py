"""``comlrl train`` with a pause point, so a test can signal the run at a chosen place.

Usage: ``python _lifecycle_driver.py WHERE STEP -- [comlrl train arguments]``. The driver runs
the real ``comlrl`` entry point (:func:`comlrl.algos.cli.main.main`) with one function wrapped so
that, at the chosen place, it prints ``PAUSED <where> <step>`` and waits for a line on
stdin. The test then sends SIGKILL or SIGINT (and, for SIGINT, a line to let it go on).
No sleeps or timings: the place is fixed by the pause, not by a clock.

``WHERE``:

- ``after_checkpoint``: right after the checkpoint of step ``STEP`` was written;
- ``mid_step``: in step ``STEP + 1``, after its rollout, before the first agent's update;
- ``mid_checkpoint``: while writing the checkpoint of step ``STEP + 1``, after the agents'
  weights, before the training state (a half-written temporary folder exists);
- ``after_metrics``: after step ``STEP + 1``'s metrics row, before its checkpoint;
- ``raise_in_reward``: the task's reward raises once in step ``STEP + 1`` (no pause).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from comlrl.algos.cli import main as cli
from comlrl.algos.recipes.group_baseline import recipe as gb
from comlrl.algos.training import loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.update import shared_models as updates  # the recipe's update call


def _pause(where: str, step: int) -> None:
    print(f"PAUSED {where} {step}", flush=True)
    sys.stdin.readline()


def main() -> int:
    where, step = sys.argv[1], int(sys.argv[2])
    args = sys.argv[4:] if sys.argv[3] == "--" else sys.argv[3:]
    if where == "after_checkpoint":
        original_checkpoint = gb.GroupBaselineRecipe.checkpoint

        def checkpoint(run: Any, path: Any = None, **kw: Any) -> Any:
            path = original_checkpoint(run, path, **kw)
            if run.global_step == step:
                _pause(where, run.global_step)
            return path

        gb.GroupBaselineRecipe.checkpoint = checkpoint  # type: ignore[method-assign]
    elif where == "mid_step":
        original_update = updates.update_policy
        paused: list[bool] = []

        def update_policy(*a: Any, **kw: Any) -> Any:
            if not paused and gb_run_step[0] == step:
                paused.append(True)
                _pause(where, step + 1)
            return original_update(*a, **kw)

        updates.update_policy = update_policy
    elif where == "mid_checkpoint":
        original_save = torch.save

        def save(obj: Any, f: Any, *a: Any, **kw: Any) -> Any:
            if (
                str(f).endswith(ckpt.STATE_FILE)
                and isinstance(obj, dict)
                and obj.get("step") == step + 1
            ):
                _pause(where, step + 1)
            return original_save(obj, f, *a, **kw)

        ckpt.torch.save = save  # type: ignore[assignment]
    elif where == "after_metrics":
        original_writer = loop.JsonlWriter

        class Writer(original_writer):  # type: ignore[misc, valid-type]
            def write(self, row: Any) -> None:
                super().write(row)
                if self.path.name == "metrics.jsonl" and row.get("step") == step + 1:
                    _pause(where, step + 1)

        loop.JsonlWriter = Writer  # type: ignore[misc]
    elif where == "raise_in_reward":
        from comlrl.algos.rollout import environment

        original_reward = environment.TaskEnvironment.reward
        raised: list[bool] = []

        def reward(self: Any, *a: Any, **kw: Any) -> Any:
            if not raised and gb_run_step[0] == step:
                raised.append(True)
                raise ZeroDivisionError("a rare branch of the reward")
            return original_reward(self, *a, **kw)

        environment.TaskEnvironment.reward = reward  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown pause point {where!r}")
    return cli.main(args)


# step() increments global_step after the update; track the step a run starts from here.
gb_run_step = [0]
_original_step = gb.GroupBaselineRecipe.step


def _step(run: Any) -> Any:
    gb_run_step[0] = run.global_step
    return _original_step(run)


gb.GroupBaselineRecipe.step = _step  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(main())
