"""The command line (and the functions the console reuses), and the maths worker pool."""

from __future__ import annotations

import json

import pytest

from rewards.cli import main, result_rows, try_rubric
from rewards.rubric import DeadlineExceeded
from rewards.workers import WorkerError, WorkerPool

RUBRIC = {
    "version": 1,
    "criteria": [
        {"name": "correct", "kind": "math_equivalence", "weight": 1},
        {"name": "short", "kind": "length_penalty", "weight": 0.5, "params": {"budget_tokens": 5}},
    ],
}


@pytest.fixture
def files(tmp_path):
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps(RUBRIC))
    samples = tmp_path / "samples.jsonl"
    rows = [
        {"domain": "math", "prompt": "1+1", "completion": r"\boxed{2}", "ground_truth": "2"},
        {
            "domain": "math",
            "prompt": "1+1",
            "completion": "it is three, so 3 " * 3,
            "ground_truth": "2",
        },
    ]
    samples.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return tmp_path, rubric, samples


def test_score_prints_a_table_of_totals_and_breakdowns(files, capsys):
    _, rubric, samples = files
    assert main(["score", "--rubric", str(rubric), "--samples", str(samples)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#", "total", "correct", "short"]
    assert lines[2].split() == ["0", "1.5000", "1.0000", "1.0000"]
    assert lines[3].split()[:3] == ["1", "0.0000", "0.0000"]
    assert lines[4].split()[:2] == ["mean", "0.7500"]


def test_score_reads_yaml_and_prints_json_lines(files, capsys):
    directory, _, samples = files
    rubric = directory / "rubric.yaml"
    rubric.write_text("version: 1\ncriteria:\n  - {name: correct, kind: math_equivalence}\n")
    assert main(["score", "--rubric", str(rubric), "--samples", str(samples), "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["total"] == 1.0 and first["breakdown"] == {"correct": 1.0}


def test_bad_inputs_name_the_file_and_line(files, capsys):
    directory, rubric, _ = files
    broken = directory / "broken.jsonl"
    broken.write_text('{"prompt": "p", "completion": "x"}\n{"prompt": "p"}\n')
    assert main(["score", "--rubric", str(rubric), "--samples", str(broken)]) == 2
    assert f"{broken}:2: a sample needs a 'completion' or 'messages'" in capsys.readouterr().err
    bad_rubric = directory / "bad.json"
    bad_rubric.write_text(json.dumps({"version": 1, "criteria": [{"name": "x", "kind": "nope"}]}))
    assert main(["validate", "--rubric", str(bad_rubric)]) == 1
    assert "criteria[0].kind: unknown kind 'nope'" in capsys.readouterr().out
    assert main(["score", "--rubric", str(bad_rubric), "--samples", str(broken)]) == 2


def test_the_console_helpers_score_one_sample_and_report_criterion_errors():
    spec = {"version": 1, "criteria": [
        {"name": "n", "kind": "numeric_match"},
        {"name": "j", "kind": "json_schema", "params": {"schema": {"type": "object"}}},
    ]}  # fmt: skip
    results = try_rubric(spec, [{"prompt": "p", "completion": "7"}])
    (row,) = result_rows(["n", "j"], results)
    assert row["scores"] == {"n": 0.0, "j": 0.0}
    assert "no ground_truth" in row["errors"]["n"]


def test_the_worker_pool_kills_an_overrunning_call_and_recovers():
    pool = WorkerPool(size=1)
    try:
        with pytest.raises(DeadlineExceeded):
            pool.call("time", "sleep", (30,), timeout_s=0.5)
        assert pool.call("math", "factorial", (5,), timeout_s=10) == 120
        with pytest.raises(WorkerError, match="ValueError"):
            pool.call("math", "sqrt", (-1,), timeout_s=10)
    finally:
        pool.close()
