"""The console's side of `training.sink.Sink` and `training.control.Control`: what a job on a
host writes into PostgreSQL, and how it reads operators' decisions.

`ConsoleSink` writes trajectories with ``COPY`` into a temporary table and moves them into
``runs_trajectory`` with ``INSERT ... ON CONFLICT DO NOTHING`` in one transaction: a batch that
is written twice (a retry after a lost connection) never doubles a row, since (run, step, index)
is unique. Metrics of a step merge into one row. After each commit a compact notice goes to the
run's channel-layer group (`console.broadcast`) for the live pages.

When an attempt starts at step S (``run.started``), rows an earlier attempt wrote for steps
after S are deleted: the policy that produced them is gone (the run resumes from the checkpoint
of step S), and the steps will be produced again.

Each attempt saves its checkpoints in a directory of its own (`Attempt.checkpoint_dir`), and a
run resumes from the newest checkpoint recorded here. Only once a checkpoint is recorded (the
attempt was current when it committed) does its sink prune what that supersedes
(`checkpoints_prune`): a stale attempt's job never removes a file, and a checkpoint the
database may still resume from is never removed by a newer one it has not yet accepted.

Only the run's current attempt writes. Every write checks, in its own transaction and under a
lock on the attempt's row (`services.attempt_hold_current`), that its attempt is still live;
an old attempt's job that still runs after the run moved on (its host lost contact, or it had
not yet seen its stop) has each write refused whole with `services.AttemptNotCurrent`. The
first refusal is recorded as the run's event ``sink.refused`` and logged; the job's Control
(`ConsoleControl`) is refused too and stops the loop at its next step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from console.runs import rollup, services
from console.runs.models import (
    PER_STEP_EVENT_KINDS,
    Attempt,
    Checkpoint,
    MetricRow,
    ModelVersion,
    Run,
    RunEvent,
    TrajectoryRecord,
)
from training.control import ControlDecision, Overrides
from training.spec import CheckpointSpec

logger = logging.getLogger(__name__)

TRAJECTORY_COLUMNS = (
    "run_id",
    "attempt_id",
    "step",
    "index",
    "domain",
    "reward",
    "policy_version",
    "task_id",
    "rubric_version",
    "finish_reason",
    "response_tokens",
    "discarded",
    "data",
    "created_at",
)


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)


# A NUL character's escape, not preceded by an escaped backslash ("\\u0000" is text).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _json(value: Any) -> str:
    """JSON text; NaN and infinity become null (JSON has neither), arrays become lists, and
    NUL characters (a model can sample one) become U+FFFD: PostgreSQL's jsonb refuses
    \\u0000, and one such sample would fail the whole batch."""
    text = _ENCODER.encode(value).decode()
    return _NUL_ESCAPE.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they are stored as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def trajectory_row(
    run_id: int, attempt_id: int, index: int, item: dict[str, Any], now: Any
) -> tuple[Any, ...]:
    provenance = item.get("provenance") or {}
    reward = item.get("reward") or {}
    total = reward.get("total")
    task_id = item.get("task_id")
    rubric_version = provenance.get("rubric_version")
    return (
        run_id,
        attempt_id,
        int(provenance.get("step", 0)),
        index,
        str(provenance.get("domain", ""))[:64],
        float(total) if isinstance(total, int | float) and math.isfinite(total) else 0.0,
        int(provenance.get("policy_version", 0)),
        "" if task_id is None else str(task_id)[:64],
        rubric_version if isinstance(rubric_version, int) else None,
        str(item.get("finish_reason", ""))[:16],
        int(item.get("response_tokens", 0)),
        str(item.get("discarded") or "")[:32],
        _json(item),
        now,
    )


_COLUMNS = ", ".join(f'"{c}"' for c in TRAJECTORY_COLUMNS)


def copy_trajectory_rows(rows: Sequence[tuple[Any, ...]]) -> int:
    """Writes rows with COPY, skipping (run, step, index) already there. Call inside a
    transaction. Returns the rows inserted.

    The common case (nothing there yet) is one COPY straight into the table, in a savepoint.
    A batch written before (a retry) violates the unique key: the savepoint is rolled back and
    the batch goes through a staging table and ``INSERT ... ON CONFLICT DO NOTHING``."""
    from psycopg import errors

    try:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY runs_trajectory ({_COLUMNS}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
        return len(rows)
    except (errors.UniqueViolation, IntegrityError) as error:
        # psycopg's own error through the raw cursor; Django's wrapper elsewhere.
        if not isinstance(error, errors.UniqueViolation) and not isinstance(
            error.__cause__, errors.UniqueViolation
        ):
            raise
    return _copy_skipping_existing(rows)


def _copy_skipping_existing(rows: Sequence[tuple[Any, ...]]) -> int:
    columns = _COLUMNS
    with connection.cursor() as cursor:
        # The incoming rows' columns only, without the id (an identity the INSERT assigns).
        cursor.execute(
            "CREATE TEMPORARY TABLE IF NOT EXISTS runs_trajectory_incoming "  # noqa: S608
            f"ON COMMIT DELETE ROWS AS SELECT {columns} FROM runs_trajectory WITH NO DATA"
        )
        raw = cursor.cursor  # psycopg 3's cursor, for COPY
        with raw.copy(f"COPY runs_trajectory_incoming ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            # The column names are this module's constants, never input.
            f"INSERT INTO runs_trajectory ({columns}) "  # noqa: S608
            f"SELECT {columns} FROM runs_trajectory_incoming "
            "ON CONFLICT (run_id, step, index) DO NOTHING"
        )
        inserted = cursor.rowcount
        cursor.execute("DELETE FROM runs_trajectory_incoming")
    return inserted


_ATTEMPT_DIR = re.compile(r"attempt-(\d+)")


def _attempt_of(root: Path, path: Path) -> int | None:
    """The number of the attempt whose directory holds ``path`` under the run's checkpoint
    directory ``root``; 0 for one saved in ``root`` itself (before attempts had their own),
    None for a path outside it (never pruned)."""
    try:
        first = path.relative_to(root).parts[0]
    except (ValueError, IndexError):
        return None
    match = _ATTEMPT_DIR.fullmatch(first)
    return int(match[1]) if match else 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def checkpoints_prune(attempt: Attempt) -> list[Path]:
    """Removes what the run's recorded checkpoints have superseded; returns what it removed.

    Kept: the run's ``keep_last`` newest recorded checkpoints (the newest is what the next
    attempt resumes from) and any a model version's weights are in. Removed: the other recorded
    ones of this attempt and of older attempts, and everything else in older attempts'
    directories (what a stale job saved after the run moved on, or half of a save it died in:
    an older attempt never writes a record again). Newer attempts' directories, and this
    attempt's checkpoints not yet recorded (its saves run ahead of its sink), are left alone.
    Called by the sink after a checkpoint's record committed, so never by a stale attempt."""
    run = attempt.run
    root = Path(run.checkpoint_dir)
    keep_last = CheckpointSpec.model_validate(run.spec.get("checkpoint") or {}).keep_last
    recorded = [
        Path(path)
        for path in Checkpoint.objects.filter(run=run)
        .order_by("-step", "-id")
        .values_list("path", flat=True)
    ]
    weights = [
        Path(path)
        for path in ModelVersion.objects.filter(path__startswith=f"{root}/").values_list(
            "path", flat=True
        )
    ]
    keep = set(recorded[:keep_last])
    keep.update(path for path in recorded if any(w == path or path in w.parents for w in weights))
    doomed = [
        path
        for path in recorded
        if path not in keep
        and (number := _attempt_of(root, path)) is not None
        and number <= attempt.number
    ]
    if root.is_dir():
        for entry in root.iterdir():
            number = _attempt_of(root, entry)
            if number is None or number >= attempt.number or entry in keep:
                continue
            if number == 0 or not entry.is_dir():
                doomed.append(entry)  # a checkpoint (or a pointer) of the shared layout
            else:
                doomed.extend(child for child in entry.iterdir() if child not in keep)
    removed = []
    for path in dict.fromkeys(doomed):
        if path.exists() or path.is_symlink():
            _remove(path)
            removed.append(path)
    if root.is_dir():
        for entry in root.iterdir():
            number = _attempt_of(root, entry)
            if number is not None and 0 < number < attempt.number and entry.is_dir():
                with contextlib.suppress(OSError):  # not empty: it holds a kept checkpoint
                    entry.rmdir()
    return removed


