"""The registry's JSON API, mounted at /api/registry/ (bearer-token auth from console.api).

A token acts as its user in the team it was made for: objects of any other team answer 404,
annotators may read but get 403 on writes, and requests without a token get 401, the same rules
as the pages. Writes go through the same services, so they validate and audit identically.

Task sets are uploaded as the raw JSONL request body (`curl --data-binary @tasks.jsonl`), which
is spooled to a temporary file in chunks with the size limit enforced while reading.
"""

import datetime as dt
import tempfile
from collections.abc import Callable
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import paginate

from console.accounts.models import Membership, Role
from console.api import ErrorOut, Pagination, answers, api_member, api_membership
from console.registry import selectors, services, specs
from console.registry.jsonvalues import json_value_problem
from console.registry.models import (
    LIMIT_BOUNDS,
    Domain,
    Rubric,
    RubricVersion,
    SandboxImage,
    SandboxImageVersion,
)
from sandboxes import LIMITS as SANDBOX_LIMITS

router = Router(tags=["registry"])

_SPOOL_CHUNK = 64 * 1024

# --- access ---------------------------------------------------------------------------------------


def _domain(request: HttpRequest, domain_id: int, role: str = Role.ANNOTATOR) -> Domain:
    try:
        domain = selectors.domain_get(pk=domain_id)
    except Domain.DoesNotExist:
        raise HttpError(404, "No such domain") from None
    # Another team's object does not exist for this token (404 before any role check, so the
    # answer does not reveal that it exists).
    if domain.team_id != api_membership(request).team_id:
        raise HttpError(404, "No such domain")
    api_member(request, role)
    return domain


def _versioned(
    request: HttpRequest, kind: services.VersionedKind, obj_id: int, role: str = Role.ANNOTATOR
) -> Any:
    try:
        obj = selectors.versioned_get(kind=kind, pk=obj_id)
    except kind.model.DoesNotExist:  # type: ignore[attr-defined]
        raise HttpError(404, f"No such {kind.label}") from None
    # Another team's object does not exist for this token.
    if obj.team_id != api_membership(request).team_id:
        raise HttpError(404, f"No such {kind.label}")
    api_member(request, role)
    return obj


def _version(request: HttpRequest, kind: services.VersionedKind, obj_id: int, number: int) -> Any:
    obj = _versioned(request, kind, obj_id)
    try:
        return selectors.versioned_version_get(kind=kind, obj=obj, number=number)
    except kind.version_model.DoesNotExist:  # type: ignore[attr-defined]
        raise HttpError(404, "No such version") from None


def _rubric(request: HttpRequest, rubric_id: int, role: str = Role.ANNOTATOR) -> Rubric:
    return _versioned(request, services.RUBRIC, rubric_id, role)  # type: ignore[no-any-return]


def _image(request: HttpRequest, image_id: int, role: str = Role.ANNOTATOR) -> SandboxImage:
    return _versioned(request, services.SANDBOX_IMAGE, image_id, role)  # type: ignore[no-any-return]


def _update_meta(
    request: HttpRequest, kind: services.VersionedKind, obj_id: int, payload: "MetaPatch"
) -> Any:
    obj = _versioned(request, kind, obj_id, Role.RESEARCHER)
    values = {"slug": obj.slug, "title": obj.title, "description": obj.description}
    values.update({k: v for k, v in payload.dict(exclude_unset=True).items() if v is not None})
    try:
        services.versioned_update(kind=kind, actor=request.user, obj=obj, **values)
    except ValidationError as error:
        return _invalid(error)
    return 200, _with_versions(selectors.versioned_get(kind=kind, pk=obj.pk))


def _list_with_versions(request: HttpRequest, kind: services.VersionedKind, query: str) -> Any:
    objects = selectors.versioned_list(kind=kind, team=api_member(request).team, query=query)
    return [_with_versions(obj) for obj in objects.prefetch_related("versions")]


