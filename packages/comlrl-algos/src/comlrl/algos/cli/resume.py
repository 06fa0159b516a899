"""What ``comlrl train --resume RUN_DIR`` continues: the run's recipe (from its
``config.yaml``), its saved config plus the overrides a resume allows, and its newest
step checkpoint. Used by :mod:`comlrl.algos.cli.main`.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["resume_target", "saved_recipe"]


def resume_target(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The recipe, the saved config (plus safe overrides) and newest checkpoint of
    ``--resume RUN_DIR``.

    Raises:
        ConfigError: flags that conflict with --resume, a run of a recipe that cannot be
            resumed, an unsafe override, or no checkpoint.
    """
    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.run.checkpoint import latest_checkpoint
    from comlrl.algos.training.run.lifecycle import finished_step, resume_config

    flags = {
        "--config": args.config,
        "--model": args.model,
        "--output-dir": args.output_dir,
        "--overwrite": args.overwrite,
    }
    clash = [name for name, value in flags.items() if value]
    if clash:
        raise ConfigError(
            f"--resume takes the run's own config ({args.resume}/config.yaml) and folder; drop "
            f"{', '.join(clash)} (to start over instead: comlrl train --overwrite ...)."
        )
    overrides = list(args.overrides)
    if args.num_steps is not None:
        overrides.append(f"num_steps={args.num_steps}")
    if any(o.split("=", 1)[0].strip() == "algo" for o in overrides):
        raise ConfigError("--resume continues the run's own recipe; drop algo=.")
    recipe = saved_recipe(args.resume)
    config = resume_config(args.resume, overrides, recipe.build_config)
    found = latest_checkpoint(args.resume)
    finished = finished_step(args.resume)
    if found is None and finished is not None:
        if finished >= config.num_steps:
            return recipe, config, None  # cli.main says there is nothing to do
        raise ConfigError(
            f"{args.resume!r} finished at step {finished} (final/) without a step checkpoint "
            f"(save_every=0), so it cannot be continued to num_steps={config.num_steps}: the "
            "optimizer state and random streams are gone. Start over with --overwrite (and "
            "save_every=N to be able to extend a run later)."
        )
    if found is None:
        raise ConfigError(
            f"nothing to resume in {args.resume!r}: no complete checkpoint under "
            f"{args.resume}/checkpoints (a run writes one every save_every steps and on Ctrl-C); "
            "start it again with --overwrite."
        )
    return recipe, config, found


def saved_recipe(run_dir: str) -> Any:
    """The recipe of the run in ``run_dir``, read from its ``config.yaml``: its ``algo``
    key; else the only recipe whose config has every saved key (a group-baseline run's
    ``estimator`` picks among those four).

    Raises:
        ConfigError: no readable ``config.yaml``, an unknown ``algo``, keys that fit no
            recipe or more than one (e.g. ``iac`` and ``maac``: add ``algo:`` to the file),
            or a recipe that cannot be resumed.
    """
    from pathlib import Path

    import yaml
    from comlrl.algos.recipes.registry import RECIPES, get_recipe, resolve_recipe
    from comlrl.algos.training.config.rl import ConfigError, TrainConfig

    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
    except OSError:
        raise ConfigError(
            f"cannot resume {run_dir!r}: it has no config.yaml (is it the output_dir of a "
            "comlrl train run?)"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{str(path)!r} must hold a YAML mapping")
    if isinstance(saved.get("algo"), str):
        recipe = get_recipe(saved["algo"])
    elif set(saved) <= set(TrainConfig.model_fields):
        recipe, _ = resolve_recipe({"estimator": saved.get("estimator", "grpo")})
    else:
        fits = {
            r.name: r
            for r in RECIPES.values()
            if set(saved) <= set(r.config_class().model_fields)
            and r.config != RECIPES["magrpo"].config
        }
        if len(fits) != 1:
            what = f"algo={' or algo='.join(fits)}" if fits else "no registered recipe"
            raise ConfigError(
                f"{str(path)!r} has no algo: key and its keys fit {what}; add the line "
                "`algo: NAME` (the recipe the run was started with) to it and resume again."
            )
        (recipe,) = fits.values()
    if not recipe.resumable:
        raise ConfigError(
            f"{run_dir!r} is a run of algo={recipe.name}, which cannot be resumed "
            f"(resumable: {', '.join(r.name for r in RECIPES.values() if r.resumable)}); "
            "start a new run, e.g. from its final/ weights with --model."
        )
    return recipe
