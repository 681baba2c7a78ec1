"""The registry's versioned objects as one idea: rubrics and sandbox images share the services,
selectors and pages, so what one kind does the other does too (publish re-validates, lists show
the draft, publishing is offered on the object's page, with a confirmation), and a domain says
plainly when it cannot run yet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from console.registry import services
from console.registry.models import SandboxImageVersion, VersionStatus
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS, WRITERS
from tests.console.test_registry_factories import (
    Registry,
    build_registry,
    make_domain,
    make_image,
    make_rubric,
)

pytestmark = pytest.mark.django_db
KINDS = ("rubric", "sandbox_image")


@pytest.fixture
def registry(people: Any) -> Registry:
    return build_registry(people)


def _obj(registry: Registry, kind: str) -> Any:
    return registry.rubric if kind == "rubric" else registry.image


def _draft_number(registry: Registry, kind: str) -> int:
    return 2 if kind == "rubric" else 1


def _make_stored_image_invalid(image: Any) -> None:
    # What a change to the rules would leave behind: bwrap starts from the host's root, so an
    # image reference is refused today (written past the services, as old rows would be).
    SandboxImageVersion.objects.filter(image=image).update(image_ref="python:3.11-slim")


def test_publishing_a_sandbox_image_checks_its_values_again_like_a_rubric(
    registry: Registry, people: Any
) -> None:
    _make_stored_image_invalid(registry.image)
    draft = registry.image.versions.get()
    with pytest.raises(ValidationError) as refused:
        services.sandbox_image_version_publish(actor=people.owner, version=draft)
    assert "image_ref" in refused.value.message_dict
    draft.refresh_from_db()
    assert draft.status == VersionStatus.DRAFT


def test_the_api_answers_422_for_a_sandbox_draft_that_no_longer_passes(
    registry: Registry, api_client_as: Callable[[str], Client]
) -> None:
    _make_stored_image_invalid(registry.image)
    response = api_client_as("owner").post(
        f"/api/registry/sandbox-images/{registry.image.pk}/versions/1/publish"
    )
    assert response.status_code == 422
    assert "image_ref" in response.json()["errors"]
    assert registry.image.versions.get().status == VersionStatus.DRAFT


def test_the_publish_page_says_why_a_sandbox_draft_was_not_published(
    registry: Registry, client_as: Callable[[str], Client]
) -> None:
    _make_stored_image_invalid(registry.image)
    url = reverse("registry:sandbox_image_version_publish", args=[registry.image.pk, 1])
    response = client_as("owner").post(url, follow=True)
    assert "Not published:" in response.content.decode()
    assert registry.image.versions.get().status == VersionStatus.DRAFT


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_lists_its_draft(
    kind: str, registry: Registry, client_as: Callable[[str], Client]
) -> None:
    content = client_as("owner").get(reverse(f"registry:{kind}_list")).content.decode()
    assert "<th>Draft</th>" in content
    assert '<span class="badge">draft</span>' in content


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("who", EVERYONE)
def test_the_objects_page_offers_publishing_its_draft_to_writers_only(
    kind: str, who: str, registry: Registry, client_as: Callable[[str], Client]
) -> None:
    response = client_as(who).get(
        reverse(f"registry:{kind}_detail", args=[_obj(registry, kind).pk])
    )
    if who == ANONYMOUS:
        assert response.status_code == 302
        return
    if who == OUTSIDER:
        assert response.status_code == 404
        return
    assert who in READERS and response.status_code == 200
    content = response.content.decode()
    number = _draft_number(registry, kind)
    offered = f"Publish v{number}" in content
    assert offered == (who in WRITERS)
    if offered:
        # The first click only explains; the second publishes.
        assert f'<summary class="button primary">Publish v{number}…</summary>' in content
        assert "freezes" in content and f"Yes, publish v{number}" in content


@pytest.mark.parametrize("kind", KINDS)
def test_publishing_from_the_objects_page_returns_there(
    kind: str, registry: Registry, client_as: Callable[[str], Client]
) -> None:
    obj = _obj(registry, kind)
    number = _draft_number(registry, kind)
    url = reverse(f"registry:{kind}_version_publish", args=[obj.pk, number])
    response = client_as("owner").post(url, {"back": "detail"})
    assert response.status_code == 302
    assert response["Location"] == reverse(f"registry:{kind}_detail", args=[obj.pk])
    assert obj.versions.get(number=number).status == VersionStatus.PUBLISHED


def test_a_domain_whose_rubric_has_no_published_version_says_it_cannot_run_yet(
    people: Any, client_as: Callable[[str], Client]
) -> None:
    rubric = make_rubric(team=people.team, user=people.owner, slug="unpublished")
    image = make_image(team=people.team, user=people.owner, slug="unpublished-image")
    domain = make_domain(team=people.team, user=people.owner, rubric=rubric, sandbox_image=image)
    content = (
        client_as("owner").get(reverse("registry:domain_detail", args=[domain.pk])).content.decode()
    )
    assert "Cannot run yet" in content
    assert "rubric unpublished has no published version yet" in content
    assert "sandbox image unpublished-image has no published version yet" in content
    assert "it has no tasks" in content


def test_a_domain_with_tasks_and_published_references_is_ready(
    registry: Registry, people: Any, client_as: Callable[[str], Client]
) -> None:
    services.sandbox_image_version_publish(
        actor=people.owner, version=registry.image.versions.get()
    )
    content = (
        client_as("owner")
        .get(reverse("registry:domain_detail", args=[registry.domain.pk]))
        .content.decode()
    )
    assert "Cannot run yet" not in content
    assert "Ready to run" in content


def test_the_domain_form_marks_what_has_nothing_published(
    people: Any, client_as: Callable[[str], Client]
) -> None:
    make_rubric(team=people.team, user=people.owner, slug="draft-only")
    published = make_rubric(team=people.team, user=people.owner, slug="published")
    services.rubric_version_publish(actor=people.owner, version=published.versions.get())
    content = client_as("owner").get(reverse("registry:domain_create")).content.decode()
    assert "draft-only (no published version yet: cannot run)</option>" in content
    assert ">published</option>" in content


@pytest.mark.parametrize("who", EVERYONE)
def test_the_domain_list_says_which_domains_can_run(
    who: str, registry: Registry, people: Any, client_as: Callable[[str], Client]
) -> None:
    make_domain(team=people.team, user=people.owner, slug="empty")
    services.sandbox_image_version_publish(
        actor=people.owner, version=registry.image.versions.get()
    )
    response = client_as(who).get(reverse("registry:domain_list"))
    if who == ANONYMOUS:
        assert response.status_code == 302
        return
    content = response.content.decode()
    if who == OUTSIDER:
        # Their own team's list: none of this team's domains.
        assert "empty" not in content and "cannot run yet" not in content
        return
    assert content.count('<span class="badge ok">ready</span>') == 1  # math
    assert content.count("cannot run yet</a>") == 1  # empty: no tasks, no rubric


def test_the_api_says_whether_a_domain_can_run_and_why_not(
    registry: Registry, people: Any, api_client_as: Callable[[str], Client]
) -> None:
    client = api_client_as("owner")
    url = f"/api/registry/domains/{registry.domain.pk}"
    body = client.get(url).json()
    assert body["ready"] is False
    assert body["blockers"] == ["sandbox image python-bwrap has no published version yet"]
    services.sandbox_image_version_publish(
        actor=people.owner, version=registry.image.versions.get()
    )
    body = client.get(url).json()
    assert body["ready"] is True and body["blockers"] == []
    listed = client.get("/api/registry/domains").json()["items"]
    assert [domain["ready"] for domain in listed] == [True]
