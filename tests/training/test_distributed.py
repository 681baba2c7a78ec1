"""World size 2 on the CPU: two ranks under torchrun (gloo), ZeRO-2, the real CLI entry point.

Each rank owns half of every step's prompt groups and its own rollout engine; gradients are
reduced across ranks, so the ranks must end with identical weights (compared through the
parameter digests both ranks report in the ``run.completed`` event), and rank 0 reports the
whole batch (both ranks' samples)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import tiny_spec

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_train_in_step_and_rank_0_reports_the_whole_batch(tiny_model_dir, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun is installed with torch"
    spec = tiny_spec(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        deepspeed={"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0},
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run(
        [
            torchrun,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "-m",
            "training",
            "run",
            str(spec_path),
            "--no-table",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    out = Path(spec["output_dir"])
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    started = events[0]
    assert started["kind"] == "run.started" and started["world_size"] == 2
    completed = events[-1]
    assert completed["kind"] == "run.completed"
    assert len(completed["parameter_digests"]) == 2 and completed["ranks_agree"] is True
    trajectories = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(trajectories) == 2 * 4 * 2  # both ranks' samples, gathered on rank 0
    groups = {json.loads(t)["provenance"]["group"] for t in trajectories[:8]}
    assert groups == {0, 1, 2, 3}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["actor/grad_norm"] > 0
    ckpt = Path(spec["checkpoint"]["dir"]) / "step_00000002"
    assert (ckpt / "rng_rank0.pt").is_file() and (ckpt / "rng_rank1.pt").is_file()
