"""The JSON API: one NinjaAPI at /api/ (OpenAPI schema at /api/openapi.json, docs at /api/docs).

Every endpoint needs a bearer token (`Authorization: Bearer ptc_...`), created by users on
/accounts/tokens/. A token acts as its user within the team it was created in; routers read
that team through `api_membership(request)` and apply the same rules as the pages, via
console.accounts.access. Anonymous requests get 401.

Routers use the API-wide auth by default; one that needs it explicitly can import `token_auth`.

Every error answers `ErrorOut` (`{"detail": ..., "errors": {field: [messages]}}`), schema
validation failures included, and every operation declares its error statuses through
`answers(...)`, so the OpenAPI document matches what the API really sends. Lists page with
`Pagination` (?limit= at most API_MAX_PAGE_SIZE, ?offset=).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Field, NinjaAPI, Schema
from ninja.errors import HttpError, ValidationError
from ninja.pagination import LimitOffsetPagination
from ninja.security import HttpBearer

from console.accounts.models import ApiToken, Membership, Role
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


def api_member(request: HttpRequest, role: str = Role.ANNOTATOR) -> Membership:
    """`api_membership`, refused with a 403 when its role is below `role` (routers check the
    object's team first, so an outsider gets the 404 before any role check)."""
    membership = api_membership(request)
    if not membership.has_role(role):
        raise HttpError(403, f"This needs the {Role(role).label.lower()} role")
    return membership


class ErrorOut(Schema):
    """Every error answer: what went wrong, and for 422 the messages by field."""

    detail: str
    errors: dict[str, list[str]] = {}


ERROR_STATUSES = (400, 401, 403, 404, 422)


def answers(ok: dict[int, Any]) -> dict[int, Any]:
    """An operation's `response=`: its own answers plus the errors every endpoint can give
    (400 unparsable body, 401 no token, 403 role too low, 404 not in your team, 422 invalid
    input), so the OpenAPI document lists every status the endpoint really answers with."""
    declared: dict[int, Any] = {status: ErrorOut for status in ERROR_STATUSES}
    declared.update(ok)
    return declared


API_MAX_PAGE_SIZE: int = settings.API_MAX_PAGE_SIZE
# Far beyond any team's row count, and offset + limit still fits PostgreSQL's bigint.
API_MAX_OFFSET = 2**40


class Pagination(LimitOffsetPagination):
    """limit/offset paging with a cap on the page size: an uncapped list once answered 52,000
    tasks (58 MB) in one response. Values out of range are a 422, never a database error."""

    class Input(Schema):
        limit: int = Field(min(100, API_MAX_PAGE_SIZE), ge=1, le=API_MAX_PAGE_SIZE)
        offset: int = Field(0, ge=0, le=API_MAX_OFFSET)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_limit=API_MAX_PAGE_SIZE, **kwargs)


api = NinjaAPI(
    title="Post-training console API",
    version="1",
    description="Teams' registry of domains, reward rubrics and sandbox images, and their runs.",
    auth=token_auth,
    urls_namespace="api",
)


def _field_name(location: tuple[Any, ...] | list[Any]) -> str:
    # ninja's locations start with the source and the parameter's name ("body", "payload",
    # "slug"); the console names fields the way the services' errors do ("slug").
    parts = [str(part) for part in location[2:]] or [str(part) for part in location[-1:]]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, error: ValidationError) -> HttpResponse:
    """Input that fails the schema answers in the same ErrorOut shape as the services' 422s
    (ninja's own shape, a list of pydantic errors, was not the one the document declared)."""
    errors: dict[str, list[str]] = {}
    for problem in error.errors:
        errors.setdefault(_field_name(problem.get("loc", ())), []).append(
            str(problem.get("msg", "invalid"))
        )
    return api.create_response(request, {"detail": "invalid input", "errors": errors}, status=422)


class Me(Schema):
    username: str
    team: str
    team_slug: str
    role: str
    token: str


@api.get("/me", response=answers({200: Me}), summary="Who the token acts as")
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
api.add_router("/", "console.runs.api.router")
api.add_router("/", "console.runs.step_api.router")
api.add_router("/scheduling/", "console.scheduling.api.router")
