"""Reads of the registry, always scoped to one team; each selector owns its joins."""

from __future__ import annotations

import difflib
from typing import Any

from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
)

from console.accounts.models import Team
from console.registry.models import (
    Domain,
    Rubric,
    RubricVersion,
    SandboxImage,
    SandboxImageVersion,
    Task,
    VersionStatus,
)
from console.registry.services import RUBRIC, SANDBOX_IMAGE, VersionedKind


def _search(queryset: QuerySet, query: str, fields: tuple[str, ...]) -> QuerySet:
    query = (query or "").strip()
    if not query:
        return queryset
    condition = Q()
    for name in fields:
        condition |= Q(**{f"{name}__icontains": query})
    return queryset.filter(condition)


def _published_exists(kind: VersionedKind, outer: str) -> Exists:
    return Exists(
        kind.version_model.objects.filter(  # type: ignore[attr-defined]
            **{kind.parent_field: OuterRef(outer)}, status=VersionStatus.PUBLISHED
        )
    )


def domain_list(*, team: Team | int, query: str = "") -> QuerySet[Domain]:
    """The team's domains, each with `ready`: whether a run could train on it now (tasks, a
    rubric with a published version, and a published version of its image if it has one);
    `domain_blockers` says why not."""
    domains = (
        Domain.objects.filter(team=team)
        .select_related("rubric", "sandbox_image")
        .annotate(
            rubric_published=_published_exists(RUBRIC, "rubric_id"),
            image_published=_published_exists(SANDBOX_IMAGE, "sandbox_image_id"),
        )
        .annotate(
            ready=ExpressionWrapper(
                Q(task_count__gt=0, rubric_published=True)
                & (Q(sandbox_image__isnull=True) | Q(image_published=True)),
                output_field=BooleanField(),
            )
        )
    )
    return _search(domains, query, ("slug", "title", "description")).order_by("slug")


def domain_get(*, pk: int) -> Domain:
    """The domain with its team (for the access check) and references; raises DoesNotExist."""
    return Domain.objects.select_related("team", "rubric", "sandbox_image").get(pk=pk)


def domain_tasks(
    *, domain: Domain, split: str = "", taskset_version: int | None = None
) -> QuerySet[Task]:
    """The tasks of one task-set version (the current one unless named), in file order."""
    version = domain.taskset_version if taskset_version is None else taskset_version
    tasks = Task.objects.filter(domain=domain, taskset_version=version)
    if split:
        tasks = tasks.filter(split=split)
    return tasks.order_by("index")


def _latest_published(model: type[Any], parent_field: str) -> Subquery:
    return Subquery(
        model.objects.filter(**{parent_field: OuterRef("pk")}, status=VersionStatus.PUBLISHED)
        .order_by("-number")
        .values("number")[:1]
    )


# --- versioned objects (rubrics, sandbox images): the same reads for every kind ------------------


def versioned_list(*, kind: VersionedKind, team: Team | int, query: str = "") -> QuerySet:
    """The team's objects of a kind, each with how many versions it has, whether one is a draft
    and its newest published number (None: nothing a run could use yet)."""
    objects = kind.model.objects.filter(team=team).annotate(  # type: ignore[attr-defined]
        version_count=Count("versions", distinct=True),
        draft_count=Count(
            "versions", filter=Q(versions__status=VersionStatus.DRAFT), distinct=True
        ),
        latest_published=_latest_published(kind.version_model, kind.parent_field),
    )
    return _search(objects, query, ("slug", "title", "description")).order_by("slug")


def versioned_get(*, kind: VersionedKind, pk: int) -> Any:
    """The object with its team (for the access check) and its versions, newest first; raises
    the model's DoesNotExist."""
    versions = kind.version_model.objects.select_related(  # type: ignore[attr-defined]
        "created_by", "published_by"
    ).order_by("-number")
    return (
        kind.model.objects.select_related("team", "created_by")  # type: ignore[attr-defined]
        .prefetch_related(Prefetch("versions", queryset=versions))
        .get(pk=pk)
    )


def versioned_version_get(*, kind: VersionedKind, obj: Any, number: int) -> Any:
    return kind.version_model.objects.select_related(  # type: ignore[attr-defined]
        f"{kind.parent_field}__team", "created_by", "published_by"
    ).get(**{kind.parent_field: obj}, number=number)