def _create(
    request: HttpRequest, kind: services.VersionedKind, *, meta: Any, values: dict[str, Any]
) -> Any:
    """A new object of the kind with `values` as its draft version 1."""
    membership = api_member(request, Role.RESEARCHER)
    try:
        obj = services.versioned_create(
            kind=kind,
            actor=request.user,
            team=membership.team,
            slug=meta.slug,
            title=meta.title,
            description=meta.description,
            payload=values,
        )
    except ValidationError as error:
        return _invalid(error)
    return 201, _with_versions(selectors.versioned_get(kind=kind, pk=obj.pk))


def _save_draft(
    request: HttpRequest,
    kind: services.VersionedKind,
    obj: Any,
    values: dict[str, Any],
    out: Callable[[Any], dict[str, Any]],
) -> Any:
    """Save `values` as the object's draft (a new draft version after a published one)."""
    try:
        version = services.versioned_save_draft(
            kind=kind, actor=request.user, obj=obj, payload=values
        )
    except ValidationError as error:
        return _invalid(error)
    return 200, out(selectors.versioned_version_get(kind=kind, obj=obj, number=version.number))


def _publish(
    request: HttpRequest,
    kind: services.VersionedKind,
    obj_id: int,
    number: int,
    out: Callable[[Any], dict[str, Any]],
) -> Any:
    """Publish a draft: 409 if it is no longer one, 422 if its payload no longer passes the
    kind's checks (they run again at publish, for every kind)."""
    obj = _versioned(request, kind, obj_id, Role.RESEARCHER)
    try:
        version = selectors.versioned_version_get(kind=kind, obj=obj, number=number)
    except kind.version_model.DoesNotExist:  # type: ignore[attr-defined]
        raise HttpError(404, "No such version") from None
    try:
        services.versioned_publish(kind=kind, actor=request.user, version=version)
    except services.VersionConflict as conflict:
        return 409, {"detail": str(conflict)}
    except ValidationError as error:
        return _invalid(error)
    return 200, out(selectors.versioned_version_get(kind=kind, obj=obj, number=number))


def _team_rubric(membership: Membership, rubric_id: int | None) -> Rubric | None:
    if rubric_id is None:
        return None
    rubric = selectors.rubric_choices(team=membership.team).filter(pk=rubric_id).first()
    if rubric is None:
        raise _Invalid({"rubric_id": ["no rubric with this id in your team"]})
    return rubric


def _team_image(membership: Membership, image_id: int | None) -> SandboxImage | None:
    if image_id is None:
        return None
    image = selectors.sandbox_image_choices(team=membership.team).filter(pk=image_id).first()
    if image is None:
        raise _Invalid({"sandbox_image_id": ["no sandbox image with this id in your team"]})
    return image


DOMAIN_NULLABLE = ("rubric", "sandbox_image")


class _Invalid(Exception):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors


def _invalid(error: ValidationError | _Invalid) -> tuple[int, dict[str, Any]]:
    errors = error.errors if isinstance(error, _Invalid) else error.message_dict
    return 422, {"detail": "invalid input", "errors": errors}


# --- schemas --------------------------------------------------------------------------------------


class DomainOut(Schema):
    id: int
    slug: str
    title: str
    description: str
    default_mix_weight: float
    rubric_id: int | None
    sandbox_image_id: int | None
    taskset_version: int
    task_count: int
    held_out_count: int
    held_out_fraction: float
    split_seed: int
    created_at: dt.datetime
    updated_at: dt.datetime
    ready: bool = Field(
        description="Whether a run could train on the domain now: it has tasks, its rubric has a "
        "published version, and so has its sandbox image if it uses one"
    )
    blockers: list[str] = Field(description="Why it cannot run yet, in words (empty when ready)")

    @staticmethod
    def resolve_blockers(domain: Domain) -> list[str]:
        return selectors.domain_blockers(domain=domain)

    @staticmethod
    def resolve_ready(domain: Domain) -> bool:
        return not selectors.domain_blockers(domain=domain)


class DomainIn(Schema):
    slug: str
    title: str
    description: str = ""
    default_mix_weight: float = 1.0
    rubric_id: int | None = None
    sandbox_image_id: int | None = None


class DomainPatch(Schema):
    slug: str | None = None
    title: str | None = None
    description: str | None = None
    default_mix_weight: float | None = None
    rubric_id: int | None = None
    sandbox_image_id: int | None = None


