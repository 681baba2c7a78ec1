"""Rubric sources (JSON or YAML text) parsed and checked by the rewards library's own schema.

The console never keeps a second copy of the rubric schema: structure, weights and criterion
kinds are whatever `rewards.validate_spec` says. This module only turns text into a dict with
errors that point at a line, and refuses YAML features that let a small text expand into a
huge document (aliases) or build Python objects (safe_load already refuses those).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml
from django.conf import settings

import rewards
from console.registry.jsonvalues import MAX_JSON_DEPTH, json_value_problem

MAX_SOURCE_CHARS = 256 * 1024
_TOO_DEEP = f"the spec is nested more than {MAX_JSON_DEPTH} levels deep"


@dataclass(frozen=True)
class Issue:
    """One problem with a rubric source: a spec path (``criteria[2].weight``) or "" for the
    text as a whole, and a message for a person."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "YAML aliases (*name) are not allowed in rubric specs; write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def parse_source(source: str, source_format: str) -> tuple[Any, list[Issue]]:
    """The parsed document and the syntax problems (none when it parsed)."""
    if len(source) > MAX_SOURCE_CHARS:
        return None, [Issue("", f"the spec is longer than {MAX_SOURCE_CHARS:,} characters")]
    if not source.strip():
        return None, [Issue("", "the spec is empty")]
    if "\x00" in source:
        return None, [Issue("", "the spec contains a NUL character, which cannot be stored")]
    if source_format == "json":
        try:
            value = json.loads(source, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            return None, [
                Issue("", f"JSON syntax: {exc.msg} (line {exc.lineno}, column {exc.colno})")
            ]
        except ValueError as exc:
            return None, [Issue("", f"JSON syntax: {exc}")]
        except RecursionError:
            return None, [Issue("", _TOO_DEEP)]
    elif source_format == "yaml":
        try:
            value = yaml.load(source, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            return None, [Issue("", f"YAML syntax: {exc.problem or exc.context}{where}")]
        except yaml.YAMLError as exc:
            return None, [Issue("", f"YAML syntax: {exc}")]
        except RecursionError:
            return None, [Issue("", _TOO_DEEP)]
        except ValueError as exc:
            # A scalar the constructor cannot convert, e.g. an integer of 5,000 digits.
            return None, [Issue("", f"YAML value: {exc}")]
    else:
        return None, [Issue("", f"unknown format {source_format!r}; use json or yaml")]
    problem = json_value_problem(value)
    if problem is not None:
        return None, [Issue("", problem)]
    return value, []


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def check_rubric_source(
    source: str, source_format: str
) -> tuple[dict[str, Any] | None, list[Issue]]:
    """The spec if the text parses and the rewards library accepts it; else every issue."""
    value, issues = parse_source(source, source_format)
    if issues:
        return None, issues
    spec_issues = [Issue(issue.path, issue.message) for issue in rewards.validate_spec(value)]
    spec_issues += untrusted_functions(value) if not spec_issues else []
    if spec_issues:
        return None, spec_issues
    return value, []


def _dotted(path: str) -> str:
    return path.strip().replace(":", ".")


def untrusted_functions(spec: dict[str, Any]) -> list[Issue]:
    """An issue for every `python_function` criterion naming a function outside the
    TRUSTED_REWARD_FUNCTIONS setting: such a criterion imports and calls whatever module it
    names, so only what the deployment installed and listed may be named."""
    trusted = {_dotted(path) for path in settings.TRUSTED_REWARD_FUNCTIONS}
    issues = []
    for index, criterion in enumerate(spec.get("criteria") or []):
        if not isinstance(criterion, dict) or criterion.get("kind") != "python_function":
            continue
        function = str((criterion.get("params") or {}).get("function", ""))
        if _dotted(function) not in trusted:
            issues.append(
                Issue(
                    f"criteria[{index}].params.function",
                    f"{function!r} is not a trusted reward function (TRUSTED_REWARD_FUNCTIONS); "
                    "an operator must list it, or put your own code in a sandboxed_function",
                )
            )
    return issues


def criterion_kinds() -> Any:
    """Kinds with their parameter docs, for the editor's help panel."""
    return rewards.criterion_kinds()


def render_source(spec: dict[str, Any], source_format: str) -> str:
    """Text for a spec given without source (the API accepts a spec object)."""
    if source_format == "yaml":
        return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)
    return json.dumps(spec, indent=2, ensure_ascii=False)
