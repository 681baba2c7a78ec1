"""Runs and where they execute: models (weights) in the registry, hosts, runs, attempts, and
what a run produces (trajectories, metrics, checkpoints, events, logs).

A **Run** is what a researcher asked for: a validated training spec with every registry
reference pinned (rubric version, sandbox image version, task-set version, model version). An
**Attempt** is one placement of the run on a host; a lost host or a preemption ends the attempt
and the run goes back to the queue, the next attempt resuming from the last checkpoint recorded
here. States follow the job lifecycle in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from console.accounts.models import Team
from console.registry.models import ObjectVersion, VersionedObject, version_constraints


class RegisteredModel(VersionedObject):
    """A team's model: each version is a set of weights (a base model, or a promoted
    checkpoint of a run). Versions are published on creation: weights never change."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="models")

    class Meta(VersionedObject.Meta):
        constraints = [
            models.UniqueConstraint(fields=["team", "slug"], name="model_slug_unique_per_team")
        ]


class ModelVersion(ObjectVersion):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    # A directory every host can read (under MODELS_ROOT, or a run's checkpoint directory).
    path = models.CharField(max_length=1000)
    # Lineage: the checkpoint these weights were promoted from (None for a base model).
    source_checkpoint = models.ForeignKey(
        "Checkpoint", on_delete=models.PROTECT, null=True, blank=True, related_name="promotions"
    )

    class Meta:
        ordering = ["model", "number"]
        constraints = version_constraints("model", "model")

    def __str__(self) -> str:
        return f"{self.model.slug} v{self.number}"


class HostState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"  # no new placements; running jobs go on
    DRAINING = "draining", "Draining"  # no new placements; becomes cordoned once empty
    OFFLINE = "offline", "Offline"


class Host(models.Model):
    """A machine (or one agent on it) that executes attempts from its Celery queue
    ``host.<name>``. Hosts are shared by every team; a run's pinned paths must be readable on
    each of them."""

    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.READY)
    # {"gpus": [{"index", "name", "memory_mb"}], "cpu_cores", "memory_mb", "hostname"}
    inventory = models.JSONField(default=dict)
    # How many attempts at once: its GPUs, or CPU slots on a host without GPUs.
    gpu_slots = models.PositiveIntegerField(default=0)
    cpu_slots = models.PositiveIntegerField(default=0)
    agent_pid = models.IntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    state_reason = models.CharField(max_length=500, blank=True)
    # Where the other hosts of a gang reach this one when it holds node 0 (HOST_ADDRESS).
    address = models.CharField(max_length=255, blank=True)
    # Quotas are per pool; a host without one is in the default pool.
    pool = models.ForeignKey(
        "scheduling.ResourcePool",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="hosts",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"host.{self.name}"


class RunState(models.TextChoices):
    QUEUED = "queued", "Queued"
    SCHEDULED = "scheduled", "Scheduled"
    RUNNING = "running", "Running"
    PREEMPTING = "preempting", "Preempting"
    PREEMPTED = "preempted", "Preempted"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


TERMINAL_RUN_STATES = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


class Run(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="runs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    name = models.CharField(max_length=100)
    # What the researcher submitted (registry references by slug), kept for "launch again".
    request = models.JSONField()
    # The training spec with every reference resolved and pinned (training.spec.RunSpec form,
    # except that task sources are filled in by the job from the pinned task-set rows).
    spec = models.JSONField()
    # Per domain: {"domain_id", "slug", "rubric_version_id", "rubric_version", "sandbox_image_
    # version_id", "taskset_version", "weight"}; and the model version the run starts from.
    pins = models.JSONField()
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="runs")
    # Per host: a run with `hosts` > 1 is a gang that starts on that many hosts at once.
    gpus = models.PositiveIntegerField(default=0)
    cpu_slots = models.PositiveIntegerField(default=1)
    hosts = models.PositiveIntegerField(default=1)
    # None: the default class (console.scheduling.models.DEFAULT_CLASS_NAME).
    priority_class = models.ForeignKey(
        "scheduling.PriorityClass",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="runs",
    )
    priority = models.IntegerField(default=0)  # within the class; higher first
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    state_reason = models.CharField(max_length=2000, blank=True)
    error = models.TextField(blank=True)
    # The run's own directory under RUNS_ROOT (task files, checkpoints, outputs), named at
    # launch with a random part: a database restored or recreated with the same ids never
    # points a new run at an old run's files.
    directory = models.CharField(max_length=1000, blank=True)
    last_step = models.PositiveIntegerField(default=0)
    max_steps = models.PositiveIntegerField(default=0)
    # Trajectories the library's queue dropped because the database fell behind (shown).
    dropped_trajectories = models.PositiveIntegerField(default=0)
    # Trajectories stored (kept by the sink in the transactions that insert and delete them):
    # the run page shows it without counting a million rows.
    trajectories_stored = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "queued_at"], name="run_state_queued")]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_RUN_STATES

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.work_dir}/checkpoints"

    @property
    def work_dir(self) -> str:
        return self.directory or str(settings.RUNS_ROOT / f"run-{self.pk}")