class TaskOut(Schema):
    index: int
    line_number: int
    prompt: str
    messages: list[dict[str, Any]] | None
    ground_truth: Any
    metadata: dict[str, Any]
    split: str


class RowErrorOut(Schema):
    line: int
    message: str


class PreviewRowOut(Schema):
    line: int
    prompt: str
    messages: list[dict[str, Any]] | None
    ground_truth: Any
    metadata: dict[str, Any]
    split: str | None


class UploadOut(Schema):
    stored: bool
    valid_rows: int
    invalid_rows: int
    held_out: int
    errors: list[RowErrorOut]
    more_errors: int
    preview: list[PreviewRowOut] = []
    file_error: str
    replaced_taskset_version: int = Field(
        0, description="The version this upload took over from; it stays readable (0: none)"
    )
    domain: DomainOut


SplitSeed = Field(0, ge=services.SPLIT_SEED_MIN, le=services.SPLIT_SEED_MAX)
# Search terms: PostgreSQL refuses NUL in a query, so it is refused here as a 422.
SEARCH = Query("", max_length=200, pattern=r"^[^\x00]*$")


class SplitIn(Schema):
    held_out_fraction: float = Field(..., ge=0, le=1)
    split_seed: int = SplitSeed


class UploadParams(Schema):
    held_out_fraction: float = Field(0.1, ge=0, le=1)
    split_seed: int = SplitSeed
    keep_valid_rows: bool = False
    filename: str = "tasks.jsonl"


class VersionSummary(Schema):
    number: int
    status: str
    created_at: dt.datetime
    published_at: dt.datetime | None


class RubricOut(Schema):
    id: int
    slug: str
    title: str
    description: str
    versions: list[VersionSummary]


class RubricVersionOut(Schema):
    rubric_id: int
    number: int
    status: str
    source_format: str
    source: str
    spec: dict[str, Any]
    created_by: str
    created_at: dt.datetime
    published_by: str | None
    published_at: dt.datetime | None


class SpecIn(Schema):
    """Give `source` (the text, kept verbatim) or `spec` (an object, stored as formatted text)."""

    source_format: Literal["json", "yaml"] = "json"
    source: str | None = None
    spec: dict[str, Any] | None = None


class RubricIn(SpecIn):
    slug: str
    title: str
    description: str = ""


class MetaPatch(Schema):
    slug: str | None = None
    title: str | None = None
    description: str | None = None


def _limit(default: float, name: str) -> Any:
    """A limit's field, its documented range read from the sandboxes library's table. The
    range is documentation only: the service checks it, so a refusal reads the same as the
    form's ("must be between 4 and 1,000,000") rather than pydantic's wording."""
    low, high = LIMIT_BOUNDS[name]
    bounds = SANDBOX_LIMITS[name]
    return Field(
        default,
        description=f"{bounds.description} ({bounds.unit})",
        json_schema_extra={"minimum": low, "maximum": high},
    )


class SandboxValues(Schema):
    driver: Literal["bwrap", "podman", "docker"] = "bwrap"
    image_ref: str = ""
    setup_script: str = ""
    cpu: float = _limit(1.0, "cpu")
    memory_mb: int = _limit(1024, "memory_mb")
    pids: int = _limit(256, "pids")
    disk_mb: int = _limit(1024, "disk_mb")
    timeout_s: int = _limit(60, "timeout_s")
    network: Literal["none", "loopback"] = "none"


class SandboxImageIn(SandboxValues):
    slug: str
    title: str
    description: str = ""


class SandboxImageOut(Schema):
    id: int
    slug: str
    title: str
    description: str
    versions: list[VersionSummary]


class SandboxVersionOut(SandboxValues):
    image_id: int
    number: int
    status: str
    sandbox_spec: dict[str, Any] = Field(
        description="What `sandboxes.SandboxSpec.from_dict` takes to start this version"
    )
    created_by: str
    created_at: dt.datetime
    published_by: str | None
    published_at: dt.datetime | None


def _rubric_version_out(version: RubricVersion) -> dict[str, Any]:
    return {
        "rubric_id": version.rubric_id,
        "number": version.number,
        "status": version.status,
        "source_format": version.source_format,
        "source": version.source,
        "spec": version.spec,
        "created_by": version.created_by.get_username(),
        "created_at": version.created_at,
        "published_by": version.published_by.get_username() if version.published_by else None,
        "published_at": version.published_at,
    }


