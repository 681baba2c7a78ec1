"""The one place that decides who may see or change a team's objects.

Outsiders get 404 (they must not learn that an object exists); members whose role is too low
get 403. Views call these helpers rather than checking roles themselves.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from console.accounts.models import Membership, Role, Team

SESSION_TEAM_KEY = "active_team_id"


def membership_for(user: Any, team: Team | int) -> Membership | None:
    if not getattr(user, "is_authenticated", False):
        return None
    team_id = team.pk if isinstance(team, Team) else team
    return Membership.objects.filter(user=user, team_id=team_id).select_related("team").first()


def require_team_role(user: Any, team: Team | int, role: str = Role.ANNOTATOR) -> Membership:
    """Membership of `user` in `team` with at least `role`; 404 for outsiders, 403 if too low."""
    membership = membership_for(user, team)
    if membership is None:
        raise Http404("No such object")
    if not membership.has_role(role):
        raise PermissionDenied(
            f"This needs the {Role(role).label.lower()} role in {membership.team}"
        )
    return membership


def active_membership(request: HttpRequest) -> Membership | None:
    """The membership of the team the user is working in (chosen in the session, else the first)."""
    user = request.user
    if not user.is_authenticated:
        return None
    memberships = Membership.objects.filter(user=user).select_related("team").order_by("team__name")
    chosen = request.session.get(SESSION_TEAM_KEY)
    if chosen is not None:
        for membership in memberships:
            if membership.team_id == chosen:
                return membership
    return memberships.first()


def require_active_membership(request: HttpRequest, role: str = Role.ANNOTATOR) -> Membership:
    membership = active_membership(request)
    if membership is None:
        raise PermissionDenied("You are not a member of any team")
    if not membership.has_role(role):
        raise PermissionDenied(f"This needs the {Role(role).label.lower()} role")
    return membership