class AttemptState(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"  # placed, sent to the host's queue
    STARTING = "starting", "Starting"  # claimed by the host agent
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    LOST = "lost", "Lost"  # its host stopped answering


LIVE_ATTEMPT_STATES = (AttemptState.SCHEDULED, AttemptState.STARTING, AttemptState.RUNNING)


class Attempt(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="attempts")
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.SCHEDULED
    )
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    resume_from = models.CharField(max_length=1000, blank=True)
    start_step = models.PositiveIntegerField(default=0)
    scheduled_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    error = models.TextField(blank=True)
    # The job's stdout and stderr: its head, then its newest part (bounded: RUN_LOG_MAX_BYTES).
    log_head = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    log_bytes = models.BigIntegerField(default=0)
    # A gang (the run on several hosts): "address:port" of node 0, where every node's ranks
    # meet (torch.distributed's TCP store). The port is taken from RUNS_RENDEZVOUS_PORT_* while
    # the attempt is live; "" and None for a run on one host.
    rendezvous = models.CharField(max_length=300, blank=True)
    rendezvous_port = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_number_unique"),
            # Two live gangs never share a rendezvous port (the scheduler picks a free one;
            # this is the backstop). Every node-0 host of this console draws from one range.
            models.UniqueConstraint(
                fields=["rendezvous_port"],
                condition=Q(state__in=["scheduled", "starting", "running"]),
                name="attempt_rendezvous_port_live",
            ),
            # One live attempt per run: a run is never executed twice at once.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(state__in=["scheduled", "starting", "running"]),
                name="attempt_one_live_per_run",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.number}"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_ATTEMPT_STATES

    @property
    def checkpoint_dir(self) -> str:
        """Where this attempt's job saves: its own directory, so that an old attempt's job
        that still runs after the run moved on (its saves are not fenced as its database
        writes are) never replaces nor prunes the current attempt's checkpoints."""
        return f"{self.run.checkpoint_dir}/attempt-{self.number}"

    @property
    def log_text(self) -> str:
        dropped = self.log_bytes - len(self.log_head.encode()) - len(self.log_tail.encode())
        if dropped > 0:
            return f"{self.log_head}\n[... {dropped:,} bytes left out ...]\n{self.log_tail}"
        return self.log_head + self.log_tail


class AllocationState(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"  # sent to the host's queue
    STARTING = "starting", "Starting"  # claimed by that host's agent
    RUNNING = "running", "Running"  # its process group runs
    EXITED = "exited", "Exited"  # its process group ended (exit_code says how)
    LOST = "lost", "Lost"  # never started, or its host went silent


class Allocation(models.Model):
    """One host's share of an attempt: node `node_rank` of the run's process groups, with its
    GPUs (or CPU slots) on that host. Every attempt has one per host it runs on (one for a run
    on one host); node 0 is on the attempt's own host and holds the rendezvous."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="allocations")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="allocations")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="allocations")
    node_rank = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField(default=0)
    cpu_slots = models.PositiveIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=AllocationState.choices, default=AllocationState.SCHEDULED
    )
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "node_rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "node_rank"], name="allocation_node_unique"),
            models.UniqueConstraint(fields=["attempt", "host"], name="allocation_host_unique"),
        ]
        indexes = [models.Index(fields=["host", "state"], name="allocation_host_state")]

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.attempt_id} node {self.node_rank}"


class CurrentXid(models.Func):
    """The writing transaction's id (``pg_current_xact_id()``, 64 bits, never wraps)."""

    template = "(pg_current_xact_id()::text::bigint)"
    output_field = models.BigIntegerField()


class TrajectoryRecord(models.Model):
    """One scored sample (training.trajectory.Trajectory in ``data``); the columns are what
    lists filter and sort on. (run, step, index) is unique: a replayed batch never doubles."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trajectories")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField()
    index = models.PositiveIntegerField()
    domain = models.CharField(max_length=64)
    reward = models.FloatField()
    policy_version = models.PositiveIntegerField()
    task_id = models.CharField(max_length=64, blank=True)
    rubric_version = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=16)
    response_tokens = models.PositiveIntegerField()
    # Why the step did not train on it (training.trajectory.DISCARD_REASONS); "" if it did.
    discarded = models.CharField(max_length=32, blank=True, default="")
    data = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    # The writing transaction: the live stream follows it, as for events (`RunEvent.xid`).
    xid = models.BigIntegerField(db_default=CurrentXid(), editable=False)

    class Meta:
        db_table = "runs_trajectory"
        ordering = ["run", "step", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step", "index"], name="trajectory_unique_per_step"
            )
        ]
        indexes = [
            models.Index(fields=["run", "xid"], name="trajectory_run_xid"),
            models.Index(fields=["run", "domain", "reward"], name="trajectory_domain"),
            # The ops page's ingest rate reads the newest minute.
            models.Index(fields=["created_at"], name="trajectory_created"),
            # The explorer's discarded samples, newest steps first (few rows: a partial index).
            models.Index(
                fields=["run", "step", "index"],
                condition=~Q(discarded=""),
                name="trajectory_discarded",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} #{self.index}"


class MetricRow(models.Model):
    """Every metric of one step of a run (training and evaluation merge into one row)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_rows")
    step = models.PositiveIntegerField()
    values = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)
    # The transaction that last wrote the row (the sink's upsert sets it again when a step's
    # evaluation merges in): the live stream follows it, as for events (`RunEvent.xid`).
    xid = models.BigIntegerField(db_default=CurrentXid(), editable=False)

    class Meta:
        db_table = "runs_metric"
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="metric_one_per_step")]
        indexes = [models.Index(fields=["run", "xid"], name="metric_run_xid")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=1000)
    reason = models.CharField(max_length=32)
    policy_version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "path", "step"], name="checkpoint_unique")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} ({self.reason})"


