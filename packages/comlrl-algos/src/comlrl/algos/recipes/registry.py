"""One registry of the training recipes by name: ``comlrl train algo=NAME ...``.

Each :class:`Recipe` entry says which config class validates its settings, which keys a
``key=value`` override or a YAML file may set (the config's fields, and former flat keys
that still resolve into its sections), what it presets for a small default run, which
optional sections it needs or refuses, and which recipe class
(``comlrl.algos.recipes.<family>.recipe``) the one launcher
(:func:`~comlrl.algos.recipes.launch.launch`) runs end to end. From Python,
:func:`run_recipe` runs an entry the same way. The command line only picks an entry and
hands it the parsed mapping. Adding a recipe is its ``config.py``, its ``recipe.py`` and
one row here.

``comlrl recipes`` lists the entries (:func:`describe_recipes`).

Without ``algo``, ``estimator`` picks the group-baseline entry as it always has
(``comlrl train estimator=rloo`` is ``marloo``). ``role_format`` (one model plays every
role) is a setting of any group-baseline, MADPO or MARLHF config; the ``centralized_*``
entries preset it. Entries hold the config and recipe classes themselves (imported
objects, which import-linter, mypy and editors follow).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.actor_critic.recipe import IACTrainer, MAACTrainer
from comlrl.algos.recipes.group_baseline.recipe import (
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
    MultiAgentTrainer,
)
from comlrl.algos.recipes.launch import RunResult, launch
from comlrl.algos.recipes.preference.iterative.recipe import MADPOIterRecipe, MARLHFIterRecipe
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
from comlrl.algos.recipes.preference.madpo.recipe import MADPOTrainer
from comlrl.algos.recipes.preference.marlhf.config import MARLHFConfig
from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFTrainer
from comlrl.algos.recipes.preference.supervised.config import DPOConfig, SFTConfig
from comlrl.algos.recipes.preference.supervised.recipe import DPORecipe, SFTRecipe
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.run.outputs import RunOutputs
from pydantic import BaseModel

#: what ``algo=madpo`` and its kin preset: the settings measured to suit the built-in
#: stories260k (:class:`~comlrl.algos.recipes.preference.madpo.config.MADPOConfig`)
MADPO_PRESETS: Mapping[str, Any] = {
    "learning_rate": 1e-3,
    "optimizer": "radam",
    "num_steps": 60,
    "batch_size": 4,
}


@dataclass(frozen=True)
class Recipe:
    """One registered training recipe.

    Attributes:
        name: the ``algo=`` name.
        summary: one line for listings (``comlrl recipes``).
        config: the pydantic config class the settings validate into.
        recipe: the recipe class (:func:`~comlrl.algos.recipes.launch.launch` runs it end
            to end; its constructor takes the config).
        presets: values used for keys the user leaves unset (e.g. the estimator of
            ``marloo``, a smaller default ``output_dir``); shown by ``--print-config``.
        fixed: keys the entry fixes; a user value that differs is an error (``marloo``
            with ``estimator=grpo``).
        requires: optional sections of the config that this entry needs set (preset to
            their defaults): ``iterative``, ``role_format``.
        refuses: optional sections this entry does not take (the entry that does is named).
        aliases: further ``algo=`` names of the entry.
        resumable: ``comlrl train --resume`` can continue its runs.
        distributed: it may run under ``torchrun`` (data parallel over the ranks).
    """

    name: str
    summary: str
    config: type[BaseModel]
    recipe: Any
    presets: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    refuses: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    resumable: bool = False
    distributed: bool = False

    def config_class(self) -> type[BaseModel]:
        """The pydantic config class."""
        return self.config

    def valid_keys(self) -> list[str]:
        """The top-level keys its config accepts (``algo`` aside), sorted."""
        return sorted(self.config_class().model_fields)

    def build_config(self, data: Mapping[str, Any]) -> Any:
        """Validate ``data`` (the YAML mapping with ``key=value`` overrides applied, without
        ``algo``) into this recipe's config, after :attr:`presets` and :attr:`fixed`.

        Raises:
            ConfigError: a top-level key the config does not have (naming the key, this
                recipe and its valid keys, and the recipes that do have it), a value that
                contradicts :attr:`fixed`, or any invalid field (pydantic's checks, one
                line per field).
        """
        valid = self.valid_keys()
        moved = getattr(self.config, "moved_keys", {})  # former flat keys, now in sections
        unknown = [k for k in data if k not in valid and k not in moved]
        if unknown:
            raise ConfigError(_unknown_keys_message(self, unknown, valid))
        for key in self.refuses:
            if data.get(key) is not None:
                owners = [r.name for r in _registered() if key in r.requires]
                raise ConfigError(
                    f"algo={self.name} takes no {key} section; {key} is what "
                    f"algo={' / algo='.join(owners)} adds: run that instead, or drop {key}."
                )
        for key in (k for k in self.requires if k in data and data[k] is None):
            raise ConfigError(f"algo={self.name} needs its {key} setting; drop {key}=null.")
        for key, value in self.fixed.items():
            if key in data and _normalise(key, data[key]) != value:
                raise ConfigError(
                    f"algo={self.name} fixes {key}={value!r} but the config sets "
                    f"{key}={data[key]!r}; drop {key}, or pick the recipe of that "
                    f"{key} (comlrl recipes lists them)."
                )
        merged = {**self.presets, **dict(data), **self.fixed}
        return _validate(self.config_class(), merged, self.name)

    def run(self, config: Any, outputs: RunOutputs | None = None) -> RunResult:
        """Run the recipe end to end (:func:`~comlrl.algos.recipes.launch.launch`; raises
        as it does)."""
        return launch(self.recipe, config, outputs, algo=self.name)


def _normalise(key: str, value: Any) -> Any:
    if key == "estimator" and isinstance(value, str):
        from comlrl.estimators.registry import ESTIMATORS

        est = ESTIMATORS.get(value.lower())
        return est.name if est is not None else value.lower()
    return value


def _validate(cls: type[Any], data: Mapping[str, Any], name: str) -> Any:
    from comlrl.algos.training.config.errors import FORMATS_ERRORS, unknown_field_hint
    from pydantic import ValidationError

    try:
        return cls.model_validate(dict(data), context={FORMATS_ERRORS: True})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(config)"
            value = err.get("input")
            shown = repr(value) if not isinstance(value, dict) else "{...}"
            unknown = err["type"] == "extra_forbidden"
            msg = "unknown field" if unknown else err["msg"]
            msg = msg.removeprefix("Value error, ")
            hint = unknown_field_hint(tuple(err["loc"]), cls) if unknown else ""
            lines.append(f"  - {loc}: {msg} (got {shown}){hint}")
        raise ConfigError(f"invalid config for algo={name}:\n" + "\n".join(lines)) from None


def _unknown_keys_message(recipe: Recipe, unknown: list[str], valid: list[str]) -> str:
    parts = []
    for key in unknown:
        hint = ""
        close = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
        owners = [
            r.name
            for r in _registered()
            if r.name != recipe.name and key in r.config_class().model_fields
        ]
        foreign = getattr(recipe.config_class(), "foreign_fields", {})
        if key in foreign:  # another recipe's field: say why this one has none
            hint = f"; {foreign[key]}"
        elif close:
            hint = "; did you mean " + " or ".join(repr(c) for c in close) + "?"
        elif owners:
            hint = f"; it is a key of algo={', algo='.join(owners)}"
        parts.append(f"{key!r}{hint}")
    return (
        f"unknown key{'s' if len(unknown) > 1 else ''} for algo={recipe.name}: "
        f"{', '.join(parts)}\nValid keys of {recipe.name} "
        f"({recipe.config.__name__}): {', '.join(valid)}."
    )


def _registered() -> list[Recipe]:
    """Every registered entry (:data:`RECIPES`, defined below; read when a message is made)."""
    return list(RECIPES.values())


__all__ = [
    "Recipe",
    "RECIPES",
    "DEFAULT_RECIPE",
    "get_recipe",
    "recipe_names",
    "resolve_recipe",
    "build_recipe_config",
    "describe_recipes",
    "run_recipe",
]

DEFAULT_RECIPE = "magrpo"
"""The entry ``comlrl train`` runs without ``algo`` or ``estimator``."""


RECIPES: Mapping[str, Recipe] = MappingProxyType(
    {
        r.name: r
        for r in (
            Recipe(
                "magrpo",
                "MAGRPO: group-mean baseline divided by the group std (Shao et al. 2024); "
                "the default",
                TrainConfig,
                MAGRPOTrainer,
                fixed={"estimator": "grpo"},
                aliases=("grpo",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "mareinforce",
                "MAREINFORCE: policy gradient on the joint return, no baseline (Williams 1992)",
                TrainConfig,
                MAREINFORCETrainer,
                fixed={"estimator": "reinforce"},
                aliases=("reinforce",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "marloo",
                "MARLOO: leave-one-out group baseline (Kool et al. 2019; Ahmadian et al. 2024)",
                TrainConfig,
                MARLOOTrainer,
                fixed={"estimator": "rloo"},
                aliases=("rloo",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "maremax",
                "MAReMax: the best of the other samples' returns as baseline (after Li et al. 2023)",
                TrainConfig,
                MAReMaxTrainer,
                fixed={"estimator": "remax"},
                aliases=("remax",),
                resumable=True,
                distributed=True,
            ),
            Recipe(
                "centralized_magrpo",
                "Centralized MAGRPO: one joint policy writes every role's output (role_format "
                "splits it), group-mean baseline",
                TrainConfig,
                MAGRPOTrainer,
                presets={"output_dir": "runs/centralized_magrpo", "role_format": "sentences"},
                fixed={"estimator": "grpo"},
                requires=("role_format",),
                aliases=("central_magrpo",),
                resumable=True,
            ),
            Recipe(
                "centralized_madpo",
                "Centralized MADPO: one joint policy writes every role's output (role_format "
                "splits it), DPO on reward-gap pairs of its joint responses",
                MADPOConfig,
                MADPOTrainer,
                presets={
                    **MADPO_PRESETS,
                    "output_dir": "runs/centralized_madpo",
                    "role_format": "sentences",
                },
                requires=("role_format",),
                refuses=("iterative",),
                aliases=("central_madpo",),
                resumable=True,
            ),
            Recipe(
                "centralized_marlhf",
                "Centralized MARLHF: one joint policy; a reward model fit on reward-gap pairs "
                "of its joint responses, then the group-baseline recipe on its reward",
                MARLHFConfig,
                MARLHFTrainer,
                presets={"output_dir": "runs/centralized_marlhf", "role_format": "sentences"},
                requires=("role_format",),
                refuses=("iterative",),
                aliases=("central_marlhf",),
                resumable=True,
            ),
            Recipe(
                "centralized_madpo_iter",
                "Centralized MADPO-Iter: one joint policy; rounds of pairs of its joint "
                "responses against a comparator's (itself, a frozen model, its past self, an "
                "HTTP API), replayed, then DPO steps",
                MADPOConfig,
                MADPOIterRecipe,
                presets={
                    **MADPO_PRESETS,
                    "output_dir": "runs/centralized_madpo_iter",
                    "role_format": "sentences",
                    "iterative": {},
                },
                requires=("role_format", "iterative"),
                resumable=True,
            ),
            Recipe(
                "centralized_marlhf_iter",
                "Centralized MARLHF-Iter: one joint policy; rounds of comparator pairs of "
                "joint responses, a reward model refit on them, then MAGRPO steps",
                MARLHFConfig,
                MARLHFIterRecipe,
                presets={
                    "output_dir": "runs/centralized_marlhf_iter",
                    "role_format": "sentences",
                    "iterative": {},
                },
                requires=("role_format", "iterative"),
                resumable=True,
            ),
            Recipe(
                "iac",
                "IAC: PPO actors, a critic per agent on its own prompt, GAE advantages",
                ActorCriticConfig,
                IACTrainer,
                presets={"output_dir": "runs/iac"},
                resumable=True,
            ),
            Recipe(
                "maac",
                "MAAC: PPO actors, one centralised critic on every agent's prompt, GAE",
                ActorCriticConfig,
                MAACTrainer,
                presets={"output_dir": "runs/maac"},
                resumable=True,
            ),
            Recipe(
                "madpo",
                "MADPO: multi-agent DPO on joint actions sampled online, paired by reward gap",
                MADPOConfig,
                MADPOTrainer,
                presets=MADPO_PRESETS,
                refuses=("iterative",),
                resumable=True,
            ),
            Recipe(
                "marlhf",
                "MARLHF: a joint reward model fit on reward-gap pairs, then MAGRPO on its reward",
                MARLHFConfig,
                MARLHFTrainer,
                presets={"output_dir": "runs/marlhf"},
                refuses=("iterative",),
                resumable=True,
            ),
            Recipe(
                "madpo_iter",
                "MADPO-Iter: rounds of fresh pairs against a comparator policy (current, a "
                "frozen model, or the policy k rounds ago), replayed, then joint DPO steps",
                MADPOConfig,
                MADPOIterRecipe,
                presets={**MADPO_PRESETS, "output_dir": "runs/madpo_iter", "iterative": {}},
                requires=("iterative",),
                resumable=True,
            ),
            Recipe(
                "marlhf_iter",
                "MARLHF-Iter: rounds of comparator pairs, a reward model refit on them, then "
                "MAGRPO steps on its reward",
                MARLHFConfig,
                MARLHFIterRecipe,
                presets={"output_dir": "runs/marlhf_iter", "iterative": {}},
                requires=("iterative",),
                resumable=True,
            ),
            Recipe(
                "dpo",
                "DPO of one model on prompt/chosen/rejected rows, data=FILE.jsonl "
                "(Rafailov et al. 2023)",
                DPOConfig,
                DPORecipe,
                resumable=True,
            ),
            Recipe(
                "sft",
                "SFT of one model on prompt/completion rows, data=FILE.jsonl",
                SFTConfig,
                SFTRecipe,
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
            from comlrl.estimators.registry import ESTIMATORS

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
    return dataclasses.replace(recipe, recipe=MultiAgentTrainer, fixed={})


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


def run_recipe(algo: str, config: Any, outputs: RunOutputs | None = None) -> RunResult:
    """What ``comlrl train algo=NAME`` runs, from Python: the recipe registered as ``algo``
    on ``config`` (its config class), end to end (:func:`~comlrl.algos.recipes.launch.launch`),
    writing where ``outputs`` says (default ``RunOutputs.of(config)``; ``RunOutputs.of(config,
    resume=True)`` continues the run's newest step checkpoint).

    Raises:
        ConfigError: no such recipe, or what :func:`~comlrl.algos.recipes.launch.launch` raises.
    """
    return get_recipe(algo).run(config, outputs)
