"""One entry of the recipe registry (:class:`Recipe`): which config class validates a
recipe's settings, what it presets or fixes, and which function runs it; the error messages
for unknown keys and invalid values (:mod:`comlrl.algos.cli.registry` holds the entries).

Config classes and runners are named as ``"module:attribute"`` and imported when first used,
so listing the recipes imports no torch.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from comlrl.algos.training.config import ConfigError

__all__ = ["Recipe"]


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Recipe:
    """One registered training recipe.

    Attributes:
        name: the ``algo=`` name.
        summary: one line for listings (``comlrl recipes``).
        config: ``"module:Class"`` of the pydantic config the settings validate into.
        runner: ``"module:function"``; ``function(config, request) -> exit code`` runs the
            recipe end to end (:class:`comlrl.algos.cli.runs.RunRequest`).
        presets: values used for keys the user leaves unset (e.g. the estimator of
            ``marloo``, a smaller default ``output_dir``); shown by ``--print-config``.
        fixed: keys the entry fixes; a user value that differs is an error (``marloo``
            with ``estimator=grpo``).
        aliases: further ``algo=`` names of the entry.
        resumable: ``comlrl train --resume`` can continue its runs.
        distributed: it may run under ``torchrun`` (data parallel over the ranks).
    """

    name: str
    summary: str
    config: str
    runner: str
    presets: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    resumable: bool = False
    distributed: bool = False

    def config_class(self) -> type[Any]:
        """The pydantic config class (imported on first use)."""
        cls: type[Any] = _load(self.config)
        return cls

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
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise ConfigError(_unknown_keys_message(self, unknown, valid))
        for key, value in self.fixed.items():
            if key in data and _normalise(key, data[key]) != value:
                raise ConfigError(
                    f"algo={self.name} fixes {key}={value!r} but the config sets "
                    f"{key}={data[key]!r}; drop {key}, or pick the recipe of that "
                    f"{key} (comlrl recipes lists them)."
                )
        merged = {**self.presets, **dict(data), **self.fixed}
        return _validate(self.config_class(), merged, self.name)

    def run(self, config: Any, request: Any) -> int:
        """Run the recipe end to end; returns the command's exit code."""
        code: int = _load(self.runner)(config, request)
        return code


def _normalise(key: str, value: Any) -> Any:
    if key == "estimator" and isinstance(value, str):
        from comlrl.algos.functional.estimators import ESTIMATORS

        est = ESTIMATORS.get(value.lower())
        return est.name if est is not None else value.lower()
    return value


def _validate(cls: type[Any], data: Mapping[str, Any], name: str) -> Any:
    from comlrl.algos.training.config import FORMATS_ERRORS, unknown_field_hint
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
        f"({recipe.config.rpartition(':')[2]}): {', '.join(valid)}."
    )


def _registered() -> list[Recipe]:
    """Every registered entry (imported here, not at module level: the registry imports
    this module to build its entries)."""
    from comlrl.algos.cli.registry import RECIPES

    return list(RECIPES.values())
