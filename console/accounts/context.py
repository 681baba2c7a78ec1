from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from console.accounts.access import active_membership


def team_context(request: HttpRequest) -> dict[str, Any]:
    membership = active_membership(request) if hasattr(request, "user") else None
    return {"membership": membership, "team": membership.team if membership else None}
