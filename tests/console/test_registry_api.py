"""The registry API under /api/registry/: the role matrix for every endpoint (token of the owner,
of teammates of each role, of an outsider, and no token), validation errors with paths, uploads
as a raw JSONL body, publish conflicts and the OpenAPI schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from console.audit.models import AuditEntry
from console.registry.models import (
    Domain,
    Rubric,
    RubricVersion,
    SandboxImage,
    SandboxImageVersion,
    VersionStatus,
)
from tests.console.factories import (
    ANONYMOUS,
    EVERYONE,
    OUTSIDER,
    READERS,
    TEAMMATE_ANNOTATOR,
    WRITERS,
)
from tests.console.test_registry_factories import (
    VALID_SPEC,
    VALID_YAML,
    Registry,
    build_registry,
    jsonl,
    make_rubric,
    task_rows,
)

pytestmark = pytest.mark.django_db
API = "/api/registry"


@pytest.fixture
def registry(people: Any) -> Registry:
    return build_registry(people)


def send(client: Client, method: str, url: str, body: Any = None, **extra: Any) -> Any:
    if isinstance(body, bytes):
        return client.generic(method, url, body, content_type="application/jsonl", **extra)
    data = json.dumps(body) if body is not None else ""
    return client.generic(method, url, data, content_type="application/json", **extra)


# --- reads ----------------------------------------------------------------------------------------

OBJECT_READS: dict[str, Callable[[Registry], str]] = {
    "domain": lambda r: f"{API}/domains/{r.domain.pk}",
    "domain tasks": lambda r: f"{API}/domains/{r.domain.pk}/tasks?split=held_out",
    "rubric": lambda r: f"{API}/rubrics/{r.rubric.pk}",
    "rubric version": lambda r: f"{API}/rubrics/{r.rubric.pk}/versions/1",
    "sandbox image": lambda r: f"{API}/sandbox-images/{r.image.pk}",
    "sandbox image version": lambda r: f"{API}/sandbox-images/{r.image.pk}/versions/1",
}


@pytest.mark.parametrize("endpoint", OBJECT_READS)
def test_objects_are_readable_by_team_members_only(
    endpoint: str, api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    for who in EVERYONE:
        response = api_client_as(who).get(OBJECT_READS[endpoint](registry))
        expected = 200 if who in READERS else 404 if who == OUTSIDER else 401
        assert response.status_code == expected, f"{who}: {response.status_code}"


@pytest.mark.parametrize(
    ("endpoint", "slug"),
    [("domains", "math"), ("rubrics", "math-rubric"), ("sandbox-images", "python-bwrap")],
)
def test_lists_hold_only_the_token_teams_objects(
    endpoint: str, slug: str, api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    for who in EVERYONE:
        response = api_client_as(who).get(f"{API}/{endpoint}")
        if who == ANONYMOUS:
            assert response.status_code == 401
            continue
        assert response.status_code == 200, who
        slugs = [item["slug"] for item in response.json()["items"]]
        assert slugs == ([slug] if who in READERS else []), who


def test_task_listing_pages_and_filters(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as(TEAMMATE_ANNOTATOR)
    page = client.get(f"{API}/domains/{registry.domain.pk}/tasks?limit=10&offset=10").json()
    assert page["count"] == 30 and [t["index"] for t in page["items"]] == list(range(10, 20))
    assert page["items"][0]["ground_truth"] == "20" and page["items"][0]["metadata"] == {"n": 10}
    held = client.get(f"{API}/domains/{registry.domain.pk}/tasks?split=held_out").json()
    assert held["count"] == registry.domain.held_out_count
    assert {t["split"] for t in held["items"]} <= {"held_out"}


# --- writes to existing objects -------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    method: str
    url: Callable[[Registry], str]
    body: Any
    changed: Callable[[Registry], bool]


OBJECT_WRITES: dict[str, Write] = {
    "update domain": Write(
        "PATCH",
        lambda r: f"{API}/domains/{r.domain.pk}",
        {"title": "Renamed", "default_mix_weight": 3},
        lambda r: Domain.objects.get(pk=r.domain.pk).title == "Renamed",
    ),
    "upload tasks": Write(
        "POST",
        lambda r: f"{API}/domains/{r.domain.pk}/tasks?held_out_fraction=0&filename=new.jsonl",
        jsonl(task_rows(4)),
        lambda r: Domain.objects.get(pk=r.domain.pk).task_count == 4,
    ),
    "resplit domain": Write(
        "POST",
        lambda r: f"{API}/domains/{r.domain.pk}/split",
        {"held_out_fraction": 1, "split_seed": 3},
        lambda r: Domain.objects.get(pk=r.domain.pk).held_out_count == 30,
    ),
    "update rubric": Write(
        "PATCH",
        lambda r: f"{API}/rubrics/{r.rubric.pk}",
        {"title": "Renamed"},
        lambda r: Rubric.objects.get(pk=r.rubric.pk).title == "Renamed",
    ),
    "save rubric draft": Write(
        "POST",
        lambda r: f"{API}/rubrics/{r.rubric.pk}/draft",
        {"spec": VALID_SPEC, "source_format": "json"},
        lambda r: RubricVersion.objects.get(rubric=r.rubric, number=2).source_format == "json",
    ),
    "publish rubric version": Write(
        "POST",
        lambda r: f"{API}/rubrics/{r.rubric.pk}/versions/2/publish",
        None,
        lambda r: (
            RubricVersion.objects.get(rubric=r.rubric, number=2).status == VersionStatus.PUBLISHED
        ),
    ),
    "update sandbox image": Write(
        "PATCH",
        lambda r: f"{API}/sandbox-images/{r.image.pk}",
        {"title": "Renamed"},
        lambda r: SandboxImage.objects.get(pk=r.image.pk).title == "Renamed",
    ),
    "save sandbox image draft": Write(
        "POST",
        lambda r: f"{API}/sandbox-images/{r.image.pk}/draft",
        {"memory_mb": 4096, "network": "loopback"},
        lambda r: SandboxImageVersion.objects.get(image=r.image, number=1).memory_mb == 4096,
    ),
    "publish sandbox image version": Write(
        "POST",
        lambda r: f"{API}/sandbox-images/{r.image.pk}/versions/1/publish",
        None,
        lambda r: (
            SandboxImageVersion.objects.get(image=r.image, number=1).status
            == VersionStatus.PUBLISHED
        ),
    ),
}


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("action", OBJECT_WRITES)
def test_only_the_teams_researchers_and_admins_change_objects(
    who: str, action: str, api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    write = OBJECT_WRITES[action]
    response = send(api_client_as(who), write.method, write.url(registry), write.body)
    if who in WRITERS:
        assert response.status_code == 200, response.content
        assert write.changed(registry)
        return
    expected = {TEAMMATE_ANNOTATOR: 403, OUTSIDER: 404, ANONYMOUS: 401}[who]
    assert response.status_code == expected
    assert not write.changed(registry)


# --- creating -------------------------------------------------------------------------------------

CREATES: dict[str, tuple[dict[str, Any], type]] = {
    "domains": ({"slug": "new-one", "title": "New", "default_mix_weight": 0.5}, Domain),
    "rubrics": (
        {"slug": "new-one", "title": "New", "source": VALID_YAML, "source_format": "yaml"},
        Rubric,
    ),
    "sandbox-images": (
        {"slug": "new-one", "title": "New", "driver": "docker", "image_ref": "python:3.11-slim"},
        SandboxImage,
    ),
}


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("endpoint", CREATES)
def test_researchers_and_admins_create_in_their_tokens_team(
    who: str, endpoint: str, api_client_as: Callable[[str], Client], people: Any
) -> None:
    body, model = CREATES[endpoint]
    response = send(api_client_as(who), "POST", f"{API}/{endpoint}", body)
    expected = {TEAMMATE_ANNOTATOR: 403, ANONYMOUS: 401}.get(who, 201)
    assert response.status_code == expected, response.content
    assert model.objects.filter(team=people.team, slug="new-one").exists() == (who in WRITERS)
    assert model.objects.filter(team=people.other_team, slug="new-one").exists() == (
        who == OUTSIDER
    )
    if expected == 201:
        assert response.json()["slug"] == "new-one"


# --- bad input ------------------------------------------------------------------------------------


def test_an_invalid_spec_answers_422_with_each_issue_at_its_path(
    api_client_as: Callable[[str], Client], people: Any
) -> None:
    spec = {"version": 1, "criteria": [{"name": "a", "kind": "exact_match", "weight": "heavy"}]}
    response = send(
        api_client_as("owner"), "POST", f"{API}/rubrics", {"slug": "r", "title": "R", "spec": spec}
    )
    assert response.status_code == 422
    assert response.json()["errors"] == {"source": ["criteria[0].weight: must be a number ≥ 0"]}
    assert not Rubric.objects.exists()


def test_another_teams_rubric_cannot_be_attached(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    body = {"slug": "x", "title": "X", "rubric_id": registry.rubric.pk}
    response = send(api_client_as(OUTSIDER), "POST", f"{API}/domains", body)
    assert response.status_code == 422
    assert response.json()["errors"] == {"rubric_id": ["no rubric with this id in your team"]}


def test_duplicate_slugs_and_bad_limits_answer_422(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as("owner")
    dup = send(client, "POST", f"{API}/domains", {"slug": "math", "title": "Again"})
    assert dup.json()["errors"] == {"slug": ["this team already has a domain with the slug 'math'"]}
    bad = send(client, "POST", f"{API}/sandbox-images", {"slug": "s", "title": "S", "pids": 0})
    assert bad.status_code == 422 and bad.json()["errors"] == {
        "pids": ["must be between 4 and 1,000,000"]
    }


def test_patching_a_domain_can_clear_its_rubric_but_not_its_title(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as("owner")
    url = f"{API}/domains/{registry.domain.pk}"
    cleared = send(client, "PATCH", url, {"rubric_id": None})
    assert cleared.status_code == 200 and cleared.json()["rubric_id"] is None
    assert cleared.json()["sandbox_image_id"] == registry.image.pk  # untouched
    refused = send(client, "PATCH", url, {"title": None, "rubric_id": None})
    assert refused.status_code == 422
    assert refused.json()["errors"] == {"title": ["may not be null"]}


def test_an_upload_with_bad_rows_reports_lines_and_stores_nothing(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    body = jsonl(task_rows(2)) + b'{"prompt": 1, "ground_truth": 1}\n'
    response = send(
        api_client_as("owner"), "POST", f"{API}/domains/{registry.domain.pk}/tasks", body
    )
    assert response.status_code == 422
    report = response.json()
    assert report["stored"] is False and report["valid_rows"] == 2
    assert report["errors"] == [{"line": 3, "message": "prompt: Expected `str`, got `int`"}]
    assert report["domain"]["task_count"] == 30
    assert [row["line"] for row in report["preview"]] == [1, 2]
    assert report["preview"][1]["prompt"] == "What is 1 + 1?"


def test_an_oversized_upload_answers_413(
    api_client_as: Callable[[str], Client], registry: Registry, settings: Any
) -> None:
    settings.TASKSET_MAX_UPLOAD_BYTES = 500
    url = f"{API}/domains/{registry.domain.pk}/tasks"
    response = send(api_client_as("owner"), "POST", url, jsonl(task_rows(50)))
    assert response.status_code == 413
    assert "larger than the limit of 500 bytes" in response.json()["detail"]
    assert Domain.objects.get(pk=registry.domain.pk).task_count == 30


def test_publishing_a_published_version_answers_409_and_audits_once(
    api_client_as: Callable[[str], Client], people: Any
) -> None:
    rubric = make_rubric(team=people.team, user=people.owner, slug="p")
    client = api_client_as("teammate_admin")
    first = send(client, "POST", f"{API}/rubrics/{rubric.pk}/versions/1/publish")
    again = send(client, "POST", f"{API}/rubrics/{rubric.pk}/versions/1/publish")
    assert first.status_code == 200 and first.json()["published_by"] == "teammate_admin"
    assert again.status_code == 409 and again.json()["detail"] == "version 1 is already published"
    assert AuditEntry.objects.filter(action="rubric.publish").count() == 1


def test_a_sandbox_version_carries_the_spec_runs_start_sandboxes_with(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    from sandboxes import SandboxSpec

    body = api_client_as("owner").get(f"{API}/sandbox-images/{registry.image.pk}/versions/1").json()
    assert body["sandbox_spec"]["memory_mb"] == body["memory_mb"] == 1024
    assert SandboxSpec.from_dict(body["sandbox_spec"]).driver == "bwrap"


def test_a_missing_version_is_404(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as("owner")
    assert client.get(f"{API}/rubrics/{registry.rubric.pk}/versions/9").status_code == 404
    assert client.get(f"{API}/sandbox-images/{registry.image.pk}/versions/9").status_code == 404


def test_the_openapi_schema_documents_the_registry(client: Client, db: None) -> None:
    paths = client.get("/api/openapi.json").json()["paths"]
    assert "/api/registry/domains/{domain_id}/tasks" in paths
    assert "/api/registry/rubrics/{rubric_id}/versions/{number}/publish" in paths
    upload = paths["/api/registry/domains/{domain_id}/tasks"]["post"]
    assert "application/jsonl" in upload["requestBody"]["content"]


def test_an_api_upload_never_reads_the_body_whole(
    api_client_as: Callable[[str], Client], registry: Registry, monkeypatch: Any
) -> None:
    from django.http import HttpRequest

    def read_whole(self: HttpRequest) -> bytes:
        raise AssertionError("request.body was read whole")

    monkeypatch.setattr(HttpRequest, "body", property(read_whole))
    url = f"{API}/domains/{registry.domain.pk}/tasks"
    response = send(api_client_as("owner"), "POST", url, jsonl(task_rows(3)))
    assert response.status_code == 200, response.content
    assert response.json()["domain"]["task_count"] == 3
