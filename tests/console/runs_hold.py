"""A run held at a known step, for the cluster tests.

`HeldControl` wraps the console's own `Control` in the jobs of a test's cluster
(``RUNS_CONTROL_WRAPPER`` names it; `runs_cluster.Cluster` sets it). Before every step it
looks for the test's gate file for its run and attempt; while the gate names a step no later
than the one about to run, the job waits there (and says so in a ``.held`` file), before its
Control is asked. A test that must act on a running run (preempt it, kill one of its nodes)
holds it, waits until the job is held, acts, and releases it: however fast a step is on the
machine, the run cannot end before the test's action reaches it. The job's real Control then
reads what the test did at the very step it was held before.

Why this leaves no race: the gate is written before the run is launched, so no attempt can get
past step N before the test is ready, however early it starts; the job asks its Control only
after it has left the gate; and the test removes the gate only once its action is committed (an
API call that answered, a process it killed), so that action is what the Control reads at step
N. Nothing depends on how long a step takes; a slow machine only waits longer at the gate.

Imported by the jobs (``manage.py run_attempt``), so nothing here imports pytest."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from training.control import Control, ControlDecision

HOLD_DIR_ENV = "RUNS_HOLD_DIR"


def gate_path(hold_dir: Path, run_name: str, attempt: int) -> Path:
    return hold_dir / f"{run_name}.{attempt}"


def held_path(hold_dir: Path, run_name: str, attempt: int) -> Path:
    return hold_dir / f"{run_name}.{attempt}.held"


def write_atomically(path: Path, text: str) -> None:
    """The reader sees the old file or the whole new one, never a part."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def read_step(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return None


class HeldControl:
    def __init__(self, attempt: Any, inner: Control) -> None:
        self.inner = inner
        hold_dir = Path(os.environ[HOLD_DIR_ENV])
        self.gate = gate_path(hold_dir, attempt.run.name, attempt.number)
        self.held = held_path(hold_dir, attempt.run.name, attempt.number)

    def poll(self, step: int) -> ControlDecision:
        # `step` steps are done; the gate's step N holds the job once it has done N of them.
        while (at := read_step(self.gate)) is not None and step >= at:
            if not self.held.exists():
                write_atomically(self.held, str(step))
            time.sleep(0.05)
        return self.inner.poll(step)
