"""Rubric spec validation: the one schema the library and the console's editor both use.

`validate_spec` reports every problem at once, each with a path such as
``criteria[2].weight`` or ``criteria[0].params.pattern`` and a message written for a person
(``must be a number ≥ 0``). Structure is checked with `jsonschema` against `RUBRIC_SCHEMA`
and each kind's own ``params_schema``; what a schema cannot say (unique names, a gate that
names an existing criterion, a regex that compiles) is checked after.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from rewards.registry import kind_class, kind_names
from sandboxes.spec import LIMITS as SANDBOX_LIMITS
from sandboxes.spec import NETWORK_MODES

AGGREGATES = ("weighted_sum", "min", "product")
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$"

RUBRIC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Reward rubric",
    "type": "object",
    "required": ["version", "criteria"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": 1, "x-message": "must be 1 (the only spec version)"},
        "description": {"type": "string"},
        "criteria": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "items": {
                "type": "object",
                "required": ["name", "kind"],
                "additionalProperties": False,
                "properties": {
                    "name": {
                        "type": "string",
                        "pattern": NAME_PATTERN,
                        "x-message": "must start with a letter and hold only letters, digits, "
                        "'_' or '-' (at most 64)",
                    },
                    "kind": {"type": "string"},
                    "weight": {"type": "number", "minimum": 0},
                    "params": {"type": "object"},
                    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
                    "description": {"type": "string"},
                },
            },
        },
        "aggregate": {
            "anyOf": [
                {"type": "string", "enum": list(AGGREGATES)},
                {
                    "type": "object",
                    "required": ["gate"],
                    "additionalProperties": False,
                    "properties": {
                        "gate": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": "array",
                                    "items": {"type": "string"},
                                    "minItems": 1,
                                },
                            ],
                            "x-message": "must be a criterion name or a list of names",
                        },
                        "threshold": {"type": "number"},
                        "then": {"type": "string", "enum": list(AGGREGATES)},
                    },
                },
            ],
            "x-message": "must be 'weighted_sum', 'min', 'product' or "
            '{"gate": "<criterion name>", "then": "weighted_sum"}',
        },
        "clip": {
            "type": "array",
            "prefixItems": [{"type": "number"}, {"type": "number"}],
            "minItems": 2,
            "maxItems": 2,
            "x-message": "must be [low, high], two numbers",
        },
        "normalize": {"type": "boolean"},
        "sandbox": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "image": {"type": "string", "minLength": 1},
                "driver": {"type": "string", "minLength": 1},
                # The sandboxes library owns these ranges; a rubric that passes here starts.
                **{name: bounds.json_schema() for name, bounds in SANDBOX_LIMITS.items()},
                "network": {"type": "string", "enum": list(NETWORK_MODES)},
                "max_concurrency": {"type": "integer", "minimum": 1, "maximum": 256},
                "prewarm": {"type": "integer", "minimum": 0, "maximum": 256},
                "python_evaluations": {
                    "type": "string",
                    "enum": ["zygote", "fresh_sandbox"],
                    "description": "how Python-only code runs: forks of a pre-imported Python "
                    "in a long-lived sandbox (default, faster) or a new interpreter in a new "
                    "sandbox per sample",
                },
                "allow_weaker": {
                    "anyOf": [
                        {"type": "boolean"},
                        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                    ],
                    "x-message": "must be true, false or a list of defence names",
                },
            },
        },
    },
}


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a rubric spec: where it is and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class RubricSpecError(ValueError):
    """A rubric spec that does not validate; ``issues`` lists every problem."""

    def __init__(self, issues: list[SpecIssue]) -> None:
        self.issues = list(issues)
        listing = "; ".join(str(issue) for issue in self.issues[:20])
        more = f" (and {len(self.issues) - 20} more)" if len(self.issues) > 20 else ""
        super().__init__(f"invalid rubric spec: {listing}{more}")


_RUBRIC_VALIDATOR = Draft202012Validator(RUBRIC_SCHEMA)
_PARAM_VALIDATORS: dict[str, Draft202012Validator] = {}


def validate_spec(spec: Any) -> list[SpecIssue]:
    """Every problem with ``spec``, in document order; an empty list means it is valid."""
    if not isinstance(spec, dict):
        return [SpecIssue("", "a rubric spec must be a JSON object")]
    issues = list(_schema_issues(_RUBRIC_VALIDATOR, spec, ""))
    criteria = spec.get("criteria")
    names: dict[str, int] = {}
    if isinstance(criteria, list):
        for index, criterion in enumerate(criteria):
            if isinstance(criterion, dict):
                issues.extend(_criterion_issues(index, criterion, names))
    issues.extend(_aggregate_issues(spec, names))
    if (
        isinstance(criteria, list)
        and criteria
        and all(isinstance(c, dict) and c.get("weight", 1) == 0 for c in criteria)
    ):
        issues.append(SpecIssue("criteria", "every weight is 0, so every total would be 0"))
    issues.extend(_clip_issues(spec.get("clip")))
    return sorted(_dedupe(issues), key=_path_order)


def _path_order(issue: SpecIssue) -> list[tuple[int, Any]]:
    # Document order: criteria[2] before criteria[10], and a criterion's fields together.
    return [
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"[\[\].]+", issue.path)
        if part
    ]


def raise_for_spec(spec: Any) -> None:
    issues = validate_spec(spec)
    if issues:
        raise RubricSpecError(issues)


def _criterion_issues(index: int, criterion: dict[str, Any], names: dict[str, int]):
    prefix = f"criteria[{index}]"
    name = criterion.get("name")
    if isinstance(name, str):
        if name in names:
            yield SpecIssue(
                f"{prefix}.name", f"duplicates the name of criteria[{names[name]}] ({name!r})"
            )
        else:
            names[name] = index
    weight = criterion.get("weight")
    if isinstance(weight, float) and not math.isfinite(weight):
        yield SpecIssue(f"{prefix}.weight", "must be a finite number ≥ 0")
    kind = criterion.get("kind")
    if not isinstance(kind, str):
        return
    cls = kind_class(kind)
    if cls is None:
        yield SpecIssue(
            f"{prefix}.kind", f"unknown kind {kind!r}; known kinds: {', '.join(kind_names())}"
        )
        return
    params = criterion.get("params", {})
    if not isinstance(params, dict):
        return  # already reported by the rubric schema
    validator = _PARAM_VALIDATORS.get(kind)
    if validator is None:
        Draft202012Validator.check_schema(cls.params_schema)
        validator = _PARAM_VALIDATORS[kind] = Draft202012Validator(cls.params_schema)
    yield from _schema_issues(validator, params, f"{prefix}.params")
    try:
        problems = cls.check_params(params)
    except (TypeError, KeyError, ValueError, AttributeError):
        problems = []  # the schema errors above already say what is wrong with the types
    for path, message in problems:
        yield SpecIssue(_join(f"{prefix}.params", path), message)
    try:
        references = cls.references(params)
    except (TypeError, KeyError, ValueError, AttributeError):
        references = []
    for path, referenced in references:
        if referenced not in names or names[referenced] >= index:
            yield SpecIssue(
                _join(f"{prefix}.params", path),
                f"must name a criterion listed before this one ({referenced!r} is not)",
            )


def _aggregate_issues(spec: dict[str, Any], names: dict[str, int]):
    aggregate = spec.get("aggregate")
    if not isinstance(aggregate, dict):
        return
    gate = aggregate.get("gate")
    gates = [gate] if isinstance(gate, str) else gate if isinstance(gate, list) else []
    for position, gate_name in enumerate(gates):
        if isinstance(gate_name, str) and gate_name not in names:
            path = "aggregate.gate" if isinstance(gate, str) else f"aggregate.gate[{position}]"
            known = ", ".join(repr(n) for n in names) or "none"
            yield SpecIssue(path, f"names no criterion ({gate_name!r}); criteria: {known}")


def _clip_issues(clip: Any):
    if (
        isinstance(clip, list)
        and len(clip) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in clip)
    ):
        if not all(math.isfinite(v) for v in clip):
            yield SpecIssue("clip", "bounds must be finite numbers")
        elif clip[0] >= clip[1]:
            yield SpecIssue("clip", "the low bound must be below the high bound")


# --- turning jsonschema errors into path + message -------------------------------------------


def _schema_issues(validator: Draft202012Validator, instance: Any, base: str):
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    for error in errors:
        yield from _explain(error, base)


def _explain(error: ValidationError, base: str) -> Iterable[SpecIssue]:
    path = _join(base, _format_path(error.absolute_path))
    schema = error.schema if isinstance(error.schema, dict) else {}
    keyword = error.validator
    if keyword == "required":
        missing = _quoted_name(error.message)
        yield SpecIssue(_join(path, missing), "is required")
    elif keyword == "additionalProperties":
        known = set(schema.get("properties", {}))
        instance: Any = error.instance
        extras = sorted(k for k in instance if k not in known)
        allowed = ", ".join(sorted(known)) or "none"
        for key in extras:
            yield SpecIssue(_join(path, str(key)), f"unknown field; allowed here: {allowed}")
    elif keyword in ("anyOf", "oneOf"):
        yield from _explain_alternatives(error, path, schema)
    elif "x-message" in schema:
        yield SpecIssue(path, schema["x-message"])
    elif keyword in ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        yield SpecIssue(path, f"must be {_describe(schema)}")
    elif keyword == "enum":
        allowed_values: Any = error.validator_value
        choices = ", ".join(repr(c) for c in allowed_values)
        yield SpecIssue(path, f"must be one of {choices}")
    elif keyword == "const":
        yield SpecIssue(path, f"must be {error.validator_value!r}")
    elif keyword == "minItems":
        n = error.validator_value
        yield SpecIssue(path, "must not be empty" if n == 1 else f"needs at least {n} items")
    elif keyword == "maxItems":
        yield SpecIssue(path, f"holds at most {error.validator_value} items")
    elif keyword == "minLength":
        n = error.validator_value
        yield SpecIssue(path, "must not be empty" if n == 1 else f"needs at least {n} characters")
    elif keyword == "maxLength":
        yield SpecIssue(path, f"holds at most {error.validator_value} characters")
    elif keyword == "minProperties":
        yield SpecIssue(path, "must not be empty")
    elif keyword == "uniqueItems":
        yield SpecIssue(path, "must not repeat items")
    elif keyword == "pattern":
        yield SpecIssue(path, f"must match the pattern {error.validator_value}")
    else:
        yield SpecIssue(path, error.message)


def _explain_alternatives(error: ValidationError, path: str, schema: dict[str, Any]):
    """For anyOf/oneOf, explain against the branch of the instance's own JSON type."""
    by_branch: dict[int, list[ValidationError]] = {}
    for sub in error.context or []:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)  # type: ignore[arg-type]
    for _, subs in sorted(by_branch.items()):
        type_mismatch = any(s.validator == "type" and not s.relative_path for s in subs)
        if not type_mismatch:
            issues = []
            for sub in subs:
                rel = _format_path(sub.relative_path)
                issues.extend(_explain_relative(sub, _join(path, rel)))
            if issues:
                yield from issues
                return
    yield SpecIssue(path, schema.get("x-message") or "does not match any allowed form")


