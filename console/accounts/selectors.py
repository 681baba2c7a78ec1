from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from console.accounts.models import ApiToken, Membership, Team


def team_members(*, team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def user_memberships(*, user: Any) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("team").order_by("team__name")


def user_api_tokens(*, user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).select_related("team").order_by("-created_at")