def versioned_draft(*, kind: VersionedKind, obj: Any) -> Any:
    return kind.versions(obj).filter(status=VersionStatus.DRAFT).first()


def versioned_latest(*, kind: VersionedKind, obj: Any) -> Any:
    return kind.versions(obj).order_by("-number").first()


def rubric_list(*, team: Team | int, query: str = "") -> QuerySet[Rubric]:
    return versioned_list(kind=RUBRIC, team=team, query=query)


def rubric_version_changes(*, version: RubricVersion) -> list[tuple[str, str]]:
    """Lines of a unified diff of the source against the previous version, each with its kind
    (add, remove, hunk, same) for the page; empty for version 1."""
    previous = (
        RubricVersion.objects.filter(rubric_id=version.rubric_id, number__lt=version.number)
        .order_by("-number")
        .first()
    )
    if previous is None:
        return []
    lines = difflib.unified_diff(
        previous.source.splitlines(),
        version.source.splitlines(),
        fromfile=f"v{previous.number}",
        tofile=f"v{version.number}",
        lineterm="",
    )
    kinds = {"+": "add", "-": "remove", "@": "hunk"}
    return [(kinds.get(line[:1], "same"), line) for line in lines]


def rubric_draft(*, rubric: Rubric) -> RubricVersion | None:
    return versioned_draft(kind=RUBRIC, obj=rubric)  # type: ignore[no-any-return]


def rubric_choices(*, team: Team | int) -> QuerySet[Rubric]:
    """The team's rubrics a domain may point to, each with `has_published` (a run needs one)."""
    return (
        Rubric.objects.filter(team=team)
        .annotate(has_published=_published_exists(RUBRIC, "pk"))
        .order_by("slug")
    )


def sandbox_image_list(*, team: Team | int, query: str = "") -> QuerySet[SandboxImage]:
    return versioned_list(kind=SANDBOX_IMAGE, team=team, query=query)


def sandbox_image_draft(*, image: SandboxImage) -> SandboxImageVersion | None:
    return versioned_draft(kind=SANDBOX_IMAGE, obj=image)  # type: ignore[no-any-return]


def sandbox_image_choices(*, team: Team | int) -> QuerySet[SandboxImage]:
    """The team's images a domain may point to, each with `has_published`."""
    return (
        SandboxImage.objects.filter(team=team)
        .annotate(has_published=_published_exists(SANDBOX_IMAGE, "pk"))
        .order_by("slug")
    )


def _has_published(kind: VersionedKind, obj: Any) -> bool:
    return kind.versions(obj).filter(status=VersionStatus.PUBLISHED).exists()


def domain_taskset_versions(*, domain: Domain) -> list[dict[str, int]]:
    """Every task-set version the domain still holds, newest first, with its task count."""
    rows = (
        Task.objects.filter(domain=domain)
        .values("taskset_version")
        .annotate(tasks=Count("pk"))
        .order_by("-taskset_version")
    )
    return [{"version": row["taskset_version"], "tasks": row["tasks"]} for row in rows]


def domain_blockers(*, domain: Domain) -> list[str]:
    """Why a run could not train on the domain yet, in words for its page; empty when it can.
    A run pins a published rubric version (and image version, when the domain uses one)."""
    blockers = []
    if domain.task_count == 0:
        blockers.append("it has no tasks yet")
    if domain.rubric is None:
        blockers.append("it has no reward rubric")
    elif not _has_published(RUBRIC, domain.rubric):
        blockers.append(f"rubric {domain.rubric.slug} has no published version yet")
    if domain.sandbox_image is not None and not _has_published(SANDBOX_IMAGE, domain.sandbox_image):
        blockers.append(f"sandbox image {domain.sandbox_image.slug} has no published version yet")
    return blockers


def registry_counts(*, team: Team | int) -> dict[str, int]:
    return {
        "domains": Domain.objects.filter(team=team).count(),
        "rubrics": Rubric.objects.filter(team=team).count(),
        "sandbox_images": SandboxImage.objects.filter(team=team).count(),
        "tasks": Task.objects.filter(
            domain__team=team, taskset_version=F("domain__taskset_version")
        ).count(),
    }
