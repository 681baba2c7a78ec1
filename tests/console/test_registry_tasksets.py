"""Reading JSONL task sets: every kind of bad line is reported by line number; memory per line is
bounded by the cap. No database here."""

from __future__ import annotations

import io
import json

import pytest

from console.registry.models import TaskSplit
from console.registry.tasksets import (
    ParsedTask,
    RowError,
    TasksetFileError,
    held_out,
    parse_task,
    read_tasks,
)
from training.spec import RunSpec, SpecError
from training.tasks import SPLITS, task_problem


def read(data: bytes, max_line_bytes: int = 10_000) -> list[tuple[int, ParsedTask | RowError]]:
    return list(read_tasks(io.BytesIO(data), max_line_bytes=max_line_bytes))


def errors(data: bytes, **kwargs: int) -> dict[int, str]:
    return {n: row.message for n, row in read(data, **kwargs) if isinstance(row, RowError)}


def test_prompt_and_messages_rows_are_read_with_their_line_numbers() -> None:
    data = (
        b'{"prompt": "2+2?", "ground_truth": "4", "metadata": {"source": "gsm"}}\n'
        b"\n"
        b'{"messages": [{"role": "user", "content": "hi"}], "ground_truth": null}\n'
        b'{"prompt": "x", "ground_truth": [1, 2], "split": "held_out"}'  # no final newline
    )
    rows = read(data)
    assert [n for n, _ in rows] == [1, 3, 4]
    first, second, third = (row for _, row in rows)
    assert isinstance(first, ParsedTask) and first.prompt == "2+2?"
    assert first.metadata == {"source": "gsm"}
    assert isinstance(second, ParsedTask) and second.messages == [{"role": "user", "content": "hi"}]
    assert second.ground_truth is None and second.prompt == ""
    assert isinstance(third, ParsedTask) and third.split == "held_out"


def test_broken_json_is_reported_with_line_and_column() -> None:
    found = errors(b'{"prompt": "a", "ground_truth": 1}\n{"prompt": "b", ground_truth: 2}\n')
    assert list(found) == [2]
    assert found[2].startswith("broken JSON:") and "column 17" in found[2]


def test_missing_fields_are_named() -> None:
    found = errors(
        b'{"prompt": "no answer"}\n'
        b'{"ground_truth": 1}\n'
        b'{"prompt": "", "ground_truth": 1}\n'
        b'{"messages": [{"content": "x"}], "ground_truth": 1}\n'
    )
    assert found[1] == "missing required field 'ground_truth'"
    assert found[2] == 'needs a "prompt" (text) or "messages" (a list of chat messages)'
    assert found[3] == "prompt: Expected `str` of length >= 1"
    assert found[4] == "messages[0]: missing required field 'role'"


def test_wrong_types_and_unknown_fields_are_explained() -> None:
    found = errors(
        b'[1, 2]\n{"prompt": 5, "ground_truth": 1}\n'
        b'{"prompt": "a", "ground_truth": 1, "extra": 1}\n'
        b'{"prompt": "a", "ground_truth": 1, "split": "test"}\n'
    )
    assert found[1] == "each line must be a JSON object, got an array"
    assert found[2] == "prompt: Expected `str`, got `int`"
    assert found[3] == (
        "unknown field 'extra'; allowed fields: prompt, messages, ground_truth, metadata, split"
    )
    assert found[4] == "split: Invalid enum value 'test'"


def test_json_that_postgres_cannot_store_is_refused_per_line() -> None:
    found = errors(
        b'{"prompt": "a", "ground_truth": NaN}\n'
        b'{"prompt": "a\\ud800", "ground_truth": 1}\n'
        b'{"prompt": "a\\u0000b", "ground_truth": 1}\n'
        b'{"prompt": "a\\\\u0000b", "ground_truth": 1}\n'
    )
    assert found[1].startswith("JSON the database cannot store")
    assert found[2].startswith("JSON the database cannot store")
    assert found[3] == "contains a NUL character (\\u0000), which cannot be stored"
    assert 4 not in found  # an escaped backslash followed by "u0000" is ordinary text


def test_invalid_utf8_names_the_byte_and_position() -> None:
    found = errors(
        b'{"prompt": "ok", "ground_truth": 1}\n{"prompt": "caf\xe9", "ground_truth": 1}\n'
    )
    assert found == {2: "not valid UTF-8 (byte 0xe9 at position 16); task sets must be UTF-8"}


