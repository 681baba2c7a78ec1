from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from console.accounts.models import Team
from console.audit.models import AuditEntry


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    target_type: str = ""
    target_id: str = ""
    since: date | None = None
    until: date | None = None  # inclusive: the whole day


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def audit_entries(*, team: Team, filters: AuditFilters) -> QuerySet[AuditEntry]:
    """The team's audit entries matching `filters`, newest first."""
    entries = AuditEntry.objects.filter(team=team).select_related("actor")
    if filters.actor:
        entries = entries.filter(actor_name=filters.actor)
    if filters.action:
        entries = entries.filter(action=filters.action)
    if filters.target_type:
        entries = entries.filter(target_type=filters.target_type)
    if filters.target_id:
        entries = entries.filter(target_id=filters.target_id)
    if filters.since:
        entries = entries.filter(at__gte=_start_of(filters.since))
    if filters.until:
        entries = entries.filter(at__lt=_start_of(filters.until + timedelta(days=1)))
    return entries.order_by("-at", "-id")


def audit_filter_choices(*, team: Team) -> dict[str, list[str]]:
    """The distinct actors, actions and target types in the team's log, for the filter form."""
    entries = AuditEntry.objects.filter(team=team)

    def distinct(column: str) -> list[str]:
        return list(entries.order_by(column).values_list(column, flat=True).distinct())

    return {
        "actor": distinct("actor_name"),
        "action": distinct("action"),
        "target_type": distinct("target_type"),
    }
