"""What an audit entry changed, field by field, for the log's page: the stored before and after
states are whole objects (a rubric version's spec, an image's limits), and listing them in full
made a page of 28 entries 18,000 px tall. Nested objects are compared by dotted path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# A value longer than this is cut in the page (the stored entry keeps it whole).
MAX_VALUE_CHARS = 600
_MISSING = object()


@dataclass(frozen=True)
class FieldChange:
    field: str
    before: str  # "" when the field did not exist before (a creation)
    after: str  # "" when it no longer exists (a deletion)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix or "value": value}


def _shown(value: Any) -> str:
    if value is _MISSING:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_VALUE_CHARS:
        return text[:MAX_VALUE_CHARS] + f"… ({len(text):,} characters)"
    return text


def field_changes(before: Any, after: Any) -> list[FieldChange]:
    """The fields whose value differs between the two states, in name order."""
    old = _flatten(before) if before is not None else {}
    new = _flatten(after) if after is not None else {}
    changes = []
    for name in sorted(old.keys() | new.keys()):
        was, now = old.get(name, _MISSING), new.get(name, _MISSING)
        if was != now:
            changes.append(FieldChange(field=name, before=_shown(was), after=_shown(now)))
    return changes