class MetricRollup(models.Model):
    """A chart key's lowest, highest and newest value in one bucket of `width` steps of a run
    (`console.runs.rollup`: the snapshot of a long run reads these, not every step)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    key = models.TextField()
    width = models.PositiveIntegerField()
    bucket = models.PositiveIntegerField()
    low = models.FloatField()
    low_step = models.PositiveIntegerField()
    high = models.FloatField()
    high_step = models.PositiveIntegerField()
    last = models.FloatField()
    last_step = models.PositiveIntegerField()

    class Meta:
        db_table = "runs_metric_rollup"
        constraints = [
            models.UniqueConstraint(
                fields=["run", "width", "key", "bucket"], name="metric_rollup_unique"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.key} x{self.width} #{self.bucket}"


# Events a run records every step (the stage timeline): kept for the step views, left out of
# the event lists and chart markers, which are for what happens now and then.
PER_STEP_EVENT_KINDS = ("step.timeline",)


class RunEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=64)
    step = models.PositiveIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    # The transaction that wrote the row. Ids are drawn before commit, so with two writers a
    # smaller id can commit after a bigger one was already shown: a live page that follows
    # ids would skip it. It follows this instead (`console.runs.live`): every transaction
    # older than the oldest one still open has committed or rolled back, so its rows are final.
    xid = models.BigIntegerField(db_default=CurrentXid(), editable=False)

    class Meta:
        ordering = ["run", "id"]
        indexes = [
            # A run's events by writing transaction (the live stream's cursor).
            models.Index(fields=["run", "xid"], name="runevent_run_xid"),
            # The newest events of a run without its per-step ones (the page, the snapshot).
            models.Index(
                "run",
                models.F("id").desc(),
                condition=~Q(kind__in=PER_STEP_EVENT_KINDS),
                name="runevent_newest",
            ),
            # One step's timeline, the steps that have one, and the slowest.
            models.Index(fields=["run", "kind", "step"], name="runevent_kind_step"),
            models.Index(
                "run",
                Cast(KT("data__step_s"), models.FloatField()).desc(),
                condition=Q(kind="step.timeline"),
                name="runevent_slowest_steps",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} (run {self.run_id})"

    @property
    def data_json(self) -> str:
        """The event's data as JSON (pages show it the way the API gives it)."""
        return json.dumps(self.data, ensure_ascii=False)


class CommandKind(models.TextChoices):
    CANCEL = "cancel", "Cancel"
    PREEMPT = "preempt", "Preempt"
    OVERRIDES = "overrides", "Overrides"


class RunCommand(models.Model):
    """An operator's (or the scheduler's) decision for a running run, handed to the training
    loop once (``delivered_at``) at its next step."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=CommandKind.choices)
    payload = models.JSONField(default=dict)
    reason = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivered_step = models.PositiveIntegerField(null=True, blank=True)
    delivered_to = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"{self.kind} for run {self.run_id}"
