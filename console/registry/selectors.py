"""Reads of the registry, always scoped to one team; each selector owns its joins."""

from __future__ import annotations

import difflib

from django.db.models import Count, OuterRef, Prefetch, Q, QuerySet, Subquery

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


def _search(queryset: QuerySet, query: str, fields: tuple[str, ...]) -> QuerySet:
    query = (query or "").strip()
    if not query:
        return queryset
    condition = Q()
    for name in fields:
        condition |= Q(**{f"{name}__icontains": query})
    return queryset.filter(condition)


def domain_list(*, team: Team | int, query: str = "") -> QuerySet[Domain]:
    domains = Domain.objects.filter(team=team).select_related("rubric", "sandbox_image")
    return _search(domains, query, ("slug", "title", "description")).order_by("slug")


def domain_get(*, pk: int) -> Domain:
    """The domain with its team (for the access check) and references; raises DoesNotExist."""
    return Domain.objects.select_related("team", "rubric", "sandbox_image").get(pk=pk)


def domain_tasks(*, domain: Domain, split: str = "") -> QuerySet[Task]:
    tasks = Task.objects.filter(domain=domain)
    if split:
        tasks = tasks.filter(split=split)
    return tasks.order_by("index")


def _latest_published(
    model: type[RubricVersion] | type[SandboxImageVersion], parent_field: str
) -> Subquery:
    return Subquery(
        model.objects.filter(**{parent_field: OuterRef("pk")}, status=VersionStatus.PUBLISHED)
        .order_by("-number")
        .values("number")[:1]
    )


def rubric_list(*, team: Team | int, query: str = "") -> QuerySet[Rubric]:
    rubrics = Rubric.objects.filter(team=team).annotate(
        version_count=Count("versions", distinct=True),
        draft_count=Count(
            "versions", filter=Q(versions__status=VersionStatus.DRAFT), distinct=True
        ),
        latest_published=_latest_published(RubricVersion, "rubric"),
    )
    return _search(rubrics, query, ("slug", "title", "description")).order_by("slug")


def rubric_get(*, pk: int) -> Rubric:
    versions = RubricVersion.objects.select_related("created_by", "published_by").order_by(
        "-number"
    )
    return (
        Rubric.objects.select_related("team", "created_by")
        .prefetch_related(Prefetch("versions", queryset=versions))
        .get(pk=pk)
    )


def rubric_version_get(*, rubric: Rubric, number: int) -> RubricVersion:
    return RubricVersion.objects.select_related("rubric__team", "created_by", "published_by").get(
        rubric=rubric, number=number
    )


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
    return rubric.versions.filter(status=VersionStatus.DRAFT).first()


def rubric_latest(*, rubric: Rubric) -> RubricVersion | None:
    return rubric.versions.order_by("-number").first()


def rubric_choices(*, team: Team | int) -> QuerySet[Rubric]:
    return Rubric.objects.filter(team=team).order_by("slug")


def sandbox_image_list(*, team: Team | int, query: str = "") -> QuerySet[SandboxImage]:
    images = SandboxImage.objects.filter(team=team).annotate(
        version_count=Count("versions", distinct=True),
        latest_published=_latest_published(SandboxImageVersion, "image"),
    )
    return _search(images, query, ("slug", "title", "description")).order_by("slug")


def sandbox_image_get(*, pk: int) -> SandboxImage:
    versions = SandboxImageVersion.objects.select_related("created_by", "published_by").order_by(
        "-number"
    )
    return (
        SandboxImage.objects.select_related("team", "created_by")
        .prefetch_related(Prefetch("versions", queryset=versions))
        .get(pk=pk)
    )


def sandbox_image_version_get(*, image: SandboxImage, number: int) -> SandboxImageVersion:
    return SandboxImageVersion.objects.select_related(
        "image__team", "created_by", "published_by"
    ).get(image=image, number=number)


def sandbox_image_draft(*, image: SandboxImage) -> SandboxImageVersion | None:
    return image.versions.filter(status=VersionStatus.DRAFT).first()


def sandbox_image_latest(*, image: SandboxImage) -> SandboxImageVersion | None:
    return image.versions.order_by("-number").first()


def sandbox_image_choices(*, team: Team | int) -> QuerySet[SandboxImage]:
    return SandboxImage.objects.filter(team=team).order_by("slug")


def registry_counts(*, team: Team | int) -> dict[str, int]:
    return {
        "domains": Domain.objects.filter(team=team).count(),
        "rubrics": Rubric.objects.filter(team=team).count(),
        "sandbox_images": SandboxImage.objects.filter(team=team).count(),
        "tasks": Task.objects.filter(domain__team=team).count(),
    }