def test_a_utf16_file_is_refused_as_a_whole() -> None:
    data = '{"prompt": "a", "ground_truth": 1}\n'.encode("utf-16")
    with pytest.raises(TasksetFileError, match="UTF-16"):
        read(data)


def test_a_utf8_byte_order_mark_is_accepted() -> None:
    rows = read(b'\xef\xbb\xbf{"prompt": "a", "ground_truth": 1}\n')
    assert isinstance(rows[0][1], ParsedTask)


def test_a_line_over_the_cap_is_skipped_without_reading_it_whole() -> None:
    long_line = json.dumps({"prompt": "x" * 50_000, "ground_truth": 1}).encode()
    data = long_line + b'\n{"prompt": "after", "ground_truth": 2}\n'

    class CountingStream(io.BytesIO):
        biggest_read = 0

        def readline(self, size: int | None = -1) -> bytes:
            line = super().readline(size)
            CountingStream.biggest_read = max(CountingStream.biggest_read, len(line))
            return line

    rows = list(read_tasks(CountingStream(data), max_line_bytes=1000))
    assert isinstance(rows[0][1], RowError)
    assert rows[0][1].message == "line is longer than the limit of 1,000 bytes"
    assert rows[1][0] == 2 and isinstance(rows[1][1], ParsedTask)
    assert rows[1][1].prompt == "after"
    # The 50 kB line was consumed in pieces no bigger than the skip chunk, never whole.
    assert CountingStream.biggest_read <= 64 * 1024 < len(long_line) + 64 * 1024


def test_a_line_exactly_at_the_cap_is_accepted() -> None:
    line = json.dumps({"prompt": "y" * 10, "ground_truth": 1}).encode()
    rows = read(line + b"\n", max_line_bytes=len(line))
    assert isinstance(rows[0][1], ParsedTask)
    assert isinstance(read(line + b"\n", max_line_bytes=len(line) - 1)[0][1], RowError)


def test_the_split_is_seeded_and_close_to_the_fraction() -> None:
    first = [held_out(7, i, 0.2) for i in range(5000)]
    again = [held_out(7, i, 0.2) for i in range(5000)]
    other_seed = [held_out(8, i, 0.2) for i in range(5000)]
    assert first == again
    assert first != other_seed
    assert 0.17 < sum(first) / 5000 < 0.23
    assert not any(held_out(1, i, 0) for i in range(100))
    assert all(held_out(1, i, 1) for i in range(100))


def test_an_upload_accepts_exactly_the_tasks_a_run_accepts() -> None:
    # One task shape (training.tasks): the registry's line check and the run spec's task check
    # agree on every case, accepted and refused, and both name the same problem.
    cases = [
        {"prompt": "p", "ground_truth": 1},
        {"messages": [{"role": "user", "content": "hi"}], "ground_truth": None},
        {"prompt": "p", "ground_truth": 1, "metadata": {"task_id": 3}, "split": "held_out"},
        {"messages": [{"role": "system", "content": None}], "ground_truth": [1, 2]},
        {"prompt": "p"},
        {"ground_truth": 1},
        {"prompt": "", "ground_truth": 1},
        {"messages": [], "ground_truth": 1},
        {"messages": [{"content": "x"}], "ground_truth": 1},
        {"prompt": "p", "ground_truth": 1, "split": "test"},
        {"prompt": "p", "ground_truth": 1, "extra": 1},
        {"prompt": 5, "ground_truth": 1},
        {"prompt": "p", "ground_truth": 1, "metadata": []},
    ]
    rubric = {"version": 1, "criteria": [{"name": "c", "kind": "exact_match"}]}
    for task in cases:
        parsed = parse_task(json.dumps(task).encode(), 1)
        spec = {
            "base_model": "demo",
            "domains": [{"name": "a", "rubric_spec": rubric, "tasks": [task]}],
        }
        try:
            RunSpec.from_dict(spec)
            run_refuses = None
        except SpecError as refused:
            run_refuses = refused.errors
        if isinstance(parsed, ParsedTask):
            assert run_refuses is None, (task, run_refuses)
            assert task_problem(task) is None
        else:
            assert run_refuses is not None and len(run_refuses) == 1, (task, parsed)
            where = "domains[0].tasks[0]"
            assert run_refuses[0] in (f"{where}.{parsed}", f"{where}: {parsed}"), (
                run_refuses,
                parsed,
            )
            assert task_problem(task) == parsed


def test_the_registry_splits_are_the_training_splits() -> None:
    assert tuple(TaskSplit.values) == SPLITS
