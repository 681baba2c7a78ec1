"""Reading a JSONL task set line by line from a file on disk, with bounded memory.

Each line holds one task in the training library's task shape (`training.tasks`, the one
definition: what an upload accepts is what a run accepts): `{"prompt": "...", "ground_truth":
..., "metadata": {...}}` or `{"messages": [{"role": "user", "content": "..."}], "ground_truth":
...}`; an optional `"split": "train" | "held_out"` overrides the seeded split. Blank lines are
skipped. What only the console adds: JSON depth, NUL characters, what PostgreSQL can store.

Nothing here touches the database: `read_tasks` yields parsed rows and row errors in file
order; the service decides what to store. Lines are read with a size cap, so a 10 MB line or a
file without newlines costs at most `max_line_bytes` of memory, never the whole file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import msgspec

from console.registry.jsonvalues import MAX_JSON_DEPTH, nested_too_deep
from training.tasks import task_problem

_TOO_DEEP = f"nested more than {MAX_JSON_DEPTH} levels deep"

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


# The split hashes "<seed>:<index>" with MD5 and keeps the first 60 bits, because PostgreSQL
# computes the same in SQL (`split_hash_sql`), so a domain can be re-split in one UPDATE.
SPLIT_HASH_BITS = 60


def split_threshold(fraction: float) -> int:
    """Tasks whose hash is below this are held out (integer, so Python and SQL agree exactly)."""
    return int(min(max(fraction, 0.0), 1.0) * 2**SPLIT_HASH_BITS)


def split_hash(seed: int, index: int) -> int:
    digest = hashlib.md5(f"{seed}:{index}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[: SPLIT_HASH_BITS // 4], 16)


def split_hash_sql(seed_param: str, index_column: str) -> str:
    """The same hash in PostgreSQL, for `seed_param` (a placeholder) and a column of indexes."""
    digits = SPLIT_HASH_BITS // 4
    # The parentheses matter: `::` binds tighter than unary minus, so `-5::text` would be
    # `-('5'::text)`, an error for every negative seed.
    return (
        f"('x' || substr(md5(({seed_param})::bigint::text || ':' || {index_column}::text), "
        f"1, {digits}))"
        f"::bit({SPLIT_HASH_BITS})::bigint"
    )


def held_out(seed: int, index: int, fraction: float) -> bool:
    """Whether task `index` is held out: decided by a hash of (seed, index), so the split does
    not depend on reading order or file length and the same seed always gives the same split."""
    return split_hash(seed, index) < split_threshold(fraction)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _json_problem(raw: bytes, error: msgspec.DecodeError) -> str:
    # The standard library's message names the column; msgspec's names a byte offset.
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"broken JSON: {exc.msg} at column {exc.colno}"
    except (ValueError, RecursionError):
        pass
    return (
        f"JSON the database cannot store ({error}): NaN, Infinity, numbers out of range and "
        "unpaired \\u surrogates are not allowed"
    )


def parse_task(raw: bytes, line_number: int) -> ParsedTask | str:
    """The task on one line of UTF-8 JSON, or what is wrong with it."""
    try:
        value = msgspec.json.decode(raw)
    except RecursionError:
        return _TOO_DEEP
    except msgspec.DecodeError as exc:
        return _json_problem(raw, exc)
    # A line with fewer brackets than the limit cannot be too deep: most lines skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nested_too_deep(value):
        # Checked before anything recurses over the value (the schema check, the NUL scan,
        # and json.loads when the row is read back from the database).
        return _TOO_DEEP
    problem = task_problem(value)  # the training library's task shape: one for both layers
    if problem is not None:
        return problem
    if b"\\u0000" in raw and _has_nul(value):
        return "contains a NUL character (\\u0000), which cannot be stored"
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
        parsed = parse_task(raw, line_number)
        if isinstance(parsed, ParsedTask):
            yield line_number, parsed
        else:
            yield line_number, RowError(line_number, parsed)
