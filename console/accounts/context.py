from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from console.accounts.access import active_membership
from console.accounts.selectors import user_memberships


def team_context(request: HttpRequest) -> dict[str, Any]:
    """The active team and role, and every team of the user (for the switcher in base.html)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"membership": None, "team": None, "memberships": []}
    membership = active_membership(request)
    return {
        "membership": membership,
        "team": membership.team if membership else None,
        # Evaluated lazily: only pages that render the switcher pay for the query.
        "memberships": user_memberships(user=user),
    }