def _sandbox_version_out(version: SandboxImageVersion) -> dict[str, Any]:
    return {
        "image_id": version.image_id,
        "number": version.number,
        "status": version.status,
        **{name: getattr(version, name) for name in services.SANDBOX_VERSION_FIELDS},
        "sandbox_spec": version.sandbox_spec(),
        "created_by": version.created_by.get_username(),
        "created_at": version.created_at,
        "published_by": version.published_by.get_username() if version.published_by else None,
        "published_at": version.published_at,
    }


def _spec_source(payload: SpecIn) -> tuple[str, str]:
    if (payload.source is None) == (payload.spec is None):
        raise _Invalid({"source": ["give either source (text) or spec (an object)"]})
    if payload.source is not None:
        return payload.source, payload.source_format
    assert payload.spec is not None
    # Checked before rendering: json.dumps recurses, and a spec nested ~1000 deep overflows it.
    problem = json_value_problem(payload.spec)
    if problem is not None:
        raise _Invalid({"spec": [problem]})
    return specs.render_source(payload.spec, payload.source_format), payload.source_format


# --- domains --------------------------------------------------------------------------------------


@router.get("/domains", response=answers({200: list[DomainOut]}), summary="The team's domains")
@paginate(Pagination)
def domain_list(request: HttpRequest, q: str = SEARCH) -> Any:
    return selectors.domain_list(team=api_member(request).team, query=q)


@router.get("/domains/{domain_id}", response=answers({200: DomainOut}))
def domain_get(request: HttpRequest, domain_id: int) -> Any:
    return _domain(request, domain_id)


@router.post("/domains", response=answers({201: DomainOut, 422: ErrorOut}))
def domain_create(request: HttpRequest, payload: DomainIn) -> Any:
    membership = api_member(request, Role.RESEARCHER)
    try:
        domain = services.domain_create(
            actor=request.user,
            team=membership.team,
            slug=payload.slug,
            title=payload.title,
            description=payload.description,
            default_mix_weight=payload.default_mix_weight,
            rubric=_team_rubric(membership, payload.rubric_id),
            sandbox_image=_team_image(membership, payload.sandbox_image_id),
        )
    except (ValidationError, _Invalid) as error:
        return _invalid(error)
    return 201, domain


@router.patch("/domains/{domain_id}", response=answers({200: DomainOut, 422: ErrorOut}))
def domain_update(request: HttpRequest, domain_id: int, payload: DomainPatch) -> Any:
    domain = _domain(request, domain_id, Role.RESEARCHER)
    membership = api_membership(request)
    changes = payload.dict(exclude_unset=True)
    try:
        if "rubric_id" in changes:
            changes["rubric"] = _team_rubric(membership, changes.pop("rubric_id"))
        if "sandbox_image_id" in changes:
            changes["sandbox_image"] = _team_image(membership, changes.pop("sandbox_image_id"))
        nulls = [name for name, v in changes.items() if v is None and name not in DOMAIN_NULLABLE]
        if nulls:
            raise _Invalid({name: ["may not be null"] for name in nulls})
        return 200, services.domain_update(actor=request.user, domain=domain, **changes)
    except (ValidationError, _Invalid) as error:
        return _invalid(error)


@router.post(
    "/domains/{domain_id}/split",
    response=answers({200: DomainOut}),
    summary="Re-draw the train/held-out split of the stored tasks",
)
def domain_resplit(request: HttpRequest, domain_id: int, payload: SplitIn) -> Any:
    domain = _domain(request, domain_id, Role.RESEARCHER)
    try:
        return 200, services.domain_resplit(
            actor=request.user,
            domain=domain,
            held_out_fraction=payload.held_out_fraction,
            split_seed=payload.split_seed,
        )
    except ValidationError as error:
        return _invalid(error)


