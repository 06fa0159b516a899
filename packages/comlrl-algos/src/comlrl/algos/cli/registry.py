"""One registry of the training recipes by name: ``comlrl train algo=NAME ...``.

Each :class:`Recipe` entry says which config class validates its settings, which keys a
``key=value`` override or a YAML file may set (the config's fields, nothing else), what it
presets for a small default run, and which function runs it end to end from the command
line (task or data, agents or model, ``output_dir``, ``metrics.jsonl`` rows, final save;
:mod:`comlrl.algos.cli.runs`). The command line only picks an entry and hands it
the parsed mapping; the library API (trainers, recipe functions, configs) is unchanged.

===========================  =========================================================
names                        recipe
===========================  =========================================================
``magrpo`` (``grpo``)        group-mean baseline, std-scaled; the default
``mareinforce``              no baseline (``reinforce``)
``marloo`` (``rloo``)        leave-one-out baseline
``maremax`` (``remax``)      the best return of the other samples as baseline
``centralized_magrpo``       one joint policy for every role (split by ``role_format``)
``centralized_madpo``        one joint policy, DPO on pairs of its joint responses
``centralized_marlhf``       one joint policy, MAGRPO on a reward model of its joint texts
``centralized_madpo_iter``   one joint policy, MADPO-Iter rounds on its joint responses
``centralized_marlhf_iter``  one joint policy, MARLHF-Iter rounds on its joint responses
``iac`` / ``maac``           PPO actors with per-agent / one centralised critic, GAE
``madpo``                    multi-agent DPO on joint actions paired by reward gap
``marlhf``                   joint reward model on reward-gap pairs, then MAGRPO on it
``madpo_iter``               rounds of pairs against a comparator policy, replay, DPO steps
``marlhf_iter``              rounds of comparator pairs, a reward model refit, MAGRPO steps
``dpo`` / ``sft``            one model on ``data=rows.jsonl``
===========================  =========================================================

Without ``algo``, ``estimator`` picks the group-baseline entry as it always has
(``comlrl train estimator=rloo`` is ``marloo``). This module imports no torch: config
classes and runners are named as ``"module:attribute"`` and imported when used, so
``comlrl train --help`` and ``comlrl recipes`` stay fast.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from comlrl.algos.cli.recipe_entry import Recipe
from comlrl.algos.training.config import ConfigError

__all__ = [
    "Recipe",
    "RECIPES",
    "DEFAULT_RECIPE",
    "get_recipe",
    "recipe_names",
    "resolve_recipe",
    "build_recipe_config",
    "describe_recipes",
]

DEFAULT_RECIPE = "magrpo"
"""The entry ``comlrl train`` runs without ``algo`` or ``estimator``."""


_GB = "comlrl.algos.cli.runs"

RECIPES: Mapping[str, Recipe] = MappingProxyType(
    {
        r.name: r
        for r in (
            Recipe(
                "magrpo",
                "MAGRPO: group-mean baseline divided by the group std (Shao et al. 2024); "
                "the default",
                "comlrl.algos.training.config:TrainConfig",
                f"{_GB}:run_group_baseline",
                fixed={"estimator": "grpo"},
                aliases=("grpo",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "mareinforce",
                "MAREINFORCE: policy gradient on the joint return, no baseline (Williams 1992)",
                "comlrl.algos.training.config:TrainConfig",
                f"{_GB}:run_group_baseline",
                fixed={"estimator": "reinforce"},
                aliases=("reinforce",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "marloo",
                "MARLOO: leave-one-out group baseline (Kool et al. 2019; Ahmadian et al. 2024)",
                "comlrl.algos.training.config:TrainConfig",
                f"{_GB}:run_group_baseline",
                fixed={"estimator": "rloo"},
                aliases=("rloo",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "maremax",
                "MAReMax: the best of the other samples' returns as baseline (after Li et al. 2023)",
                "comlrl.algos.training.config:TrainConfig",
                f"{_GB}:run_group_baseline",
                fixed={"estimator": "remax"},
                aliases=("remax",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "centralized_magrpo",
                "Centralized MAGRPO: one joint policy writes every role's output (role_format "
                "splits it), group-mean baseline",
                "comlrl.algos.cli.centralized_run:CentralizedRunConfig",
                "comlrl.algos.cli.centralized_run:run_centralized_magrpo",
                presets={"output_dir": "runs/centralized_magrpo"},
                fixed={"estimator": "grpo"},
                aliases=("central_magrpo",),
                resumable=True,
            ),
            Recipe(
                "centralized_madpo",
                "Centralized MADPO: one joint policy writes every role's output (role_format "
                "splits it), DPO on reward-gap pairs of its joint responses",
                "comlrl.algos.cli.centralized_run:CentralizedMADPORunConfig",
                "comlrl.algos.cli.centralized_run:run_centralized_madpo",
                aliases=("central_madpo",),
                resumable=True,
            ),
            Recipe(
                "centralized_marlhf",
                "Centralized MARLHF: one joint policy; a reward model fit on reward-gap pairs "
                "of its joint responses, then the group-baseline recipe on its reward",
                "comlrl.algos.cli.centralized_run:CentralizedMARLHFRunConfig",
                "comlrl.algos.cli.centralized_run:run_centralized_marlhf",
                aliases=("central_marlhf",),
                resumable=True,
            ),
            Recipe(
                "centralized_madpo_iter",
                "Centralized MADPO-Iter: one joint policy; rounds of pairs of its joint "
                "responses against a comparator's (itself, a frozen model, its past self, an "
                "HTTP API), replayed, then DPO steps",
                "comlrl.algos.cli.centralized_run:CentralizedMADPOIterRunConfig",
                "comlrl.algos.cli.centralized_run:run_centralized_madpo_iter",
                resumable=True,
            ),
            Recipe(
                "centralized_marlhf_iter",
                "Centralized MARLHF-Iter: one joint policy; rounds of comparator pairs of "
                "joint responses, a reward model refit on them, then MAGRPO steps",
                "comlrl.algos.cli.centralized_run:CentralizedMARLHFIterRunConfig",
                "comlrl.algos.cli.centralized_run:run_centralized_marlhf_iter",
                resumable=True,
            ),
            Recipe(
                "iac",
                "IAC: PPO actors, a critic per agent on its own prompt, GAE advantages",
                "comlrl.algos.recipes.actor_critic.recipe:ActorCriticConfig",
                f"{_GB}:run_iac",
                presets={"output_dir": "runs/iac"},
                resumable=True,
            ),
            Recipe(
                "maac",
                "MAAC: PPO actors, one centralised critic on every agent's prompt, GAE",
                "comlrl.algos.recipes.actor_critic.recipe:ActorCriticConfig",
                f"{_GB}:run_maac",
                presets={"output_dir": "runs/maac"},
                resumable=True,
            ),
            Recipe(
                "madpo",
                "MADPO: multi-agent DPO on joint actions sampled online, paired by reward gap",
                f"{_GB}:MADPORunConfig",
                f"{_GB}:run_madpo",
                resumable=True,
            ),
            Recipe(
                "marlhf",
                "MARLHF: a joint reward model fit on reward-gap pairs, then MAGRPO on its reward",
                f"{_GB}:MARLHFRunConfig",
                f"{_GB}:run_marlhf",
                presets={"output_dir": "runs/marlhf"},
                resumable=True,
            ),
            Recipe(
                "madpo_iter",
                "MADPO-Iter: rounds of fresh pairs against a comparator policy (current, a "
                "frozen model, or the policy k rounds ago), replayed, then joint DPO steps",
                "comlrl.algos.cli.iterative_run:MADPOIterRunConfig",
                "comlrl.algos.cli.iterative_run:run_madpo_iter",
                resumable=True,
            ),
            Recipe(
                "marlhf_iter",
                "MARLHF-Iter: rounds of comparator pairs, a reward model refit on them, then "
                "MAGRPO steps on its reward",
                "comlrl.algos.cli.iterative_run:MARLHFIterRunConfig",
                "comlrl.algos.cli.iterative_run:run_marlhf_iter",
                resumable=True,
            ),
            Recipe(
                "dpo",
                "DPO of one model on prompt/chosen/rejected rows, data=FILE.jsonl "
                "(Rafailov et al. 2023)",
                f"{_GB}:DPORunConfig",
                f"{_GB}:run_dpo",
                resumable=True,
            ),
            Recipe(
                "sft",
                "SFT of one model on prompt/completion rows, data=FILE.jsonl",
                f"{_GB}:SFTRunConfig",
                f"{_GB}:run_sft",
                resumable=True,
            ),
        )
    }
)
"""Every recipe by canonical name."""

_BY_ALIAS: dict[str, str] = {
    alias: r.name for r in RECIPES.values() for alias in (r.name, *r.aliases)
}


def recipe_names() -> list[str]:
    """Every accepted ``algo=`` value (names and aliases), sorted."""
    return sorted(_BY_ALIAS)


def get_recipe(name: str) -> Recipe:
    """The entry registered under ``name`` (case-insensitive; aliases accepted).

    Raises:
        ConfigError: no such recipe (with the names and close matches).
    """
    key = str(name).strip().lower()
    if key in _BY_ALIAS:
        return RECIPES[_BY_ALIAS[key]]
    close = difflib.get_close_matches(key, list(_BY_ALIAS), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(
        f"unknown algo={name!r}{hint} Recipes: {', '.join(RECIPES)} "
        f"(aliases: {', '.join(a for a in _BY_ALIAS if a not in RECIPES)}); "
        "`comlrl recipes` describes them."
    )


def resolve_recipe(data: Mapping[str, Any]) -> tuple[Recipe, dict[str, Any]]:
    """Pick the entry of a parsed config mapping and return it with ``algo`` removed.

    ``algo`` names the entry. Without it, a group-baseline ``estimator`` picks its own
    entry (``rloo`` -> ``marloo``; an estimator you registered yourself runs under
    ``magrpo``'s loop with that estimator), else :data:`DEFAULT_RECIPE`.

    Raises:
        ConfigError: ``algo`` is not a string or names no recipe.
    """
    rest = dict(data)
    algo = rest.pop("algo", None)
    if algo is None:
        estimator = rest.get("estimator")
        if isinstance(estimator, str):
            from comlrl.algos.functional.estimators import ESTIMATORS

            est = ESTIMATORS.get(estimator.lower())
            if est is not None and est.name in _BY_ALIAS:
                recipe = RECIPES[_BY_ALIAS[est.name]]
                if recipe.fixed.get("estimator") == est.name:
                    return recipe, rest
            return _custom_estimator(RECIPES[DEFAULT_RECIPE]), rest
        return RECIPES[DEFAULT_RECIPE], rest
    if not isinstance(algo, str):
        raise ConfigError(f"algo must be a recipe name, got {algo!r}; `comlrl recipes` lists them")
    return get_recipe(algo), rest


def _custom_estimator(recipe: Recipe) -> Recipe:
    """``magrpo``'s entry without its fixed estimator (a user-registered estimator)."""
    return Recipe(
        recipe.name,
        recipe.summary,
        recipe.config,
        recipe.runner,
        recipe.presets,
        {},
        recipe.aliases,
        recipe.resumable,
        recipe.distributed,
    )


def build_recipe_config(data: Mapping[str, Any]) -> tuple[Recipe, Any]:
    """:func:`resolve_recipe` then :meth:`Recipe.build_config`: the entry and its validated
    config from a YAML/override mapping (``algo`` included or not).

    Raises:
        ConfigError: as those two do.
    """
    recipe, rest = resolve_recipe(data)
    return recipe, recipe.build_config(rest)


def describe_recipes() -> list[str]:
    """One line per recipe: ``name (aliases)  summary``, in registry order."""
    width = max(len(_label(r)) for r in RECIPES.values())
    return [f"{_label(r):<{width}}  {r.summary}" for r in RECIPES.values()]


def _label(recipe: Recipe) -> str:
    return recipe.name + (f" ({', '.join(recipe.aliases)})" if recipe.aliases else "")
