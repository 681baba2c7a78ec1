"""The JSON API: one NinjaAPI at /api/ (OpenAPI schema at /api/openapi.json, docs at /api/docs).

Every endpoint needs a bearer token (`Authorization: Bearer ptc_...`), created by users on
/accounts/tokens/. A token acts as its user within the team it was created in; routers read
that team through `api_membership(request)` and apply the same rules as the pages, via
console.accounts.access. Anonymous requests get 401.

Routers use the API-wide auth by default; one that needs it explicitly can import `token_auth`.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import NinjaAPI, Schema
from ninja.security import HttpBearer

from console.accounts.models import ApiToken, Membership
from console.accounts.services import api_token_authenticate


class ApiTokenAuth(HttpBearer):
    """Bearer-token auth: `request.auth` is the ApiToken, `request.user` its user."""

    openapi_description = "An API token from /accounts/tokens/ (shown once when created)."

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        api_token = api_token_authenticate(token)
        if api_token is None:
            return None
        # Views and services downstream expect request.user, as they do for pages.
        request.user = api_token.user
        return api_token


token_auth = ApiTokenAuth()


def api_membership(request: HttpRequest) -> Membership:
    """The caller's membership in the team their token belongs to (checked at authentication:
    a removed member's tokens stop working)."""
    token: Any = getattr(request, "auth", None)
    if not isinstance(token, ApiToken):
        raise RuntimeError("api_membership needs an endpoint protected by token_auth")
    return Membership.objects.select_related("team", "user").get(user=token.user, team=token.team)


api = NinjaAPI(
    title="Post-training console API",
    version="1",
    description="Teams' registry of domains, reward rubrics and sandbox images, and their runs.",
    auth=token_auth,
    urls_namespace="api",
)


class Me(Schema):
    username: str
    team: str
    team_slug: str
    role: str
    token: str


@api.get("/me", response=Me, summary="Who the token acts as")
def me(request: HttpRequest) -> dict[str, str]:
    membership = api_membership(request)
    token: Any = request.auth  # type: ignore[attr-defined]
    return {
        "username": membership.user.get_username(),
        "team": membership.team.name,
        "team_slug": membership.team.slug,
        "role": membership.role,
        "token": token.name,
    }


api.add_router("/registry/", "console.registry.api.router")