@router.get(
    "/domains/{domain_id}/tasks",
    response=answers({200: list[TaskOut]}),
    summary="Tasks in file order, of the current task set or an older version (?taskset=)",
)
@paginate(Pagination)
def domain_tasks(
    request: HttpRequest,
    domain_id: int,
    split: Literal["", "train", "held_out"] = "",
    taskset: int | None = Query(
        None, ge=1, le=2**31 - 1, description="A task-set version (default: the current one)"
    ),
) -> Any:
    domain = _domain(request, domain_id)
    if taskset is not None and taskset > domain.taskset_version:
        raise HttpError(404, "No such task-set version")
    return selectors.domain_tasks(domain=domain, split=split, taskset_version=taskset)


@router.post(
    "/domains/{domain_id}/tasks",
    response=answers({200: UploadOut, 413: ErrorOut, 422: UploadOut | ErrorOut}),
    summary="Store the JSONL request body as the next task-set version, which becomes current "
    "(older versions stay readable)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/jsonl": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
def domain_upload_tasks(request: HttpRequest, domain_id: int, params: Query[UploadParams]) -> Any:
    domain = _domain(request, domain_id, Role.RESEARCHER)
    limit = settings.TASKSET_MAX_UPLOAD_BYTES
    too_big = (
        413,
        {
            "detail": f"the body is larger than the limit of {limit:,} bytes "
            "(TASKSET_MAX_UPLOAD_BYTES); nothing was stored"
        },
    )
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        return too_big
    with tempfile.TemporaryFile() as spool:
        received = 0
        while chunk := request.read(_SPOOL_CHUNK):
            received += len(chunk)
            if received > limit:
                return too_big
            spool.write(chunk)
        spool.seek(0)
        try:
            result = services.domain_upload_tasks(
                actor=request.user,
                domain=domain,
                stream=spool,
                filename=params.filename,
                held_out_fraction=params.held_out_fraction,
                split_seed=params.split_seed,
                keep_valid_rows=params.keep_valid_rows,
            )
        except ValidationError as error:
            return 422, {
                "stored": False,
                "valid_rows": 0,
                "invalid_rows": 0,
                "held_out": 0,
                "errors": [],
                "more_errors": 0,
                "file_error": "; ".join(error.messages),
                "domain": domain,
            }
    domain.refresh_from_db()
    body = {
        "stored": result.stored,
        "valid_rows": result.valid,
        "invalid_rows": result.invalid,
        "held_out": result.held_out,
        "errors": [{"line": e.line_number, "message": e.message} for e in result.errors],
        "more_errors": result.more_errors,
        "preview": [
            {
                "line": row.line_number,
                "prompt": row.prompt,
                "messages": row.messages,
                "ground_truth": row.ground_truth,
                "metadata": row.metadata,
                "split": row.split,
            }
            for row in result.preview
        ],
        "file_error": result.file_error,
        "replaced_taskset_version": result.replaced_version,
        "domain": domain,
    }
    return (200 if result.stored else 422), body


# --- rubrics --------------------------------------------------------------------------------------


def _with_versions(obj: Rubric | SandboxImage) -> dict[str, Any]:
    return {
        "id": obj.pk,
        "slug": obj.slug,
        "title": obj.title,
        "description": obj.description,
        "versions": [
            {
                "number": v.number,
                "status": v.status,
                "created_at": v.created_at,
                "published_at": v.published_at,
            }
            for v in obj.versions.all()
        ],
    }


@router.get(
    "/rubrics", response=answers({200: list[RubricOut]}), summary="The team's reward rubrics"
)
@paginate(Pagination)
def rubric_list(request: HttpRequest, q: str = SEARCH) -> Any:
    return _list_with_versions(request, services.RUBRIC, q)


@router.get("/rubrics/{rubric_id}", response=answers({200: RubricOut}))
def rubric_get(request: HttpRequest, rubric_id: int) -> Any:
    return _with_versions(_rubric(request, rubric_id))


@router.post(
    "/rubrics", response=answers({201: RubricOut, 422: ErrorOut}), summary="Create (draft v1)"
)
def rubric_create(request: HttpRequest, payload: RubricIn) -> Any:
    api_member(request, Role.RESEARCHER)  # the role is checked before the input, as everywhere
    try:
        source, source_format = _spec_source(payload)
    except _Invalid as error:
        return _invalid(error)
    return _create(
        request,
        services.RUBRIC,
        meta=payload,
        values={"source": source, "source_format": source_format},
    )


@router.patch("/rubrics/{rubric_id}", response=answers({200: RubricOut, 422: ErrorOut}))
def rubric_update(request: HttpRequest, rubric_id: int, payload: MetaPatch) -> Any:
    return _update_meta(request, services.RUBRIC, rubric_id, payload)


@router.get("/rubrics/{rubric_id}/versions/{number}", response=answers({200: RubricVersionOut}))
def rubric_version_get(request: HttpRequest, rubric_id: int, number: int) -> Any:
    return _rubric_version_out(_version(request, services.RUBRIC, rubric_id, number))


@router.post(
    "/rubrics/{rubric_id}/draft",
    response=answers({200: RubricVersionOut, 422: ErrorOut}),
    summary="Save the draft (a new draft version if the latest is published)",
)
def rubric_save_draft(request: HttpRequest, rubric_id: int, payload: SpecIn) -> Any:
    obj = _rubric(request, rubric_id, Role.RESEARCHER)
    try:
        source, source_format = _spec_source(payload)
    except _Invalid as error:
        return _invalid(error)
    values = {"source": source, "source_format": source_format}
    return _save_draft(request, services.RUBRIC, obj, values, _rubric_version_out)


@router.post(
    "/rubrics/{rubric_id}/versions/{number}/publish",
    response=answers({200: RubricVersionOut, 409: ErrorOut, 422: ErrorOut}),
)
def rubric_version_publish(request: HttpRequest, rubric_id: int, number: int) -> Any:
    return _publish(request, services.RUBRIC, rubric_id, number, _rubric_version_out)


# --- sandbox images -------------------------------------------------------------------------------


@router.get(
    "/sandbox-images", response=answers({200: list[SandboxImageOut]}), summary="The team's images"
)
@paginate(Pagination)
def sandbox_image_list(request: HttpRequest, q: str = SEARCH) -> Any:
    return _list_with_versions(request, services.SANDBOX_IMAGE, q)


@router.get("/sandbox-images/{image_id}", response=answers({200: SandboxImageOut}))
def sandbox_image_get(request: HttpRequest, image_id: int) -> Any:
    return _with_versions(_image(request, image_id))


@router.post("/sandbox-images", response=answers({201: SandboxImageOut, 422: ErrorOut}))
def sandbox_image_create(request: HttpRequest, payload: SandboxImageIn) -> Any:
    values = payload.dict()
    for name in ("slug", "title", "description"):
        values.pop(name)
    return _create(request, services.SANDBOX_IMAGE, meta=payload, values=values)


@router.patch("/sandbox-images/{image_id}", response=answers({200: SandboxImageOut, 422: ErrorOut}))
def sandbox_image_update(request: HttpRequest, image_id: int, payload: MetaPatch) -> Any:
    return _update_meta(request, services.SANDBOX_IMAGE, image_id, payload)


@router.get(
    "/sandbox-images/{image_id}/versions/{number}", response=answers({200: SandboxVersionOut})
)
def sandbox_image_version_get(request: HttpRequest, image_id: int, number: int) -> Any:
    return _sandbox_version_out(_version(request, services.SANDBOX_IMAGE, image_id, number))


@router.post(
    "/sandbox-images/{image_id}/draft",
    response=answers({200: SandboxVersionOut, 422: ErrorOut}),
    summary="Save the draft (a new draft version if the latest is published)",
)
def sandbox_image_save_draft(request: HttpRequest, image_id: int, payload: SandboxValues) -> Any:
    obj = _image(request, image_id, Role.RESEARCHER)
    return _save_draft(request, services.SANDBOX_IMAGE, obj, payload.dict(), _sandbox_version_out)


@router.post(
    "/sandbox-images/{image_id}/versions/{number}/publish",
    response=answers({200: SandboxVersionOut, 409: ErrorOut, 422: ErrorOut}),
)
def sandbox_image_version_publish(request: HttpRequest, image_id: int, number: int) -> Any:
    return _publish(request, services.SANDBOX_IMAGE, image_id, number, _sandbox_version_out)
