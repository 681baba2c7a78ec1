"""What the scheduler decides with and what it decides: priority classes, resource pools and
team quotas (admin-managed), preemption requests with each victim's impact preview, and the
decision log.

The policy itself (`console.scheduling.policy`) never sees these rows: the scheduler service
reads them into the policy's views under an advisory lock and writes its decisions back.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.accounts.models import Team

DEFAULT_CLASS_NAME = "normal"
DEFAULT_POOL_NAME = "default"


class Approval(models.TextChoices):
    ASK = "ask", "Always ask an admin"
    AUTO_RECENT_CHECKPOINT = (
        "auto_recent_checkpoint",
        "Auto-approve when the victim checkpointed recently",
    )
    NEVER = "never", "Never preempt"


class PriorityClass(models.Model):
    """A class runs pick at launch. Its approval policy and grace period apply when its runs
    are the *victims* of a preemption; `can_preempt` when they are the requesters."""

    name = models.SlugField(max_length=64, unique=True)
    value = models.IntegerField(help_text="Higher classes are placed first.")
    can_preempt = models.BooleanField(
        default=False, help_text="Its runs may preempt runs of lower classes."
    )
    preemptible = models.BooleanField(default=True, help_text="Its runs may be preempted.")
    approval = models.CharField(max_length=32, choices=Approval.choices, default=Approval.ASK)
    auto_approve_minutes = models.FloatField(
        default=0.0,
        help_text="Auto-approval: the victim checkpointed less than this ago.",
    )
    preempt_after_wait_s = models.PositiveIntegerField(
        default=0,
        help_text="Its runs ask for a preemption only when they would otherwise wait longer "
        "than this (0: at once).",
    )
    grace_s = models.PositiveIntegerField(
        default=60, help_text="On preemption: SIGTERM, then SIGKILL this much later."
    )
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-value", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(auto_approve_minutes__gte=0), name="priorityclass_minutes_not_negative"
            )
        ]

    def __str__(self) -> str:
        return self.name


class ResourcePool(models.Model):
    """A group of hosts (by GPU model, say); quotas are per pool."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamQuota(models.Model):
    """GPUs (CPU slots in a pool without GPUs) guaranteed to a team in a pool; idle quota may
    be borrowed by others and is reclaimed first, by preempting the borrowers."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="quotas")
    gpus = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pool__name", "team__name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "pool"], name="quota_one_per_team_and_pool")
        ]

    def __str__(self) -> str:
        return f"{self.team} in {self.pool}: {self.gpus}"


class PreemptionState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"  # victims told to checkpoint and stop
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    DONE = "done", "Done"  # every victim stopped
    CANCELLED = "cancelled", "Cancelled"  # the requester ran or ended before a decision


OPEN_PREEMPTION_STATES = (PreemptionState.PENDING, PreemptionState.APPROVED)


class PreemptionPurpose(models.TextChoices):
    """Why a request stops its victims: the values are the policy's plan kinds
    (`console.scheduling.policy.PlanKind`)."""

    PREEMPT = "preempt", "Preemption"  # a class preempts, or a team reclaims its quota
    MOVE = "move", "Move"  # runs checkpointed and restarted elsewhere to free whole hosts
    BACKFILL = "backfill", "Backfill ended"  # runs lent a head's capacity, stopped for it


class PreemptionRequest(models.Model):
    requester = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="preemption_requests"
    )
    state = models.CharField(
        max_length=16, choices=PreemptionState.choices, default=PreemptionState.PENDING
    )
    reason = models.CharField(max_length=1000)  # for people; never parsed
    # Requests filed before this field existed read as preemptions (their loan ends are then no
    # longer counted against the victims' next loans: a few more loans at most).
    purpose = models.CharField(
        max_length=16, choices=PreemptionPurpose.choices, default=PreemptionPurpose.PREEMPT
    )
    auto = models.BooleanField(default=False, help_text="Approved by the victims' class policy.")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    rejection_reason = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One open request per requester: a pass while it waits does not file another.
            models.UniqueConstraint(
                fields=["requester"],
                condition=Q(state__in=["pending", "approved"]),
                name="preemption_one_open_per_requester",
            )
        ]
        indexes = [
            # The schedule pass counts each queued run's ended loans (`services._loans`): the
            # few loan-ending requests, without reading the rest.
            models.Index(
                fields=["state"], condition=Q(purpose="backfill"), name="preemption_loan_end"
            )
        ]

    def __str__(self) -> str:
        return f"preemption #{self.pk} for run {self.requester_id} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_PREEMPTION_STATES


class PreemptionVictim(models.Model):
    """One run a request would stop, and what stopping it costs (the impact preview, as the
    scheduler computed it when it filed the request)."""

    request = models.ForeignKey(PreemptionRequest, on_delete=models.CASCADE, related_name="victims")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    gpu_hours_since_checkpoint = models.FloatField(default=0.0)
    steps_lost = models.PositiveIntegerField(default=0)
    next_checkpoint_in_s = models.FloatField(null=True, blank=True)
    rollouts_in_flight = models.PositiveIntegerField(default=0)
    expected_resume_s = models.FloatField(null=True, blank=True)
    last_checkpoint_step = models.PositiveIntegerField(null=True, blank=True)
    step_at_request = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["request", "id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "run"], name="victim_once_per_request")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} in preemption #{self.request_id}"


class DecisionKind(models.TextChoices):
    PLACED = "placed", "Placed"
    WAITING = "waiting", "Waiting"
    PREEMPTION_REQUESTED = "preemption_requested", "Preemption requested"
    PREEMPTION_APPROVED = "preemption_approved", "Preemption approved"
    PREEMPTION_REJECTED = "preemption_rejected", "Preemption rejected"
    PREEMPTION_EXPIRED = "preemption_expired", "Preemption expired"
    PREEMPTED = "preempted", "Preempted"


class SchedulingDecision(models.Model):
    """The decision log: written when a run's reason changes, not on every pass."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="decisions")
    kind = models.CharField(max_length=32, choices=DecisionKind.choices)
    reason = models.CharField(max_length=1000)  # for people; never parsed
    # A placement on capacity reserved for this run, the head of its pool's queue (preemptible
    # backfill): the placed run is stopped once the head can start. Null for other decisions,
    # and for placements logged before the field existed (those loans are then not recognised:
    # the run keeps its hosts as any other). SET_NULL: deleting the head keeps this run's log.
    lent_to = models.ForeignKey(
        "runs.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,  # the partial index below serves the lookups, and is small
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["created_at"], name="decision_created"),
            # Only loans are indexed (few rows); it serves the schedule pass's read of the lent
            # runs and the SET_NULL when a head run is deleted.
            models.Index(
                fields=["lent_to"], condition=Q(lent_to__isnull=False), name="decision_lent_to"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"
