"""Every write to the registry. Each service runs in one transaction and records an audit entry
inside it, so a change and its record commit or vanish together.

Services check what the data must satisfy (same-team references, spec validity, limits) and
raise `django.core.exceptions.ValidationError` with a field → messages dict; who may call them
is decided by the views and the API through `console.accounts.access`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any

import msgspec
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Max
from django.utils import timezone

from console.accounts.models import Team
from console.audit.services import audit_record
from console.registry import specs, tasksets
from console.registry.models import (
    FRACTIONAL_LIMITS,
    LIMIT_BOUNDS,
    SANDBOX_SPEC_FIELDS,
    Domain,
    Rubric,
    RubricVersion,
    SandboxDriver,
    SandboxImage,
    SandboxImageVersion,
    SandboxNetwork,
    SpecFormat,
    Task,
    TaskSplit,
    VersionStatus,
    format_bound,
    sandbox_spec_dict,
)
from sandboxes import SandboxSpec
from sandboxes.errors import SandboxSpecError

MAX_REPORTED_ROW_ERRORS = 200
PREVIEW_ROWS = 5
MAX_SETUP_SCRIPT_CHARS = 64 * 1024
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# registry[:port]/path/name[:tag][@sha256:digest], as OCI distribution names are written.
OCI_REF_RE = re.compile(
    r"^(?:(?:[a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


class VersionConflict(Exception):
    """The version is no longer a draft (someone published it first)."""


# --- snapshots for the audit log ----------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def snapshot(instance: models.Model, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The instance's stored fields as JSON-ready values (foreign keys as ids)."""
    data: dict[str, Any] = {}
    for model_field in instance._meta.concrete_fields:
        if model_field.name in exclude:
            continue
        data[model_field.attname] = _jsonable(getattr(instance, model_field.attname))
    return data


# --- shared checks ------------------------------------------------------------------------------


def _check_slug(slug: str) -> None:
    if not SLUG_RE.match(slug or ""):
        raise ValidationError(
            {"slug": "use 1–64 lowercase letters, digits, '-' or '_' (not first)"}
        )


def _check_no_nul(name: str, value: str | None) -> None:
    # PostgreSQL text cannot hold NUL: without this check the save fails as a server error.
    if value and "\x00" in value:
        raise ValidationError({name: "must not contain NUL characters"})


def _check_title(title: str) -> None:
    if not (title or "").strip():
        raise ValidationError({"title": "a title is required"})
    if len(title) > 200:
        raise ValidationError({"title": "at most 200 characters"})
    _check_no_nul("title", title)


def _check_description(description: str) -> None:
    _check_no_nul("description", description)


SPLIT_SEED_MIN, SPLIT_SEED_MAX = -(2**63), 2**63 - 1


def _check_split(held_out_fraction: float, split_seed: int) -> None:
    if not (0 <= held_out_fraction <= 1):
        raise ValidationError({"held_out_fraction": "must be between 0 and 1"})
    # The seed is stored in a bigint column.
    if not (SPLIT_SEED_MIN <= split_seed <= SPLIT_SEED_MAX):
        raise ValidationError({"split_seed": "must be between -2^63 and 2^63-1"})


def _save_unique(instance: models.Model, *, what: str, **save_kwargs: Any) -> None:
    """Save, turning the per-team slug constraint into a form error. The savepoint keeps the
    surrounding transaction usable after the IntegrityError."""
    try:
        with transaction.atomic():
            instance.save(**save_kwargs)
    except IntegrityError as exc:
        if "slug_unique_per_team" in str(exc):
            raise ValidationError(
                {"slug": f"this team already has a {what} with the slug {instance.slug!r}"}  # type: ignore[attr-defined]
            ) from None
        raise


# --- domains ------------------------------------------------------------------------------------


