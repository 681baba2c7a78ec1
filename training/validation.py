"""Pydantic errors as the ``"<dotted path>: <problem>"`` lines the training specs report.

The declarative models (`training.spec`, `training.algorithm_config`, `training.rollout_config`,
`training.tasks`) let pydantic find *every* problem with its location; this module turns each
one into a short line in the house wording (``domains[1].weight: must be >= 0, got -2``) so a
spec's errors read the same whichever model found them. No torch, no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["SpecModel", "error_lines", "join_path"]


class SpecModel(BaseModel):
    """Base of the spec models: frozen, unknown keys refused, no type coercion (a string is not a
    number, ``true`` is not 1), no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def join_path(prefix: str, loc: Sequence[Any]) -> str:
    """``("domains", 1, "weight")`` under ``""`` -> ``"domains[1].weight"``."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _message(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    got = f", got {value!r}"
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        sign, key = bounds[kind]
        return f"must be {sign} {ctx.get(key)}{got}"
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"must be an integer{got}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a finite number{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false{got}"
    if kind == "string_type":
        return f"must be a string{got}"
    if kind == "string_too_short":
        return "must be a non-empty string"
    if kind == "too_short":
        least = ctx.get("min_length")
        return "must not be empty" if least == 1 else f"must have at least {least} items"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}{got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be an object, got {_kind(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {_kind(value)}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])


def error_lines(exc: ValidationError, prefix: str = "") -> list[str]:
    """Every error of ``exc`` as ``"<path>: <problem>"``, its path under ``prefix``."""
    lines = []
    for error in exc.errors():
        path = join_path(prefix, error["loc"])
        lines.append(f"{path}: {_message(error)}" if path else _message(error))
    return lines


def validate_into(
    model: type[BaseModel], data: Any, prefix: str, errors: list[str]
) -> BaseModel | None:
    """``model`` validated from ``data``, or None with its problems appended to ``errors``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors.extend(error_lines(exc, prefix))
        return None


def unique(lines: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(lines))
