"""World size 2 on the CPU: two ranks under torchrun (gloo), ZeRO-2, the real CLI entry point.

Each rank owns half of every step's prompt groups and its own rollout engine; gradients are
reduced across ranks, so the ranks must end with identical weights (compared through the
parameter digests both ranks report in the ``run.completed`` event), and rank 0 reports the
whole batch (both ranks' samples)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import tiny_spec

REPO = Path(__file__).resolve().parents[2]


def torchrun_two_ranks(args: list[str]) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 <args>`` on the CPU (gloo); asserts it succeeded.

    ``--standalone`` has the rendezvous store bind a free port itself: a port picked here and
    passed as ``--master_port`` could be taken by another process before torchrun binds it."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun is installed with torch"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


def run_two_ranks(model_dir: Path, tmp_path: Path, stage: int) -> dict:
    """Runs a 2-step spec under ``torchrun --nproc_per_node 2``; returns the spec."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tiny_spec(
        model_dir,
        tmp_path,
        max_steps=2,
        deepspeed={"zero_optimization": {"stage": stage}, "gradient_clipping": 1.0},
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    torchrun_two_ranks(["-m", "training", "run", str(spec_path), "--no-table"])
    return spec


def read_metrics(spec: dict) -> list[dict]:
    lines = (Path(spec["output_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_two_ranks_train_in_step_and_rank_0_reports_the_whole_batch(tiny_model_dir, tmp_path):
    spec = run_two_ranks(tiny_model_dir, tmp_path, stage=2)
    out = Path(spec["output_dir"])
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    started = events[0]
    assert started["kind"] == "run.started" and started["world_size"] == 2
    completed = events[-1]
    assert completed["kind"] == "run.completed"
    assert len(completed["parameter_digests"]) == 2 and completed["ranks_agree"] is True
    # Each step's timeline holds both ranks' stages.
    timelines = [e for e in events if e["kind"] == "step.timeline"]
    assert [t["step"] for t in timelines] == [1, 2]
    for timeline in timelines:
        for rank in (0, 1):
            mine = [s["stage"] for s in timeline["stages"] if s["rank"] == rank]
            assert mine == ["rollout", "reward", "logprobs", "train", "weight_sync"], timeline
    trajectories = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(trajectories) == 2 * 4 * 2  # both ranks' samples, gathered on rank 0
    groups = {json.loads(t)["provenance"]["group"] for t in trajectories[:8]}
    assert groups == {0, 1, 2, 3}
    metrics = read_metrics(spec)
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["actor/grad_norm"] > 0
    ckpt = Path(spec["checkpoint"]["dir"]) / "step_00000002"
    assert (ckpt / "rng_rank0.pt").is_file() and (ckpt / "rng_rank1.pt").is_file()


@pytest.mark.slow
def test_zero_0_reports_the_norm_of_the_averaged_gradient_like_zero_2(tiny_model_dir, tmp_path):
    # Stage 0's norm is computed by the trainer from the gradients DeepSpeed has averaged in
    # backward; ZeRO-2's is DeepSpeed's own global norm. A rank's local norm would differ.
    zero_2 = read_metrics(run_two_ranks(tiny_model_dir, tmp_path / "zero2", stage=2))
    zero_0 = read_metrics(run_two_ranks(tiny_model_dir, tmp_path / "zero0", stage=0))
    assert zero_0[0]["actor/grad_norm"] == pytest.approx(zero_2[0]["actor/grad_norm"], rel=1e-3)


@pytest.mark.slow
def test_zero3_ranks_with_different_row_counts_score_without_waiting_forever(
    tiny_model_dir, tmp_path
):
    # Each ZeRO-3 forward gathers parameters from every rank; a rank with fewer micro-batches
    # used to leave the other waiting in its next gather (a hang, not an error).
    worker = REPO / "tests" / "training" / "zero3_scoring_worker.py"
    # Each rank writes its own file: two ranks' buffered stdout can interleave in one pipe.
    torchrun_two_ranks([str(worker), str(tiny_model_dir), str(tmp_path)])
    by_rank = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert by_rank[0]["lengths"] == [3, 3, 3, 3, 0] and by_rank[1]["lengths"] == [3, 0]
    assert by_rank[0]["first"] == pytest.approx(by_rank[1]["first"], abs=1e-6)
