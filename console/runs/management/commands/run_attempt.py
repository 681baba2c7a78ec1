"""`manage.py run_attempt ID`: one attempt's job, started by the host agent (never by hand in
production: the agent claims the attempt first). Builds the `RunSpec` from the run's pinned
spec (`services.attempt_training_spec`: saving in the attempt's own directory), resumes from
the checkpoint the attempt was given, and calls
``training.run(spec, ConsoleSink(attempt), ConsoleControl(attempt))``; then records the outcome.
Ranks other than 0 (under torchrun, or on a gang's other hosts) report nothing: rank 0 speaks
for the job. In a gang, rank 0 does not report a failure that another node's death caused:
the agents end the attempt as that node's death, and the run resumes. A job whose attempt
is no longer its run's current one (lost, and the run moved on) stops without reporting: its
writes and its commands are refused (`console.runs.sink`), and the outcome is the newer
attempt's to record.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from console.broadcast import flush_soon
from console.runs import agent, services
from console.runs.models import Attempt, RunEvent

PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """The kernel kills this process when the agent that started it dies; and if the agent is
    already gone (we were re-parented before this ran), stop now."""
    expected = os.environ.get(agent.AGENT_PID_ENV)
    if not expected:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # A torchrun worker's parent is torchrun, not the agent.
    if os.environ.get("TORCHELASTIC_RUN_ID") is None and os.getppid() != int(expected):
        sys.exit("the host agent that started this job is gone")


class Command(BaseCommand):
    help = "Runs one attempt of a run (started by the host agent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("attempt_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        die_with_agent()
        import training
        from console.runs.sink import ConsoleControl, ConsoleSink
        from training.control import SignalControl, StaticControl
        from training.sink import NullSink
        from training.spec import RunSpec

        try:
            attempt = Attempt.objects.select_related("run", "host").get(pk=options["attempt_id"])
        except Attempt.DoesNotExist:
            raise CommandError(f"no attempt {options['attempt_id']}") from None
        rank = int(os.environ.get("RANK", "0"))
        spec = RunSpec.from_dict(services.attempt_training_spec(attempt))
        refusals: list[Any] = []  # what says, after the run, that the attempt was not current
        if rank == 0:
            # SIGTERM (the agent's first step when a preemption is approved) is a preempt too:
            # checkpoint, then stop. Installed before the attempt is marked running, which is
            # when the agent may send it.
            control: Any = ConsoleControl(attempt)
            refusals.append(control)
            if settings.RUNS_CONTROL_WRAPPER:
                control = import_string(settings.RUNS_CONTROL_WRAPPER)(attempt, control)
            control = SignalControl(control, signals=(signal.SIGTERM,))
            services.attempt_started(attempt, pid=os.getpid())
            self.stdout.write(
                f"attempt {attempt.number} of run {attempt.run.name} on {attempt.host.name}: "
                f"steps {attempt.start_step}..{spec.max_steps}"
                + (f", resuming from {attempt.resume_from}" if attempt.resume_from else "")
            )
            sink: Any = ConsoleSink(attempt)
            refusals.append(sink)
        else:
            sink, control = NullSink(), StaticControl()
        outcome = training.run(spec, sink, control)
        if rank != 0:
            return
        refused = next((r.refused for r in refusals if r.refused), "")
        if refused:
            # Not a failure of the run, and nothing for this job to record: a clean stop.
            self.stdout.write(
                f"attempt {attempt.number}: stopped at step {outcome.step}: {refused}"
            )
            flush_soon()
            return
        error = outcome.error or ""
        status = outcome.status
        nodes = int(os.environ.get("NNODES", "1"))
        if status == "failed" and nodes > 1:
            # A dead node breaks the collective: every rank fails. Wait for its agent (or the
            # sweep, when its host went silent) to say so before calling the run failed.
            lost = services.gang_peer_lost(
                attempt=attempt,
                node=int(os.environ.get("NODE_RANK", "0")),
                wait_s=settings.HOST_OFFLINE_AFTER_S + 2 * settings.HOST_HEARTBEAT_S,
            )
            if lost:
                self.stderr.write(f"rank 0 stops without reporting: {lost}\n{error}")
                flush_soon()
                sys.exit(3)
        if status != "failed" and outcome.error:
            # The loop finished but the database did not take everything it produced: the
            # run's record is incomplete, which must not pass for a success.
            status = "failed"
            error = f"the job's results could not all be stored: {outcome.error}"
        if outcome.status == "failed":
            failure = (
                RunEvent.objects.filter(run=attempt.run, attempt=attempt, kind="run.failed")
                .order_by("-id")
                .first()
            )
            if failure and failure.data.get("traceback"):
                error = f"{error}\n\n{failure.data['traceback']}"
            self.stderr.write(error)
        services.attempt_finished(
            attempt_id=attempt.pk,
            status=status,
            step=outcome.step,
            error=error,
        )  # the exit code is the agent's to record: it sees the process end
        self.stdout.write(f"attempt {attempt.number}: {status} at step {outcome.step}")
        flush_soon()  # the last notices to open pages, before the process ends
        if status == "failed":
            sys.exit(1)
