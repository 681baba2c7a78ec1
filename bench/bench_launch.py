"""Launch-to-first-step latency of a run on an idle host agent, split into its parts, against
the same one-step spec run by the library's CLI in a plain process (the same run).

    .venv/bin/python bench/bench_launch.py [--repeats 3]

Parts (from the rows' own timestamps): launch (the service call: validation, pins, the row),
placement (launch committed -> attempt scheduled by the control worker), claim (scheduled ->
the agent claimed it), job start (claimed -> the job reported `run.started`: process, Django,
torch, the model), first step (started -> step 1's metrics committed). The baseline is
`python -m training run` of the same spec, from process start to its exit after one step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from bench._console import console

    def runs_env(work: Path) -> dict[str, str]:
        return {"RUNS_ROOT": str(work / "runs"), "HOST_HEARTBEAT_S": "1", "RUNS_SWEEP_S": "1",
                "PYTHONUNBUFFERED": "1"}  # fmt: skip

    # The demo model stays where it is built once (the default var/models).
    with console("bench-launch-", env=runs_env, own_var_dir=False) as (work, env):
        processes: list[subprocess.Popen[bytes]] = []
        try:
            return _bench(work, env, processes, args.repeats)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()


def _bench(work: Path, env: dict[str, str], processes: list, repeats: int) -> int:
    from django.contrib.auth import get_user_model

    from console.accounts.models import Team
    from console.registry.demo import seed_demo_domain
    from console.runs import services
    from console.runs.demo import seed_models
    from console.runs.launch import default_document
    from console.runs.models import Attempt, MetricRow, Run, RunEvent
    from training.demo.domains import get_domain

    user = get_user_model().objects.create(username="bench")
    team = Team.objects.create(slug="bench", name="Bench")
    seed_models(team=team, user=user)
    seed_demo_domain(team=team, user=user, demo=get_domain("parity"), image=None)
    logs = work / "logs"
    logs.mkdir()
    for name, command in (
        ("control", [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "control",
                     "-n", "control-bench@local", "--pool", "solo", "-B",
                     "-s", str(work / "beat"), "-l", "WARNING"]),
        ("agent", [sys.executable, "manage.py", "host_agent", "--name", "bench-host"]),
    ):  # fmt: skip
        processes.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=(logs / f"{name}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
    time.sleep(8)  # both up and the host's first heartbeat in

    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(max_steps=1)
    document["batch"].update(prompts_per_step=4, group_size=4)
    document["eval"].update(at_start=False, at_end=False)
    document["checkpoint"].update(save_final=False)

    rows = []
    for repeat in range(repeats):
        document["name"] = f"latency-{repeat}"
        start = time.time()
        run = services.run_launch(actor=user, team=team, document=document)
        launched = time.time()
        deadline = time.time() + 600
        while not MetricRow.objects.filter(run=run, step=1).exists():
            if time.time() > deadline:
                print((logs / "agent.log").read_text()[-3000:])
                raise SystemExit("no first step in 600 s")
            time.sleep(0.05)
        run = Run.objects.get(pk=run.pk)
        attempt = Attempt.objects.get(run=run, number=1)
        started = RunEvent.objects.get(run=run, kind="run.started").created_at.timestamp()
        step1 = MetricRow.objects.get(run=run, step=1).updated_at.timestamp()
        rows.append(
            {
                "launch": launched - start,
                "placement": attempt.scheduled_at.timestamp() - launched,
                "claim": attempt.started_at.timestamp() - attempt.scheduled_at.timestamp(),
                "job start": started - attempt.started_at.timestamp(),
                "first step": step1 - started,
                "total": step1 - start,
            }
        )
        # Idle again: the agent has seen the job exit (it records the exit code last).
        while Attempt.objects.get(pk=attempt.pk).exit_code is None:
            time.sleep(0.2)
        time.sleep(1.0)

    # Baseline: the same spec (the run's pinned training spec) through the CLI.
    spec = dict(Run.objects.get(name="latency-0").spec)
    spec["output_dir"] = str(work / "cli")
    spec["checkpoint"] = {**spec["checkpoint"], "dir": str(work / "cli" / "ckpt")}
    spec_path = work / "cli-spec.json"
    spec_path.write_text(json.dumps(spec))
    baseline = []
    for _ in range(repeats):
        start = time.time()
        subprocess.run([sys.executable, "-m", "training", "run", str(spec_path)], cwd=ROOT,
                       env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        baseline.append(time.time() - start)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    print(f"median of {repeats} launches, seconds:")
    for part in ("launch", "placement", "claim", "job start", "first step", "total"):
        print(f"  {part:<11} {median([r[part] for r in rows]):7.2f}")
    cli = median(baseline)
    total = median([r["total"] for r in rows])
    print(f"  CLI, same spec, process start to exit after step 1: {cli:.2f}")
    print(f"  console launch-to-first-step / CLI: {total / cli:.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
