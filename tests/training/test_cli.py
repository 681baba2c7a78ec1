"""`python -m training run spec.json` in a subprocess: table, JSONL files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import tiny_spec

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    return subprocess.run(
        [sys.executable, "-m", "training", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_a_run_prints_a_table_and_writes_jsonl(tiny_model_dir, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(tiny_spec(tiny_model_dir, tmp_path, max_steps=2)))
    result = run_cli("run", spec_path, "--output", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    header = next(line for line in result.stdout.splitlines() if "reward" in line)
    assert header.split()[:3] == ["step", "reward", "pass"]
    assert json.loads(result.stdout.strip().splitlines()[-1])["status"] == "completed"
    metrics = lines(tmp_path / "out" / "metrics.jsonl")
    assert [row["step"] for row in metrics] == [1, 2]
    assert len(lines(tmp_path / "out" / "trajectories.jsonl")) == 2 * 4 * 2
    kinds = [e["kind"] for e in lines(tmp_path / "out" / "events.jsonl")]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed"
    assert lines(tmp_path / "out" / "checkpoints.jsonl")[-1]["reason"] == "final"


@pytest.mark.slow
def test_a_control_file_asking_to_preempt_checkpoints_and_exits_3(tiny_model_dir, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(tiny_spec(tiny_model_dir, tmp_path, max_steps=2)))
    control = tmp_path / "control.json"
    control.write_text('{"preempt": true}')
    result = run_cli("run", spec_path, "--control", control, "--output", tmp_path / "out")
    assert result.returncode == 3, result.stderr[-3000:]
    assert (tmp_path / "ckpt" / "step_00000000" / "COMPLETE").is_file()


def test_an_invalid_spec_exits_2_naming_the_field(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"base_model": "x", "domains": [], "lr": "fast"}))
    result = run_cli("run", spec_path, timeout=120)
    assert result.returncode == 2
    assert "lr: must be a finite number" in result.stderr
    assert "domains: must not be empty" in result.stderr


def test_example_spec_is_a_valid_spec():
    result = run_cli("example-spec", "--steps", "5", timeout=120)
    assert result.returncode == 0, result.stderr
    from training.spec import RunSpec

    assert RunSpec.from_dict(json.loads(result.stdout)).max_steps == 5