def _check_domain_refs(
    team: Team, rubric: Rubric | None, sandbox_image: SandboxImage | None
) -> None:
    if rubric is not None and rubric.team_id != team.pk:
        raise ValidationError({"rubric": "choose a rubric of this team"})
    if sandbox_image is not None and sandbox_image.team_id != team.pk:
        raise ValidationError({"sandbox_image": "choose a sandbox image of this team"})


def _check_weight(weight: float) -> None:
    if weight is None or not (0 <= float(weight) < float("inf")):
        raise ValidationError({"default_mix_weight": "must be a number ≥ 0"})


@transaction.atomic
def domain_create(
    *,
    actor: Any,
    team: Team,
    slug: str,
    title: str,
    description: str = "",
    default_mix_weight: float = 1.0,
    rubric: Rubric | None = None,
    sandbox_image: SandboxImage | None = None,
) -> Domain:
    _check_slug(slug)
    _check_title(title)
    _check_description(description)
    _check_weight(default_mix_weight)
    _check_domain_refs(team, rubric, sandbox_image)
    domain = Domain(
        team=team,
        slug=slug,
        title=title.strip(),
        description=description,
        default_mix_weight=default_mix_weight,
        rubric=rubric,
        sandbox_image=sandbox_image,
        created_by=actor,
    )
    _save_unique(domain, what="domain")
    audit_record(
        actor=actor,
        team=team,
        action="domain.create",
        target=domain,
        before=None,
        after=snapshot(domain),
    )
    return domain


DOMAIN_EDITABLE = ("slug", "title", "description", "default_mix_weight", "rubric", "sandbox_image")


@transaction.atomic
def domain_update(*, actor: Any, domain: Domain, **changes: Any) -> Domain:
    unknown = set(changes) - set(DOMAIN_EDITABLE)
    if unknown:
        raise ValidationError({name: "cannot be changed" for name in sorted(unknown)})
    domain = Domain.objects.select_for_update().get(pk=domain.pk)
    before = snapshot(domain)
    for name, value in changes.items():
        setattr(domain, name, value.strip() if name == "title" else value)
    _check_slug(domain.slug)
    _check_title(domain.title)
    _check_description(domain.description)
    _check_weight(domain.default_mix_weight)
    _check_domain_refs(domain.team, domain.rubric, domain.sandbox_image)
    _save_unique(domain, what="domain")
    after = snapshot(domain)
    if after != before:
        audit_record(
            actor=actor,
            team=domain.team,
            action="domain.update",
            target=domain,
            before=before,
            after=after,
        )
    return domain


@dataclass
class UploadResult:
    stored: bool
    lines: int = 0
    valid: int = 0
    invalid: int = 0
    held_out: int = 0
    errors: list[tasksets.RowError] = field(default_factory=list)
    # The first valid rows as read, so a refused upload still shows what the file holds.
    preview: list[tasksets.ParsedTask] = field(default_factory=list)
    file_error: str = ""
    # The task-set version the stored upload took over from (0: the domain had none); it is
    # kept, no longer current.
    replaced_version: int = 0

    @property
    def more_errors(self) -> int:
        return self.invalid - len(self.errors)


class _Rollback(Exception):
    """Raised inside the upload transaction to undo it while keeping the report."""


