"""Task-set versions: an upload adds the next version and makes it current; the version it
replaces is named before the upload and stays readable afterwards (runs pin task-set versions),
on the page and through the API. Re-splitting touches only the current version."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from console.registry import selectors, services
from console.registry.models import Task
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS
from tests.console.test_registry_factories import Registry, build_registry, jsonl, task_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def registry(people: Any) -> Registry:
    """The shared registry, whose domain holds 30 tasks as v1, plus a second upload of 5 tasks
    (v2, current)."""
    built = build_registry(people)
    result = services.domain_upload_tasks(
        actor=people.owner,
        domain=built.domain,
        stream=io.BytesIO(jsonl(task_rows(5, start=100))),
        filename="second.jsonl",
        held_out_fraction=0,
        split_seed=0,
    )
    assert result.stored and result.replaced_version == 1
    built.domain.refresh_from_db()
    return built


def test_an_upload_keeps_the_version_it_replaces(registry: Registry) -> None:
    domain = registry.domain
    assert domain.taskset_version == 2 and domain.task_count == 5
    assert Task.objects.filter(domain=domain, taskset_version=1).count() == 30
    assert selectors.domain_tasks(domain=domain).count() == 5
    assert selectors.domain_tasks(domain=domain, taskset_version=1).count() == 30
    assert selectors.domain_taskset_versions(domain=domain) == [
        {"version": 2, "tasks": 5},
        {"version": 1, "tasks": 30},
    ]


def test_the_upload_form_names_the_version_it_will_replace(
    registry: Registry, owner_client: Client
) -> None:
    for url in (
        reverse("registry:domain_detail", args=[registry.domain.pk]),
        reverse("registry:domain_upload", args=[registry.domain.pk]),
    ):
        content = owner_client.get(url).content.decode()
        assert "Uploading stores task set <strong>v3</strong>" in content, url
        assert "replacing <strong>v2</strong> (5 tasks from second.jsonl)" in content, url
        assert "v2 stays available" in content, url


def test_the_success_message_says_which_version_was_stored_and_replaced(
    registry: Registry, owner_client: Client
) -> None:
    url = reverse("registry:domain_upload", args=[registry.domain.pk])
    data = {"file": SimpleUploadedFile("t.jsonl", jsonl(task_rows(2))), "held_out_fraction": "0"}
    page = owner_client.post(url, {**data, "split_seed": "0"})
    assert page.status_code == 302
    shown = owner_client.get(page["Location"]).content.decode()
    assert (
        "Stored 2 tasks as task set v3 (0 held out); v2, which it replaces, stays available."
        in shown
    )


@pytest.mark.parametrize("who", EVERYONE)
def test_an_older_task_set_is_readable_by_the_team_only(
    who: str, registry: Registry, client_as: Callable[[str], Client]
) -> None:
    url = reverse("registry:domain_detail", args=[registry.domain.pk]) + "?taskset=1"
    response = client_as(who).get(url)
    if who == ANONYMOUS:
        assert response.status_code == 302
        return
    if who == OUTSIDER:
        assert response.status_code == 404
        return
    assert who in READERS and response.status_code == 200
    content = response.content.decode()
    assert "an older version kept for the runs that pinned it" in content
    assert "What is 0 + 0?" in content  # v1's first task
    assert "What is 100 + 100?" not in content  # v2's
    assert "<strong>v1</strong> (30 tasks)" in content and "(5 tasks, current)" in content


@pytest.mark.parametrize("asked", ["0", "3", "-1", "x", "9" * 30, "1\x00"])
def test_a_task_set_version_the_domain_never_had_is_a_404(
    asked: str, registry: Registry, owner_client: Client
) -> None:
    url = reverse("registry:domain_detail", args=[registry.domain.pk])
    assert owner_client.get(url, {"taskset": asked}).status_code == 404


def test_the_api_reads_an_older_task_set(
    registry: Registry, api_client_as: Callable[[str], Client]
) -> None:
    client = api_client_as("owner")
    base = f"/api/registry/domains/{registry.domain.pk}/tasks"
    assert client.get(base).json()["count"] == 5
    assert client.get(base + "?taskset=1").json()["count"] == 30
    assert client.get(base + "?taskset=3").status_code == 404
    assert client.get(base + "?taskset=0").status_code == 422


def test_the_api_upload_names_the_version_it_replaced(
    registry: Registry, api_client_as: Callable[[str], Client]
) -> None:
    response = api_client_as("owner").post(
        f"/api/registry/domains/{registry.domain.pk}/tasks",
        jsonl(task_rows(2)),
        content_type="application/jsonl",
    )
    assert response.status_code == 200
    assert response.json()["replaced_taskset_version"] == 2
    assert response.json()["domain"]["taskset_version"] == 3


def test_resplitting_changes_only_the_current_task_set(registry: Registry, people: Any) -> None:
    before = list(
        Task.objects.filter(domain=registry.domain, taskset_version=1).values_list("split")
    )
    services.domain_resplit(
        actor=people.owner, domain=registry.domain, held_out_fraction=1, split_seed=3
    )
    after = list(
        Task.objects.filter(domain=registry.domain, taskset_version=1).values_list("split")
    )
    assert after == before
    assert set(
        Task.objects.filter(domain=registry.domain, taskset_version=2).values_list(
            "split", flat=True
        )
    ) == {"held_out"}
    registry.domain.refresh_from_db()
    assert registry.domain.held_out_count == 5
