"""The Django admin for staff: browse the scheduler's classes, pools, quotas, preemption
requests and decisions. Read-only: changes go through the scheduler's pages or API, which
validate them, audit them and ask for a scheduling pass."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from console.scheduling.models import (
    PreemptionRequest,
    PreemptionVictim,
    PriorityClass,
    ResourcePool,
    SchedulingDecision,
    TeamQuota,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class VictimInline(admin.TabularInline):
    model = PreemptionVictim
    extra = 0
    can_delete = False
    fields = ("run", "gpu_hours_since_checkpoint", "steps_lost", "next_checkpoint_in_s",
              "rollouts_in_flight", "expected_resume_s")  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PriorityClass)
class PriorityClassAdmin(ReadOnlyAdmin):
    list_display = (
        "name", "value", "can_preempt", "preemptible", "approval", "preempt_after_wait_s",
        "grace_s",
    )  # fmt: skip


@admin.register(ResourcePool)
class ResourcePoolAdmin(ReadOnlyAdmin):
    list_display = ("name", "description")


@admin.register(TeamQuota)
class TeamQuotaAdmin(ReadOnlyAdmin):
    list_display = ("pool", "team", "gpus")


@admin.register(PreemptionRequest)
class PreemptionRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "requester", "state", "purpose", "auto", "decided_by", "created_at")
    list_filter = ("state", "purpose", "auto")
    inlines = [VictimInline]


@admin.register(SchedulingDecision)
class SchedulingDecisionAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "run", "kind", "lent_to", "reason")
    list_filter = ("kind",)
