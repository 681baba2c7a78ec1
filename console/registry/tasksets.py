"""Reading a JSONL task set line by line from a file on disk, with bounded memory.

Each line holds one task: `{"prompt": "...", "ground_truth": ..., "metadata": {...}}` or
`{"messages": [{"role": "user", "content": "..."}], "ground_truth": ...}`; an optional
`"split": "train" | "held_out"` overrides the seeded split. Blank lines are skipped.

Nothing here touches the database: `read_tasks` yields parsed rows and row errors in file
order; the service decides what to store. Lines are read with a size cap, so a 10 MB line or a
file without newlines costs at most `max_line_bytes` of memory, never the whole file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from jsonschema import Draft202012Validator

ALLOWED_KEYS = ("prompt", "messages", "ground_truth", "metadata", "split")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "minLength": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "role": {"enum": list(MESSAGE_ROLES)},
                    "content": {"type": ["string", "null", "array"]},
                    "name": {"type": "string"},
                    "tool_calls": {"type": "array"},
                    "tool_call_id": {"type": "string"},
                },
                "required": ["role", "content"],
            },
        },
        "ground_truth": {},
        "metadata": {"type": "object"},
        "split": {"enum": ["train", "held_out"]},
    },
    "required": ["ground_truth"],
    "additionalProperties": False,
}
_VALIDATOR = Draft202012Validator(TASK_SCHEMA)

# How much of a too-long line is read at a time while skipping to its end.
_SKIP_CHUNK = 64 * 1024


class TasksetFileError(ValueError):
    """The file as a whole cannot be read as a task set (wrong encoding, too big)."""


@dataclass(frozen=True)
class RowError:
    line_number: int
    message: str


@dataclass
class ParsedTask:
    line_number: int
    prompt: str
    messages: list[dict[str, Any]] | None
    ground_truth: Any
    metadata: dict[str, Any]
    split: str | None


@dataclass
class ReadSummary:
    lines: int = 0
    valid: int = 0
    invalid: int = 0
    errors: list[RowError] = field(default_factory=list)


def held_out(seed: int, index: int, fraction: float) -> bool:
    """Whether task `index` is held out: a hash of (seed, index), so the split does not depend
    on reading order or file length and the same seed always gives the same split."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def _json_path(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(error: Any) -> str:
    where = _json_path(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(TASK_SCHEMA["properties"]))
        allowed = ", ".join(ALLOWED_KEYS)
        return f"unknown field(s) {', '.join(map(repr, extra))}; allowed fields: {allowed}"
    if error.validator == "required":
        missing = error.message.split(" ")[0]
        prefix = f"{where}: " if where else ""
        return f"{prefix}missing required field {missing}"
    if error.validator == "minLength" and where == "prompt":
        return "prompt: must not be empty"
    if error.validator == "type" and not where:
        return f"each line must be a JSON object, got {type(error.instance).__name__}"
    return f"{where or 'line'}: {error.message}"


def check_task(value: Any, line_number: int) -> ParsedTask | list[str]:
    """The task on one line, or the problems with it."""
    problems = [_describe(error) for error in _VALIDATOR.iter_errors(value)]
    if not problems and "prompt" not in value and "messages" not in value:
        problems.append('needs a "prompt" (text) or "messages" (a list of chat messages)')
    if problems:
        return sorted(problems)
    return ParsedTask(
        line_number=line_number,
        prompt=value.get("prompt", ""),
        messages=value.get("messages"),
        ground_truth=value["ground_truth"],
        metadata=value.get("metadata", {}),
        split=value.get("split"),
    )


def _read_line(stream: IO[bytes], max_line_bytes: int) -> tuple[bytes, bool] | None:
    """The next line (without its newline) and whether it was over the cap; None at the end of
    the file. A too-long line is consumed to its end in chunks and not returned."""
    raw = stream.readline(max_line_bytes + 1)
    if not raw:
        return None
    if raw.endswith(b"\n"):
        return raw[:-1].rstrip(b"\r"), False
    if len(raw) <= max_line_bytes:
        return raw.rstrip(b"\r"), False  # the last line, without a trailing newline
    while True:
        rest = stream.readline(_SKIP_CHUNK)
        if not rest or rest.endswith(b"\n"):
            return b"", True


def read_tasks(
    stream: IO[bytes], *, max_line_bytes: int
) -> Iterator[tuple[int, ParsedTask | RowError]]:
    """(line number, task or error) for each non-blank line of a binary JSONL stream."""
    head = stream.read(4)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise TasksetFileError(
            "The file is UTF-16; task sets must be UTF-8 JSONL (save it as UTF-8 and upload again)"
        )
    stream.seek(0)
    line_number = 0
    while True:
        line = _read_line(stream, max_line_bytes)
        if line is None:
            return
        raw, too_long = line
        line_number += 1
        if too_long:
            yield (
                line_number,
                RowError(line_number, f"line is longer than the limit of {max_line_bytes:,} bytes"),
            )
            continue
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark, as some editors write
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield (
                line_number,
                RowError(
                    line_number,
                    f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at position {exc.start + 1}); "
                    "task sets must be UTF-8",
                ),
            )
            continue
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            yield (
                line_number,
                RowError(line_number, f"broken JSON: {exc.msg} at column {exc.colno}"),
            )
            continue
        checked = check_task(value, line_number)
        if isinstance(checked, ParsedTask):
            yield line_number, checked
        else:
            yield line_number, RowError(line_number, "; ".join(checked))