def _explain_relative(error: ValidationError, path: str) -> list[SpecIssue]:
    # `_explain` builds paths from the absolute path; for nested alternatives rebuild them.
    results = []
    for issue in _explain(error, ""):
        suffix = issue.path
        absolute = _format_path(error.absolute_path)
        if absolute and suffix.startswith(absolute):
            suffix = suffix[len(absolute) :].lstrip(".")
        results.append(SpecIssue(_join(path, suffix) if suffix else path, issue.message))
    return results


def _describe(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    words = {
        "number": "a number",
        "integer": "a whole number",
        "string": "a string",
        "boolean": "true or false",
        "object": "an object",
        "array": "a list",
        "null": "null",
    }
    text = words.get(kind, "a value") if isinstance(kind, str) else "a value"
    bounds = []
    if "minimum" in schema:
        bounds.append(f"≥ {schema['minimum']}")
    if "exclusiveMinimum" in schema:
        bounds.append(f"> {schema['exclusiveMinimum']}")
    if "maximum" in schema:
        bounds.append(f"≤ {schema['maximum']}")
    if "exclusiveMaximum" in schema:
        bounds.append(f"< {schema['exclusiveMaximum']}")
    return f"{text} {' and '.join(bounds)}" if bounds else text


def _format_path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _join(base: str, rest: str) -> str:
    if not rest:
        return base
    if not base:
        return rest
    return f"{base}{rest}" if rest.startswith("[") else f"{base}.{rest}"


def _quoted_name(message: str) -> str:
    # jsonschema says "'name' is a required property".
    if message.startswith("'") and "'" in message[1:]:
        return message[1 : message.index("'", 1)]
    return message.split(" ", 1)[0]


def _dedupe(issues: list[SpecIssue]) -> list[SpecIssue]:
    seen: set[SpecIssue] = set()
    unique = []
    for issue in issues:
        if issue not in seen:
            seen.add(issue)
            unique.append(issue)
    return unique