class ConsoleSink:
    """`training.sink.Sink` writing one attempt's output to PostgreSQL (called from the
    library's sink thread, in the order the run produced things). Raises
    `services.AttemptNotCurrent` for a write refused because the attempt is no longer live
    (``refused`` then says why)."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.run: Run = attempt.run
        self.next_index: dict[int, int] = {}
        self.written = 0
        self.refused = ""

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        if not items:
            return
        now = timezone.now()
        rows = []
        for item in items:
            step = int((item.get("provenance") or {}).get("step", 0))
            index = self.next_index.get(step, 0)
            self.next_index[step] = index + 1
            rows.append(trajectory_row(self.run.pk, self.attempt.pk, index, item, now))
        steps = sorted({row[2] for row in rows})
        with self._as_current("trajectories", steps[-1]):
            inserted = copy_trajectory_rows(rows)
            Run.objects.filter(pk=self.run.pk).update(
                trajectories_stored=F("trajectories_stored") + inserted
            )
            services.notify(
                self.run,
                "run.trajectories",
                {"steps": steps, "count": len(rows), "inserted": inserted},
                to_lists=False,
                wait=False,
            )
        self.written += inserted

    def metrics(self, step: int, values: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in values.items()}
        with self._as_current("metrics", step, held=True), connection.cursor() as cursor:
            cursor.execute(
                # Written only while the attempt is current: the check and its lock are the
                # upsert's own (no statement more per step).
                'INSERT INTO runs_metric (run_id, step, "values", updated_at) '  # noqa: S608
                "SELECT %s, %s, %s::jsonb, now() FROM runs_attempt "
                f"WHERE {services.ATTEMPT_CURRENT} FOR KEY SHARE "
                "ON CONFLICT (run_id, step) "
                'DO UPDATE SET "values" = runs_metric."values" || EXCLUDED."values", '
                # The merging transaction is the row's writer now (the live stream's cursor).
                "updated_at = now(), xid = pg_current_xact_id()::text::bigint",
                [self.run.pk, step, _json(clean), self.attempt.pk],
            )
            if cursor.rowcount == 0:
                raise services.attempt_not_current(self.attempt)
            rollup.record(self.run.pk, step, _json(clean))
            Run.objects.filter(pk=self.run.pk, last_step__lt=step).update(last_step=step)
            services.notify(
                self.run,
                "run.metrics",
                {"step": step, "keys": sorted(clean)},
                wait=False,  # to the team's runs lists too: their progress and sparkline
            )

    def checkpoint(self, info: dict[str, Any]) -> None:
        step = int(info.get("step", 0))
        with self._as_current("checkpoint", step):
            # A step saved twice (a preemption right after a periodic save) is one checkpoint;
            # the later reason wins, so a preemption's checkpoint says so.
            Checkpoint.objects.update_or_create(
                run=self.run,
                path=str(info.get("path", "")),
                step=step,
                defaults={
                    "attempt": self.attempt,
                    "reason": str(info.get("reason", ""))[:32],
                    "policy_version": int(info.get("policy_version", 0)),
                },
            )
            # Also an event: the charts draw a marker at each checkpoint.
            reason = str(info.get("reason", ""))[:32]
            self._record_event("checkpoint.saved", {"step": step, "reason": reason})
            services.notify(self.run, "run.checkpoint", {"step": step}, wait=False)
        try:
            checkpoints_prune(self.attempt)
        except OSError:  # disk litter at worst: never a failed write of the run's record
            logger.exception("pruning the checkpoints of %s", self.attempt)

    def event(self, kind: str, data: dict[str, Any]) -> None:
        data = _finite(json.loads(_json(data)))
        step = data.get("step")
        if kind not in ("run.started", "sink.trajectories_dropped"):
            # One row: no transaction of its own, nor a savepoint inside a caller's (the
            # INSERT alone, which checks that the attempt is current, instead of a BEGIN or
            # SAVEPOINT and a COMMIT or RELEASE around it).
            with self._as_current(kind, step, held=True, atomic=False):
                self._record_event(kind, data)
            return
        with self._as_current(kind, step):
            if kind == "run.started":
                start = int(data.get("step") or 0)
                # Steps after the checkpoint this attempt resumed from are produced again.
                deleted, _ = TrajectoryRecord.objects.filter(run=self.run, step__gt=start).delete()
                Run.objects.filter(pk=self.run.pk).update(
                    trajectories_stored=F("trajectories_stored") - deleted
                )
                MetricRow.objects.filter(run=self.run, step__gt=start).delete()
                rollup.truncate(self.run.pk, start)
                # The re-run steps' timelines come again too (the lost attempt's are moot).
                RunEvent.objects.filter(
                    run=self.run, kind__in=PER_STEP_EVENT_KINDS, step__gt=start
                ).delete()
                Run.objects.filter(pk=self.run.pk).update(last_step=start)
                if data.get("spec") is not None:
                    data = {**data, "spec": "(stored on the run)"}
            if kind == "sink.trajectories_dropped":
                Run.objects.filter(pk=self.run.pk).update(
                    dropped_trajectories=F("dropped_trajectories") + int(data.get("dropped", 1))
                )
            self._record_event(kind, data)

    @contextlib.contextmanager
    def _as_current(
        self, what: str, step: Any, *, held: bool = False, atomic: bool = True
    ) -> Iterator[None]:
        """A transaction in which the attempt is its run's current one; refused whole
        (`services.AttemptNotCurrent`) otherwise. ``held``: the block's first statement
        checks and locks the attempt itself. ``atomic=False``: the block is one statement."""
        try:
            with transaction.atomic() if atomic else contextlib.nullcontext():
                if not held:
                    services.attempt_hold_current(self.attempt)
                yield
        except services.AttemptNotCurrent as error:
            self._report_refusal(what, step, error)
            raise

    def _report_refusal(self, what: str, step: Any, error: Exception) -> None:
        """The first refusal becomes the run's event (the page shows an old job still
        writing) and a line in the job's log; the later ones only raise."""
        if self.refused:
            return
        self.refused = str(error)
        logger.warning("%s: its %s (step %s) and what follows are refused", error, what, step)
        with transaction.atomic():
            services.record_event(
                self.run,
                "sink.refused",
                {
                    "attempt": self.attempt.number,
                    "refused": what,
                    # Not "step": this is no event of that step's (nor a chart marker there).
                    "at_step": step if isinstance(step, int) else None,
                    "reason": self.refused,
                },
                attempt=self.attempt,
            )
            services.notify(
                self.run, "run.event", {"kind": "sink.refused"}, to_lists=False, wait=False
            )

    def _record_event(self, kind: str, data: dict[str, Any]) -> None:
        step = data.get("step")
        with connection.cursor() as cursor:
            # As `services.record_event`, only while the attempt is current (the same check
            # and lock as `services.attempt_hold_current`, in the INSERT itself).
            cursor.execute(
                "INSERT INTO runs_runevent (run_id, attempt_id, kind, step, data, created_at) "  # noqa: S608
                "SELECT run_id, id, %s, %s, %s::jsonb, %s FROM runs_attempt "
                f"WHERE {services.ATTEMPT_CURRENT} FOR KEY SHARE",
                [
                    kind,
                    step if isinstance(step, int) and step >= 0 else None,
                    _json(data),
                    timezone.now(),
                    self.attempt.pk,
                ],
            )
            if cursor.rowcount == 0:
                raise services.attempt_not_current(self.attempt)
        # The run's page only; the lists hear of state changes (services' run.state).
        services.notify(
            self.run,
            "run.event",
            {"kind": kind, "step": data.get("step")},
            to_lists=False,
            wait=False,
        )


class ConsoleControl:
    """`training.control.Control` reading the run's pending commands once per step. An
    attempt that is no longer its run's current one is cancelled: its job stops at once,
    without a checkpoint (the current attempt owns the run's checkpoints), and ``refused``
    says why."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.refused = ""

    def poll(self, step: int) -> ControlDecision:
        try:
            commands = services.commands_deliver(attempt=self.attempt, step=step)
        except services.AttemptNotCurrent as error:
            if not self.refused:
                logger.warning("%s: stopping before step %s", error, step)
            self.refused = str(error)
            return ControlDecision(cancel=True, reason=self.refused)
        if not commands:
            return ControlDecision()
        cancel = preempt = False
        merged: dict[str, Any] = {}
        reasons = []
        for command in commands:
            if command.reason:
                reasons.append(command.reason)
            if command.kind == "cancel":
                cancel = True
            elif command.kind == "preempt":
                preempt = True
            else:
                merged.update(command.payload)
        return ControlDecision(
            preempt=preempt,
            cancel=cancel,
            overrides=Overrides.from_dict(merged),
            reason="; ".join(reasons) or "operator",
        )
