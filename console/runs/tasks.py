"""Celery tasks for runs. Thin: each claims or decides through `console.runs.services`.

- ``runs.place`` (one pass of the scheduler, `console.scheduling.services.schedule_pass`) and
  ``runs.sweep`` (then a pass) run on the ``control`` queue (the sweep every RUNS_SWEEP_S from
  the control worker's beat: the scheduler's periodic tick).
- ``runs.execute_attempt`` runs on ``host.<name>``: only that host's agent consumes it (a gang
  sends one per host, each with its node).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="runs.place", ignore_result=True)
def place_runs() -> int:
    from console.runs import services

    return len(services.place_runs())


@shared_task(name="runs.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    from console.runs import services

    return services.sweep()


# acks_late with a re-delivered message is safe: the attempt row is claimed first.
@shared_task(name="runs.execute_attempt", ignore_result=True, acks_late=True)
def execute_attempt(attempt_id: int, node: int = 0) -> dict[str, Any]:
    from console.runs import agent

    return agent.execute(attempt_id, node)