def domain_upload_tasks(
    *,
    actor: Any,
    domain: Domain,
    stream: IO[bytes],
    filename: str,
    held_out_fraction: float,
    split_seed: int,
    keep_valid_rows: bool = False,
    max_line_bytes: int | None = None,
) -> UploadResult:
    """Store the tasks in a JSONL file as the domain's next task-set version, which becomes
    current; earlier versions' tasks are kept (runs pin the version they trained on).

    If any row is invalid nothing changes, unless `keep_valid_rows`; then the valid rows are
    stored and the invalid ones reported. Either way the report lists errors by line number.
    Rows stream into the table as they are read, so memory holds about one line, whatever the
    file's size.
    """
    _check_split(held_out_fraction, split_seed)
    _check_no_nul("filename", filename)
    limit = max_line_bytes or settings.TASKSET_MAX_LINE_BYTES
    result = UploadResult(stored=False)
    try:
        with transaction.atomic():
            locked = Domain.objects.select_for_update().get(pk=domain.pk)
            before = snapshot(locked)
            new_version = locked.taskset_version + 1
            _store_rows(
                locked,
                new_version,
                stream,
                limit,
                held_out_fraction,
                split_seed,
                keep_valid_rows,
                result,
            )
            if result.invalid and not keep_valid_rows:
                raise _Rollback
            if result.valid == 0:
                result.file_error = (
                    "the file holds no tasks"
                    if not result.invalid
                    else ("no row is valid, so nothing was stored")
                )
                raise _Rollback
            result.replaced_version = locked.taskset_version
            locked.taskset_version = new_version
            locked.taskset_filename = PurePosixPath(filename).name[:255]
            locked.taskset_uploaded_at = timezone.now()
            locked.task_count = result.valid
            locked.held_out_count = result.held_out
            locked.held_out_fraction = held_out_fraction
            locked.split_seed = split_seed
            locked.save(
                update_fields=[
                    "taskset_version",
                    "taskset_filename",
                    "taskset_uploaded_at",
                    "task_count",
                    "held_out_count",
                    "held_out_fraction",
                    "split_seed",
                    "updated_at",
                ]
            )
            audit_record(
                actor=actor,
                team=locked.team,
                action="domain.upload_tasks",
                target=locked,
                before=before,
                after={
                    **snapshot(locked),
                    "rows_stored": result.valid,
                    "rows_rejected": result.invalid,
                },
            )
            result.stored = True
    except _Rollback:
        result.stored = False
    except tasksets.TasksetFileError as exc:
        result.stored = False
        result.file_error = str(exc)
    return result


