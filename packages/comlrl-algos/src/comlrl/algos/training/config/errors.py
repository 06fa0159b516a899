"""The messages of a bad config: pydantic's errors one line per field
(:func:`format_errors`), and unknown fields with a did-you-mean from the fields of their
section (:func:`unknown_fields_message`, :func:`unknown_field_hint`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["FORMATS_ERRORS", "format_errors", "unknown_fields_message", "unknown_field_hint"]


#: Validation context key: the caller formats unknown fields itself (one line per bad
#: field, with a did-you-mean: :func:`~comlrl.algos.training.config.rl.build_config`, the
#: command line's recipes), so the config's own unknown-field check steps aside.
FORMATS_ERRORS = "comlrl_formats_errors"


def format_errors(exc: ValidationError, root: type[BaseModel]) -> str:
    """One line per error of ``exc`` (validating a ``root``): the field's dotted name, the
    message (``unknown field`` with a did-you-mean), the value given."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(config)"
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        unknown = err["type"] == "extra_forbidden"
        msg = "unknown field" if unknown else err["msg"]
        hint = _did_you_mean(err["loc"], root) if unknown else ""
        lines.append(f"  - {loc}: {msg} (got {shown}){hint}")
    return "\n".join(lines)


def unknown_fields_message(model: type[BaseModel], data: dict[str, Any]) -> str | None:
    """``unknown field 'x' (did you mean 'y'?)`` for every key of ``data``, and of its
    sections (``task``, ``lora``, ``vllm``: fields typed as a pydantic model), that ``model``
    does not have; ``None`` when all are known. Dotted names, as ``key=value`` overrides
    write them (``task.nme``)."""
    found = _unknown_fields(model, data, ())
    if not found:
        return None
    parts = []
    for loc in found:
        hint = _did_you_mean(loc, model)
        if loc[:-1] and "did you mean" in hint:  # name the section: 'task.name', not 'name'
            hint = hint.replace("'", f"'{'.'.join(loc[:-1])}.", 1)
            hint = hint.replace(" or '", f" or '{'.'.join(loc[:-1])}.")
        parts.append(f"unknown field {'.'.join(loc)!r}{hint}")
    return "; ".join(parts)


def _unknown_fields(
    model: type[BaseModel], data: dict[str, Any], prefix: tuple[str, ...]
) -> list[tuple[str, ...]]:
    import typing

    found: list[tuple[str, ...]] = []
    for key, value in data.items():
        field = model.model_fields.get(str(key))
        if field is None:
            found.append((*prefix, str(key)))
            continue
        if not isinstance(value, dict):
            continue
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        section = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if section is not None and section.model_config.get("extra") == "forbid":
            found.extend(_unknown_fields(section, value, (*prefix, str(key))))
    return found


def unknown_field_hint(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    """``"; did you mean 'x'?"`` for the unknown field at ``loc`` (pydantic's error location,
    e.g. ``("task", "nmae")``), from the fields of its section of ``root``; else a pointer to
    ``--print-config``."""
    return _did_you_mean(loc, root)


def _did_you_mean(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    """``"; did you mean 'x'?"`` for an unknown field, from the fields of its section."""
    import difflib
    import typing

    model = root
    foreign = getattr(model, "foreign_fields", {})
    if len(loc) == 1 and str(loc[0]) in foreign:
        return f"; {foreign[str(loc[0])]}"
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        candidates = [field.annotation, *typing.get_args(field.annotation)] if field else []
        section = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if section is None:
            return ""
        model = section
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "; `comlrl train --print-config` lists the fields"
