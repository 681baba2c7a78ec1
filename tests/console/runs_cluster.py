"""A real cluster for runs tests: a control worker (with its beat: the sweep) and host agents,
as separate processes against the test database and the suite's Redis. Nothing is mocked: the
agents run real jobs (`manage.py run_attempt`) that train the demo model.

The cluster tests' fixtures live here too (tests/console/conftest.py imports them):

- `cluster`: a `Cluster` whose control worker runs; a test starts the host agents it needs. Its
  processes get `cluster_env` on top of `Cluster`'s environment: a module overrides that
  fixture to set its own (and may override `cluster` itself, requesting it, to add agents).
- `parity`: the demo model and the demo "parity" domain, registered for the owner's team.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from console.registry.demo import seed_demo_domain
from console.registry.models import Domain
from console.runs.demo import seed_models
from console.runs.models import TERMINAL_RUN_STATES, Run
from tests.conftest import People
from tests.console import runs_hold
from tests.e2e.conftest import database_url_for
from training.demo.domains import get_domain

BASE_DIR = Path(__file__).resolve().parents[2]


class Cluster:
    def __init__(self, work: Path, *, offline_after_s: int = 4) -> None:
        self.work = work
        self.tag = uuid.uuid4().hex[:6]
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url_for(connection.settings_dict),
            "RUNS_ROOT": str(work / "runs"),
            "REDIS_URL": settings.REDIS_URL,
            "HOST_HEARTBEAT_S": "1",
            "HOST_OFFLINE_AFTER_S": str(offline_after_s),
            "RUNS_SWEEP_S": "1",
            "HOST_CPU_SLOTS": "1",
            "PYTHONUNBUFFERED": "1",
            # Every job reads its Control through the test's gate (`hold`): see runs_hold.py.
            "RUNS_CONTROL_WRAPPER": "tests.console.runs_hold.HeldControl",
            runs_hold.HOLD_DIR_ENV: str(work / "holds"),
        }
        self.hold_dir = work / "holds"
        self.hold_dir.mkdir(parents=True, exist_ok=True)
        # The demo model stays where the suite built it (MODELS_ROOT under the real var/).
        self.env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command, cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.processes[name] = process
        return process

    def start_control(self) -> None:
        self._start(
            "control",
            [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "control",
             "-n", f"control-{self.tag}@test", "--pool", "solo", "-B",
             "-s", str(self.work / "beat-schedule"), "--without-gossip", "--without-mingle",
             "-l", "INFO"],
        )  # fmt: skip

    def host_name(self, name: str) -> str:
        return f"{name}-{self.tag}"

    def start_agent(self, name: str) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            [sys.executable, "manage.py", "host_agent", "--name", self.host_name(name)],
        )

    def kill(self, name: str) -> None:
        """SIGKILL the process itself (not its group): what a crash or the OOM killer does."""
        self.processes[name].kill()
        self.processes[name].wait()

    def hold(self, run_name: str, *, after_step: int, attempts: tuple[int, ...] = (1,)) -> None:
        """Each of the run's `attempts` waits, once it has done `after_step` steps, before its
        next one until `release` (its Control is asked only then). Set before the run starts."""
        for attempt in attempts:
            runs_hold.write_atomically(
                runs_hold.gate_path(self.hold_dir, run_name, attempt), str(after_step)
            )

    def wait_held(self, run_name: str, *, attempt: int = 1, timeout: float = 600) -> int:
        """Waits until that attempt's job is held; returns the steps it has done."""
        held = runs_hold.held_path(self.hold_dir, run_name, attempt)
        what = f"attempt {attempt} of {run_name} to be held"

        def held_or_ended() -> bool:
            if held.exists():
                return True
            # A run that ended first will never be held: say why now, not at the timeout.
            ended = Run.objects.filter(name=run_name, state__in=TERMINAL_RUN_STATES).first()
            if ended is not None:
                raise AssertionError(
                    f"{run_name} ended {ended.state} before {what}: {ended.error}\n{self.logs()}"
                )
            return False

        wait_for(held_or_ended, timeout=timeout, what=what, cluster=self)
        return int(held.read_text())

    def release(self, run_name: str, *, attempt: int = 1) -> None:
        runs_hold.gate_path(self.hold_dir, run_name, attempt).unlink()

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")[-6000:]

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)}" for name in self.processes)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_for(
    condition: Callable[[], Any], *, timeout: float, what: str, cluster: Cluster | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f"\n{cluster.logs()}" if cluster else "")
            )
        time.sleep(0.5)


@pytest.fixture
def cluster_env() -> dict[str, str]:
    """What the cluster's processes get on top of `Cluster`'s environment (nothing here; a test
    module overrides this fixture)."""
    return {}


@pytest.fixture
def cluster(tmp_path: Path, settings: Any, cluster_env: dict[str, str]) -> Iterator[Cluster]:
    settings.RUNS_ROOT = tmp_path / "runs"
    cluster = Cluster(tmp_path)
    cluster.env.update(cluster_env)
    cluster.start_control()
    yield cluster
    cluster.stop()


@pytest.fixture
def parity(people: People) -> Domain:
    seed_models(team=people.team, user=people.owner)
    return seed_demo_domain(
        team=people.team, user=people.owner, demo=get_domain("parity"), image=None
    )
