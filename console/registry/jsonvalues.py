"""What a value parsed from user text must be before the console stores it as JSON.

PostgreSQL's jsonb and Python's json module each have limits that surface only later, as a
server error far from the input that caused it: a document nested ~1000 deep parses here but
raises RecursionError when read back in a deeper call stack; a NUL character (\\u0000) is
refused by jsonb; YAML turns `2024-01-01` into a date, `!!binary` into bytes and `!!set` into
a set, none of which JSON can hold; an integer of thousands of digits cannot even be turned
back into text. `json_value_problem` names the first such problem, with its path, so the
input is refused with a clear message before anything is saved.
"""

from __future__ import annotations

import math
from typing import Any

# Deeper than any rubric or task needs, far below where Python's parsers and jsonb give up.
MAX_JSON_DEPTH = 64
# Integers are kept to what every consumer (PostgreSQL bigint, JSON readers in other
# languages, float arithmetic in the rewards library) handles exactly.
MAX_JSON_INT = 2**63 - 1

_TYPE_NAMES = {"date": "a date", "datetime": "a date and time", "bytes": "binary data"}


def _where(path: str) -> str:
    return f"at {path}: " if path else ""


def _type_problem(value: Any) -> str:
    name = type(value).__name__
    described = _TYPE_NAMES.get(name, f"a {name}" if name != "set" else "a set")
    return (
        f"{described} is not a JSON value (YAML reads unquoted dates, !!binary and !!set as "
        "such); quote it or write it as text, a list or an object"
    )


def json_value_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """The first reason `value` cannot be stored as JSON, or None. Iterative, so a hostile
    depth cannot exhaust the stack here either."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list) and depth > max_depth:
            return f"{_where(path)}nested more than {max_depth} levels deep"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{_where(path)}the key {key!r} is not text; quote it"
                if "\x00" in key:
                    return f"{_where(path)}a key contains a NUL character (\\u0000)"
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{path}[{index}]", depth + 1))
        elif isinstance(item, str):
            if "\x00" in item:
                return f"{_where(path)}contains a NUL character (\\u0000), which cannot be stored"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -MAX_JSON_INT - 1 <= item <= MAX_JSON_INT:
                return f"{_where(path)}integers must fit in 64 bits (±9.2e18)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{_where(path)}numbers must be finite (no NaN or infinity)"
        else:
            return f"{_where(path)}{_type_problem(item)}"
    return None


def nested_too_deep(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether any list or object in `value` sits more than `max_depth` levels deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False