def _json_text(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def _store_rows(
    domain: Domain,
    taskset_version: int,
    stream: IO[bytes],
    max_line_bytes: int,
    held_out_fraction: float,
    split_seed: int,
    keep_valid_rows: bool,
    result: UploadResult,
) -> None:
    """Stream rows into the task table with PostgreSQL's COPY: rows go to the server as they are
    read, so memory holds one line at a time, and a 100,000-row file loads in seconds (building
    model instances for bulk_create cost about ten times as much here)."""
    columns = ", ".join(
        connection.ops.quote_name(Task._meta.get_field(name).column)  # type: ignore[union-attr, arg-type]
        for name in (
            "domain",
            "taskset_version",
            "index",
            "line_number",
            "prompt",
            "messages",
            "ground_truth",
            "metadata",
            "split",
            "split_from_file",
        )
    )
    table = connection.ops.quote_name(Task._meta.db_table)
    storing = True
    with connection.cursor() as cursor, cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for line_number, row in tasksets.read_tasks(stream, max_line_bytes=max_line_bytes):
            result.lines = line_number
            if isinstance(row, tasksets.RowError):
                result.invalid += 1
                if len(result.errors) < MAX_REPORTED_ROW_ERRORS:
                    result.errors.append(row)
                # Nothing will be stored: keep reading only to report every error.
                storing = keep_valid_rows
                continue
            index = result.valid
            result.valid += 1
            if len(result.preview) < PREVIEW_ROWS:
                result.preview.append(row)
            if not storing:
                continue
            split = row.split or (
                TaskSplit.HELD_OUT
                if tasksets.held_out(split_seed, index, held_out_fraction)
                else TaskSplit.TRAIN
            )
            if split == TaskSplit.HELD_OUT:
                result.held_out += 1
            copy.write_row(
                (
                    domain.pk,
                    taskset_version,
                    index,
                    line_number,
                    row.prompt,
                    _json_text(row.messages),
                    _json_text(row.ground_truth),
                    _json_text(row.metadata),
                    split,
                    row.split is not None,
                )
            )


RESPLIT_COLUMNS = ("index", "split", "domain", "split_from_file", "taskset_version")


@transaction.atomic
def domain_resplit(
    *, actor: Any, domain: Domain, held_out_fraction: float, split_seed: int
) -> Domain:
    """Re-draw the train/held-out split of the current task set with a new fraction or seed, in
    one UPDATE (PostgreSQL computes the same hash as the upload does). Rows whose split the file
    named keep it; older task-set versions are left as runs pinned them."""
    _check_split(held_out_fraction, split_seed)
    locked = Domain.objects.select_for_update().get(pk=domain.pk)
    before = snapshot(locked)
    quote = connection.ops.quote_name
    column = {name: quote(Task._meta.get_field(name).column) for name in RESPLIT_COLUMNS}  # type: ignore[union-attr, arg-type]
    split_hash = tasksets.split_hash_sql("%s", column["index"])
    # Identifiers come from the model; every value is a query parameter.
    sql = (
        f"UPDATE {quote(Task._meta.db_table)} SET {column['split']} = "  # noqa: S608
        f"CASE WHEN {split_hash} < %s THEN %s ELSE %s END "
        f"WHERE {column['domain']} = %s AND {column['taskset_version']} = %s "
        f"AND NOT {column['split_from_file']}"
    )
    params: list[int | str] = [
        split_seed,
        tasksets.split_threshold(held_out_fraction),
        str(TaskSplit.HELD_OUT.value),
        str(TaskSplit.TRAIN.value),
        int(locked.pk),
        int(locked.taskset_version),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    locked.held_out_fraction = held_out_fraction
    locked.split_seed = split_seed
    locked.held_out_count = locked.tasks.filter(
        taskset_version=locked.taskset_version, split=TaskSplit.HELD_OUT
    ).count()
    locked.save(update_fields=["held_out_fraction", "split_seed", "held_out_count", "updated_at"])
    audit_record(
        actor=actor,
        team=locked.team,
        action="domain.resplit",
        target=locked,
        before=before,
        after=snapshot(locked),
    )
    return locked


# --- versioned objects: one layer for rubrics, sandbox images (and, next, base models) ---------
#
# A team-owned object with a slug, a title and numbered versions; at most one version is a
# draft (editable), publishing freezes it, and every change is audited. What differs between
# kinds is only the version's payload and how it is checked: a `VersionedKind` plugs those in,
# and the services below do the rest the same way for every kind.
#
# Adding a kind (base models, for the runs issue):
# 1. models: `BaseModel(VersionedObject)` with its `team` foreign key and per-team unique slug,
#    `BaseModelVersion(ObjectVersion)` with the foreign key (related_name="versions"), the
#    payload fields and `constraints = version_constraints("base_model", "<fk name>")`;
# 2. here: a payload check (raises ValidationError by field) and `VersionedKind(...)` added to
#    VERSIONED_KINDS; thin `base_model_*` wrappers only if callers want them;
# 3. views.KIND_PAGES: its forms and templates (a version page and a draft/create form; the
#    list, detail, rename, create, draft and publish views and templates are shared), and its
#    URLs under the names `registry:base_model_<page>` with `{"kind": "base_model"}`;
# 4. api: its schemas and routes, using `_versioned`, `_version`, `_update_meta`, `_publish`.


@dataclass(frozen=True)
class VersionedKind:
    """How one kind of versioned object plugs into the shared services, selectors and pages.

    `check_payload` takes the version values a user gave and returns the fields to store on
    the version (raising ValidationError with field -> messages); `stored_payload` gives back
    what a stored version was made from, so publishing can check it again under today's rules.
    """

    key: str  # "rubric": audit action prefix and URL-name prefix
    label: str  # "rubric", "sandbox image": for messages
    model: type[models.Model]
    version_model: type[models.Model]
    parent_field: str  # the version's foreign key to its object
    check_payload: Callable[[Mapping[str, Any]], dict[str, Any]]
    stored_payload: Callable[[Any], dict[str, Any]]

    def versions(self, obj: Any) -> models.QuerySet:
        return self.version_model.objects.filter(**{self.parent_field: obj})  # type: ignore[attr-defined, no-any-return]


def _next_number(versions: models.QuerySet) -> int:
    return (versions.aggregate(top=Max("number"))["top"] or 0) + 1


def _publish(version: Any, actor: Any) -> None:
    """Flip a draft to published with a conditional update: of two concurrent publishers exactly
    one changes the row; the other learns it lost."""
    now = timezone.now()
    changed = (
        type(version)
        .objects.filter(pk=version.pk, status=VersionStatus.DRAFT)
        .update(
            status=VersionStatus.PUBLISHED, published_at=now, published_by=actor, updated_at=now
        )
    )
    if changed != 1:
        raise VersionConflict(f"version {version.number} is already published")
    version.refresh_from_db()


def _check_meta(slug: str, title: str, description: str) -> None:
    _check_slug(slug)
    _check_title(title)
    _check_description(description)


@transaction.atomic
def versioned_create(
    *,
    kind: VersionedKind,
    actor: Any,
    team: Team,
    slug: str,
    title: str,
    description: str = "",
    payload: Mapping[str, Any],
) -> Any:
    """The object and its draft version 1."""
    _check_meta(slug, title, description)
    fields = kind.check_payload(payload)
    obj = kind.model(
        team=team, slug=slug, title=title.strip(), description=description, created_by=actor
    )
    _save_unique(obj, what=kind.label)
    version = kind.version_model.objects.create(  # type: ignore[attr-defined]
        **{kind.parent_field: obj}, number=1, created_by=actor, **fields
    )
    audit_record(
        actor=actor,
        team=team,
        action=f"{kind.key}.create",
        target=obj,
        before=None,
        after={**snapshot(obj), "draft": snapshot(version)},
    )
    return obj


@transaction.atomic
def versioned_update(
    *, kind: VersionedKind, actor: Any, obj: Any, slug: str, title: str, description: str
) -> Any:
    """Rename or re-describe the object (its versions are untouched)."""
    obj = kind.model.objects.select_for_update().get(pk=obj.pk)  # type: ignore[attr-defined]
    before = snapshot(obj)
    _check_meta(slug, title, description)
    obj.slug, obj.title, obj.description = slug, title.strip(), description
    _save_unique(obj, what=kind.label)
    after = snapshot(obj)
    if after != before:
        audit_record(
            actor=actor,
            team=obj.team,
            action=f"{kind.key}.update",
            target=obj,
            before=before,
            after=after,
        )
    return obj


@transaction.atomic
def versioned_save_draft(
    *, kind: VersionedKind, actor: Any, obj: Any, payload: Mapping[str, Any]
) -> Any:
    """Edit the object's draft, or start a new draft version after the published ones."""
    fields = kind.check_payload(payload)
    # Locking the object serialises draft edits and publishes of the same object.
    obj = kind.model.objects.select_for_update().get(pk=obj.pk)  # type: ignore[attr-defined]
    versions = kind.versions(obj)
    draft = versions.filter(status=VersionStatus.DRAFT).first()
    if draft is None:
        draft = kind.version_model(
            **{kind.parent_field: obj}, number=_next_number(versions), created_by=actor
        )
        before = None
    else:
        before = snapshot(draft)
    for name, value in fields.items():
        setattr(draft, name, value)
    draft.save()
    audit_record(
        actor=actor,
        team=obj.team,
        action=f"{kind.key}.save_draft",
        target=draft,
        before=before,
        after=snapshot(draft),
    )
    return draft


@transaction.atomic
def versioned_publish(*, kind: VersionedKind, actor: Any, version: Any) -> Any:
    """Freeze a draft. Its payload is checked again first: what was valid when saved may not be
    under today's libraries and settings, and a published version is what runs start from."""
    obj = kind.model.objects.select_for_update().get(pk=getattr(version, f"{kind.parent_field}_id"))  # type: ignore[attr-defined]
    version = kind.version_model.objects.get(pk=version.pk)  # type: ignore[attr-defined]
    if not version.is_draft:
        raise VersionConflict(f"version {version.number} is already published")
    kind.check_payload(kind.stored_payload(version))
    before = snapshot(version)
    _publish(version, actor)
    audit_record(
        actor=actor,
        team=obj.team,
        action=f"{kind.key}.publish",
        target=version,
        before=before,
        after=snapshot(version),
    )
    return version


# --- rubrics: the payload is the spec's text ----------------------------------------------------


def _checked_spec(source: str, source_format: str) -> dict[str, Any]:
    if source_format not in SpecFormat.values:
        raise ValidationError({"source_format": "choose json or yaml"})
    spec, issues = specs.check_rubric_source(source, source_format)
    if issues or spec is None:
        raise ValidationError({"source": [str(issue) for issue in issues]})
    return spec


def _checked_rubric_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    source, source_format = payload.get("source"), payload.get("source_format")
    if not isinstance(source, str):
        raise ValidationError({"source": "the spec's text is required"})
    spec = _checked_spec(source, str(source_format))
    return {"source": source, "source_format": source_format, "spec": spec}


RUBRIC = VersionedKind(
    key="rubric",
    label="rubric",
    model=Rubric,
    version_model=RubricVersion,
    parent_field="rubric",
    check_payload=_checked_rubric_payload,
    stored_payload=lambda version: {
        "source": version.source,
        "source_format": version.source_format,
    },
)


def rubric_create(
    *,
    actor: Any,
    team: Team,
    slug: str,
    title: str,
    description: str = "",
    source: str,
    source_format: str,
) -> Rubric:
    return versioned_create(  # type: ignore[no-any-return]
        kind=RUBRIC,
        actor=actor,
        team=team,
        slug=slug,
        title=title,
        description=description,
        payload={"source": source, "source_format": source_format},
    )


def rubric_update(*, actor: Any, rubric: Rubric, slug: str, title: str, description: str) -> Rubric:
    return versioned_update(  # type: ignore[no-any-return]
        kind=RUBRIC, actor=actor, obj=rubric, slug=slug, title=title, description=description
    )


def rubric_save_draft(
    *, actor: Any, rubric: Rubric, source: str, source_format: str
) -> RubricVersion:
    return versioned_save_draft(  # type: ignore[no-any-return]
        kind=RUBRIC,
        actor=actor,
        obj=rubric,
        payload={"source": source, "source_format": source_format},
    )


def rubric_version_publish(*, actor: Any, version: RubricVersion) -> RubricVersion:
    return versioned_publish(kind=RUBRIC, actor=actor, version=version)  # type: ignore[no-any-return]


# --- sandbox images: the payload is the image and its limits ------------------------------------

SANDBOX_VERSION_FIELDS = SANDBOX_SPEC_FIELDS
SANDBOX_DEFAULTS: dict[str, Any] = {
    "driver": SandboxDriver.BWRAP,
    "image_ref": "",
    "setup_script": "",
    "cpu": 1.0,
    "memory_mb": 1024,
    "pids": 256,
    "disk_mb": 1024,
    "timeout_s": 60,
    "network": SandboxNetwork.NONE,
}


def sandbox_version_problems(values: Mapping[str, Any]) -> dict[str, list[str]]:
    """Problems with a sandbox image version's fields, by field name; empty when valid."""
    problems: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    driver = values.get("driver")
    if driver not in SandboxDriver.values:
        add("driver", "choose bwrap, podman or docker")
    network = values.get("network")
    if network not in SandboxNetwork.values:
        add("network", "choose none or loopback")
    for name, (low, high) in LIMIT_BOUNDS.items():
        value = values.get(name)
        integral = name not in FRACTIONAL_LIMITS
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            add(name, "must be a number" if not integral else "must be a whole number")
        elif integral and int(value) != value:
            add(name, "must be a whole number")
        elif not (low <= value <= high):
            add(name, f"must be between {format_bound(low)} and {format_bound(high)}")
    ref = values.get("image_ref") or ""
    script = values.get("setup_script") or ""
    if not isinstance(ref, str) or len(ref) > 500:
        add("image_ref", "at most 500 characters")
    elif driver in (SandboxDriver.PODMAN, SandboxDriver.DOCKER):
        if not ref:
            add("image_ref", f"{driver} needs an image reference such as python:3.11-slim")
        elif not OCI_REF_RE.match(ref):
            add("image_ref", "not an image reference (registry/name:tag or name@sha256:…)")
        if script:
            add(
                "setup_script",
                f"setup scripts build bwrap images; for {driver}, bake the setup into the image",
            )
    elif driver == SandboxDriver.BWRAP and ref:
        add(
            "image_ref",
            "bwrap images start from the host's read-only system: leave this empty and put "
            "installation steps in the setup script",
        )
    if not isinstance(script, str) or len(script) > MAX_SETUP_SCRIPT_CHARS:
        add("setup_script", f"at most {MAX_SETUP_SCRIPT_CHARS:,} characters")
    elif "\x00" in script:
        add("setup_script", "must not contain NUL bytes")
    if not problems:
        # The sandboxes library has the last word: a version it would refuse is never stored.
        spec = sandbox_spec_dict(dict(values), image_name="registry-check")
        try:
            SandboxSpec.from_dict(spec)
        except SandboxSpecError as refused:
            for name, message in refused.errors.items():
                target = {"image": "setup_script" if driver == "bwrap" else "image_ref"}.get(
                    name, name
                )
                add(target if target in SANDBOX_VERSION_FIELDS else "driver", message)
    return problems


def _checked_sandbox_values(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(values) - set(SANDBOX_VERSION_FIELDS)
    if unknown:
        raise ValidationError({name: "unknown field" for name in sorted(unknown)})
    merged = {**SANDBOX_DEFAULTS, **values}
    problems = sandbox_version_problems(merged)
    if problems:
        raise ValidationError(problems)
    return merged


SANDBOX_IMAGE = VersionedKind(
    key="sandbox_image",
    label="sandbox image",
    model=SandboxImage,
    version_model=SandboxImageVersion,
    parent_field="image",
    check_payload=_checked_sandbox_values,
    stored_payload=lambda version: {
        name: getattr(version, name) for name in SANDBOX_VERSION_FIELDS
    },
)

VERSIONED_KINDS: dict[str, VersionedKind] = {kind.key: kind for kind in (RUBRIC, SANDBOX_IMAGE)}


def sandbox_image_create(
    *, actor: Any, team: Team, slug: str, title: str, description: str = "", **version_values: Any
) -> SandboxImage:
    return versioned_create(  # type: ignore[no-any-return]
        kind=SANDBOX_IMAGE,
        actor=actor,
        team=team,
        slug=slug,
        title=title,
        description=description,
        payload=version_values,
    )


def sandbox_image_save_draft(
    *, actor: Any, image: SandboxImage, **version_values: Any
) -> SandboxImageVersion:
    return versioned_save_draft(  # type: ignore[no-any-return]
        kind=SANDBOX_IMAGE, actor=actor, obj=image, payload=version_values
    )


def sandbox_image_version_publish(
    *, actor: Any, version: SandboxImageVersion
) -> SandboxImageVersion:
    return versioned_publish(kind=SANDBOX_IMAGE, actor=actor, version=version)  # type: ignore[no-any-return]
