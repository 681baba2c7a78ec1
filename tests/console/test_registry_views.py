"""Registry pages: the role matrix for every view (owner, teammates of each role, outsider,
anonymous), inline validation, uploads through the real upload path, escaping, search and
paging. Real PostgreSQL; objects built with the services."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from console.registry import services
from console.registry.models import (
    Domain,
    Rubric,
    RubricVersion,
    SandboxImage,
    SandboxImageVersion,
    Task,
    VersionStatus,
)
from tests.console.factories import (
    ANONYMOUS,
    EVERYONE,
    OUTSIDER,
    OWNER,
    READERS,
    TEAMMATE_ANNOTATOR,
    WRITERS,
)
from tests.console.test_registry_factories import (
    VALID_SOURCE,
    VALID_YAML,
    Registry,
    build_registry,
    jsonl,
    make_domain,
    make_rubric,
    task_rows,
)

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def registry(people: Any) -> Registry:
    return build_registry(people)


def is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/accounts/login/")


# --- the role matrix: pages that show one object ------------------------------------------------

OBJECT_PAGES: dict[str, Callable[[Registry], str]] = {
    "domain_detail": lambda r: reverse("registry:domain_detail", args=[r.domain.pk]),
    "rubric_detail": lambda r: reverse("registry:rubric_detail", args=[r.rubric.pk]),
    "rubric_version": lambda r: reverse("registry:rubric_version", args=[r.rubric.pk, 1]),
    "sandbox_image_detail": lambda r: reverse("registry:sandbox_image_detail", args=[r.image.pk]),
    "sandbox_image_version": lambda r: reverse(
        "registry:sandbox_image_version", args=[r.image.pk, 1]
    ),
}


# Read-only checks loop over the roles inside one test (nothing changes between requests), which
# builds the fixtures once per page instead of once per role.


def expect_reader_access(client_as: Callable[[str], Client], url: str, readers: frozenset) -> None:
    for who in EVERYONE:
        response = client_as(who).get(url)
        if who in readers:
            assert response.status_code == 200, f"{who}: {response.status_code}"
        elif who == OUTSIDER:
            assert response.status_code == 404, f"{who}: {response.status_code}"
        elif who == ANONYMOUS:
            assert is_login_redirect(response), f"{who}: {response.status_code}"
        else:
            assert response.status_code == 403, f"{who}: {response.status_code}"


@pytest.mark.parametrize("page", OBJECT_PAGES)
def test_object_pages_are_shown_to_team_members_only(
    page: str, client_as: Callable[[str], Client], registry: Registry
) -> None:
    expect_reader_access(client_as, OBJECT_PAGES[page](registry), READERS)


# --- the role matrix: list pages (each member sees only their own team) -------------------------

LIST_PAGES = ("home", "domain_list", "rubric_list", "sandbox_image_list")


@pytest.mark.parametrize("page", LIST_PAGES)
def test_list_pages_show_the_team_registry_to_members_and_nothing_to_others(
    page: str, client_as: Callable[[str], Client], registry: Registry
) -> None:
    marker = {
        "home": "Registry of Lab",
        "domain_list": "math",
        "rubric_list": "math-rubric",
        "sandbox_image_list": "python-bwrap",
    }[page]
    for who in EVERYONE:
        response = client_as(who).get(reverse(f"registry:{page}"))
        if who == ANONYMOUS:
            assert is_login_redirect(response)
            continue
        assert response.status_code == 200, who
        content = response.content.decode()
        assert (marker in content) == (who in READERS), who
        # Write buttons only for those who may write (the outsider, in their own team).
        assert ("New " in content) == (who in WRITERS or who == OUTSIDER), who


# --- the role matrix: changing one object -------------------------------------------------------


@dataclass(frozen=True)
class Write:
    url: Callable[[Registry], str]
    data: Callable[[Registry], dict[str, Any]]
    changed: Callable[[Registry], bool]


def _domain_form(r: Registry, **changes: Any) -> dict[str, Any]:
    return {
        "slug": "math",
        "title": "Math",
        "description": "",
        "default_mix_weight": "1.0",
        "rubric": r.rubric.pk,
        "sandbox_image": r.image.pk,
        **changes,
    }


def _limits(**changes: Any) -> dict[str, Any]:
    return {**services.SANDBOX_DEFAULTS, **changes}


def _upload_data(r: Registry) -> dict[str, Any]:
    return {
        "file": SimpleUploadedFile("new.jsonl", jsonl(task_rows(3))),
        "held_out_fraction": "0",
        "split_seed": "1",
    }


OBJECT_WRITES: dict[str, Write] = {
    "domain_edit": Write(
        url=lambda r: reverse("registry:domain_edit", args=[r.domain.pk]),
        data=lambda r: _domain_form(r, title="Renamed"),
        changed=lambda r: Domain.objects.get(pk=r.domain.pk).title == "Renamed",
    ),
    "domain_upload": Write(
        url=lambda r: reverse("registry:domain_upload", args=[r.domain.pk]),
        data=_upload_data,
        changed=lambda r: Domain.objects.get(pk=r.domain.pk).task_count == 3,
    ),
    "domain_resplit": Write(
        url=lambda r: reverse("registry:domain_resplit", args=[r.domain.pk]),
        data=lambda r: {"held_out_fraction": "1", "split_seed": "3"},
        changed=lambda r: Domain.objects.get(pk=r.domain.pk).held_out_count == 30,
    ),
    "rubric_edit": Write(
        url=lambda r: reverse("registry:rubric_edit", args=[r.rubric.pk]),
        data=lambda r: {"slug": "math-rubric", "title": "Renamed", "description": ""},
        changed=lambda r: Rubric.objects.get(pk=r.rubric.pk).title == "Renamed",
    ),
    "rubric_draft": Write(
        url=lambda r: reverse("registry:rubric_draft", args=[r.rubric.pk]),
        data=lambda r: {"source": VALID_SOURCE, "source_format": "json"},
        changed=lambda r: (
            RubricVersion.objects.get(rubric=r.rubric, number=2).source_format == "json"
        ),
    ),
    "rubric_version_publish": Write(
        url=lambda r: reverse("registry:rubric_version_publish", args=[r.rubric.pk, 2]),
        data=lambda r: {},
        changed=lambda r: (
            RubricVersion.objects.get(rubric=r.rubric, number=2).status == VersionStatus.PUBLISHED
        ),
    ),
    "sandbox_image_edit": Write(
        url=lambda r: reverse("registry:sandbox_image_edit", args=[r.image.pk]),
        data=lambda r: {"slug": "python-bwrap", "title": "Renamed", "description": ""},
        changed=lambda r: SandboxImage.objects.get(pk=r.image.pk).title == "Renamed",
    ),
    "sandbox_image_draft": Write(
        url=lambda r: reverse("registry:sandbox_image_draft", args=[r.image.pk]),
        data=lambda r: _limits(memory_mb=2048),
        changed=lambda r: (
            SandboxImageVersion.objects.get(image=r.image, number=1).memory_mb == 2048
        ),
    ),
    "sandbox_image_version_publish": Write(
        url=lambda r: reverse("registry:sandbox_image_version_publish", args=[r.image.pk, 1]),
        data=lambda r: {},
        changed=lambda r: (
            SandboxImageVersion.objects.get(image=r.image, number=1).status
            == VersionStatus.PUBLISHED
        ),
    ),
}


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("action", OBJECT_WRITES)
def test_only_researchers_and_admins_of_the_team_change_an_object(
    who: str, action: str, client_as: Callable[[str], Client], registry: Registry
) -> None:
    write = OBJECT_WRITES[action]
    response = client_as(who).post(write.url(registry), write.data(registry))
    if who in WRITERS:
        assert response.status_code == 302, response.content.decode()[:2000]
        assert write.changed(registry)
        return
    if who == TEAMMATE_ANNOTATOR:
        assert response.status_code == 403
    elif who == OUTSIDER:
        assert response.status_code == 404
    else:
        assert is_login_redirect(response)
    assert not write.changed(registry)


FORM_PAGES: dict[str, Callable[[Registry], str]] = {
    name: OBJECT_WRITES[name].url
    for name in (
        "domain_edit",
        "domain_upload",
        "rubric_edit",
        "rubric_draft",
        "sandbox_image_edit",
        "sandbox_image_draft",
    )
}


@pytest.mark.parametrize("page", FORM_PAGES)
def test_edit_forms_are_shown_to_writers_only(
    page: str, client_as: Callable[[str], Client], registry: Registry
) -> None:
    expect_reader_access(client_as, FORM_PAGES[page](registry), WRITERS)


@pytest.mark.parametrize("page", ["rubric_version_publish", "sandbox_image_version_publish"])
def test_publishing_needs_a_post(
    page: str, client_as: Callable[[str], Client], registry: Registry
) -> None:
    for who in EVERYONE:
        response = client_as(who).get(OBJECT_WRITES[page].url(registry))
        assert is_login_redirect(response) if who == ANONYMOUS else response.status_code == 405


# --- the role matrix: creating in one's own team ------------------------------------------------

CREATES: dict[str, tuple[dict[str, Any], Callable[[Any], Any]]] = {
    "domain_create": (
        {"slug": "new-one", "title": "New", "default_mix_weight": "0.5"},
        lambda team: Domain.objects.filter(team=team, slug="new-one"),
    ),
    "rubric_create": (
        {"slug": "new-one", "title": "New", "source": VALID_YAML, "source_format": "yaml"},
        lambda team: Rubric.objects.filter(team=team, slug="new-one"),
    ),
    "sandbox_image_create": (
        {"slug": "new-one", "title": "New", **_limits(driver="docker", image_ref="python:3.11")},
        lambda team: SandboxImage.objects.filter(team=team, slug="new-one"),
    ),
}


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("page", CREATES)
def test_researchers_and_admins_create_in_their_own_team(
    who: str, page: str, client_as: Callable[[str], Client], people: Any
) -> None:
    data, found = CREATES[page]
    client = client_as(who)
    form_page = client.get(reverse(f"registry:{page}"))
    response = client.post(reverse(f"registry:{page}"), data)
    if who == ANONYMOUS:
        assert is_login_redirect(form_page) and is_login_redirect(response)
    elif who == TEAMMATE_ANNOTATOR:
        assert form_page.status_code == 403 and response.status_code == 403
    else:
        assert form_page.status_code == 200
        assert response.status_code == 302, response.content.decode()[:2000]
    created_in_team = found(people.team).exists()
    created_elsewhere = found(people.other_team).exists()
    assert created_in_team == (who in WRITERS)
    assert created_elsewhere == (who == OUTSIDER)


def test_an_outsider_cannot_attach_another_teams_rubric(
    outsider_client: Client, registry: Registry, people: Any
) -> None:
    data = {"slug": "sneaky", "title": "S", "default_mix_weight": "1", "rubric": registry.rubric.pk}
    response = outsider_client.post(reverse("registry:domain_create"), data)
    assert response.status_code == 422
    assert "Select a valid choice" in response.content.decode()
    assert not Domain.objects.filter(slug="sneaky").exists()


# --- forms: inline validation and clear errors --------------------------------------------------


def test_inline_validation_returns_the_form_with_errors_and_saves_nothing(
    owner_client: Client, registry: Registry
) -> None:
    data = {"slug": "Bad Slug!", "title": "", "default_mix_weight": "-1", "_validate": "1"}
    response = owner_client.post(reverse("registry:domain_create"), data, **HTMX)
    content = response.content.decode()
    assert response.status_code == 200
    # Only the error lists, each swapped in by id: the inputs being typed in are not replaced.
    assert "<form" not in content and "<input" not in content
    assert '<ul class="errorlist" id="errors-slug" hx-swap-oob="true"><li>Enter a valid' in content
    assert "Enter a valid “slug”" in content
    assert "This field is required." in content
    assert "Ensure this value is greater than or equal to 0." in content
    # A valid form under validation is still not saved.
    valid = {"slug": "fine", "title": "Fine", "default_mix_weight": "1", "_validate": "1"}
    owner_client.post(reverse("registry:domain_create"), valid, **HTMX)
    assert not Domain.objects.filter(slug="fine").exists()


def test_a_duplicate_slug_is_shown_at_the_slug_field(
    owner_client: Client, registry: Registry
) -> None:
    data = {"slug": "math", "title": "Again", "default_mix_weight": "1"}
    response = owner_client.post(reverse("registry:domain_create"), data)
    assert response.status_code == 422
    assert "this team already has a domain with the slug &#x27;math&#x27;" in (
        response.content.decode()
    )
    assert Domain.objects.filter(slug="math").count() == 1


def test_the_rubric_editor_shows_each_issue_at_its_path_as_you_type(
    owner_client: Client, registry: Registry
) -> None:
    source = json.dumps(
        {
            "version": 1,
            "criteria": [
                {"name": "a", "kind": "exact_match"},
                {"name": "b", "kind": "exact_match"},
                {"name": "c", "kind": "exact_match", "weight": -2},
            ],
        }
    )
    url = reverse("registry:rubric_draft", args=[registry.rubric.pk])
    data = {"source": source, "source_format": "json", "_validate": "1"}
    response = owner_client.post(url, data, **HTMX)
    content = response.content.decode()
    assert response.status_code == 200 and 'id="spec-issues"' in content
    assert '<code class="path">criteria[2].weight</code>: must be a number ≥ 0' in content
    good = owner_client.post(url, {**data, "source": VALID_SOURCE}, **HTMX)
    assert "The spec is valid." in good.content.decode()
    draft = RubricVersion.objects.get(rubric=registry.rubric, number=2)
    assert draft.source == VALID_YAML  # validating saved nothing


def test_saving_an_invalid_spec_keeps_the_text_and_saves_nothing(
    owner_client: Client, registry: Registry
) -> None:
    url = reverse("registry:rubric_draft", args=[registry.rubric.pk])
    response = owner_client.post(
        url, {"source": "version: 1\ncriteria: [", "source_format": "yaml"}
    )
    assert response.status_code == 422
    content = response.content.decode()
    assert "YAML syntax:" in content and "criteria: [" in content
    assert RubricVersion.objects.get(rubric=registry.rubric, number=2).source == VALID_YAML


def test_the_editor_explains_that_editing_a_published_version_starts_a_new_draft(
    owner_client: Client, people: Any
) -> None:
    rubric = make_rubric(team=people.team, user=people.owner, slug="only-published")
    services.rubric_version_publish(actor=people.owner, version=rubric.versions.get())
    url = reverse("registry:rubric_draft", args=[rubric.pk])
    assert "saving creates a new draft version" in owner_client.get(url).content.decode()
    response = owner_client.post(url, {"source": VALID_YAML, "source_format": "yaml"})
    assert response["Location"] == reverse("registry:rubric_version", args=[rubric.pk, 2])
    assert rubric.versions.get(number=1).source == VALID_SOURCE


def test_publishing_twice_says_it_is_already_published(
    owner_client: Client, registry: Registry
) -> None:
    url = reverse("registry:rubric_version_publish", args=[registry.rubric.pk, 1])
    response = owner_client.post(url, follow=True)
    assert "Not published: version 1 is already published." in response.content.decode()


def test_bad_sandbox_limits_are_shown_at_their_fields(
    owner_client: Client, registry: Registry
) -> None:
    data = {"slug": "x", "title": "X", **_limits(memory_mb="0", driver="podman", image_ref="")}
    response = owner_client.post(reverse("registry:sandbox_image_create"), data)
    content = response.content.decode()
    assert response.status_code == 422
    assert "Ensure this value is greater than or equal to 16." in content
    assert not SandboxImage.objects.filter(slug="x").exists()
    data = {"slug": "x", "title": "X", **_limits(driver="podman", image_ref="")}
    content = owner_client.post(reverse("registry:sandbox_image_create"), data).content.decode()
    assert "podman needs an image reference such as python:3.11-slim" in content


# --- uploads through the page -------------------------------------------------------------------


def upload(client: Client, domain: Domain, data: bytes, **fields: Any) -> Any:
    url = reverse("registry:domain_upload", args=[domain.pk])
    form = {"held_out_fraction": "0.1", "split_seed": "0", **fields}
    return client.post(url, {"file": SimpleUploadedFile("tasks.jsonl", data), **form})


def test_an_upload_with_bad_rows_lists_them_by_line_and_stores_nothing(
    owner_client: Client, registry: Registry
) -> None:
    data = jsonl(task_rows(3)) + b'{"prompt": "x"}\n' + b"{oops\n" + "é\n".encode("latin-1")
    response = upload(owner_client, registry.domain, data)
    content = response.content.decode()
    assert response.status_code == 422
    assert "Nothing was stored" in content
    assert "3 of 6 rows are invalid; 3 are valid." in content
    assert "<td>4</td><td>missing required field &#x27;ground_truth&#x27;</td>" in content
    assert "<td>5</td><td>broken JSON:" in content
    assert "<td>6</td><td>not valid UTF-8 (byte 0xe9 at position 1)" in content
    # What the file holds is previewed even though nothing was stored.
    assert "The first valid rows, as read" in content and "What is 2 + 2?" in content
    assert Task.objects.filter(domain=registry.domain).count() == 30


def test_keeping_the_valid_rows_through_the_page(owner_client: Client, registry: Registry) -> None:
    data = jsonl(task_rows(3)) + b"{oops\n"
    response = upload(owner_client, registry.domain, data, keep_valid_rows="on")
    assert response.status_code == 302
    page = owner_client.get(response["Location"]).content.decode()
    assert (
        "Stored 3 tasks as task set v2 (0 held out); 1 invalid row skipped; "
        "v1, which it replaces, stays available." in page
    )


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(
    owner_client: Client, registry: Registry, settings: Any
) -> None:
    # Stands in for a 2 GB file: the limit is a setting, so the test need not write 2 GB.
    settings.TASKSET_MAX_UPLOAD_BYTES = 1000
    big = jsonl(task_rows(2000))  # ~120 kB: refused from its Content-Length
    response = upload(owner_client, registry.domain, big)
    assert response.status_code == 413
    assert "larger than the limit of 1,000 bytes" in response.content.decode()
    assert Task.objects.filter(domain=registry.domain).count() == 30


def test_the_size_guard_also_stops_a_body_whose_length_was_not_announced(
    owner_client: Client, registry: Registry, settings: Any
) -> None:
    # 20 kB is under the Content-Length slack, so only the streaming guard can catch it.
    settings.TASKSET_MAX_UPLOAD_BYTES = 1000
    response = upload(owner_client, registry.domain, jsonl(task_rows(300)))
    assert response.status_code == 413
    assert Task.objects.filter(domain=registry.domain).count() == 30


def test_a_line_over_the_line_limit_is_reported(
    owner_client: Client, registry: Registry, settings: Any
) -> None:
    settings.TASKSET_MAX_LINE_BYTES = 200
    data = jsonl(task_rows(1)) + jsonl([{"prompt": "x" * 1000, "ground_truth": 1}])
    response = upload(owner_client, registry.domain, data)
    assert "<td>2</td><td>line is longer than the limit of 200 bytes</td>" in (
        response.content.decode()
    )


def test_an_upload_without_csrf_token_is_refused(registry: Registry, people: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(people.owner)
    response = upload(client, registry.domain, jsonl(task_rows(3)))
    assert response.status_code == 403
    assert Domain.objects.get(pk=registry.domain.pk).task_count == 30


def test_a_script_in_a_task_prompt_is_shown_as_text(
    owner_client: Client, registry: Registry
) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    data = jsonl([{"prompt": evil, "ground_truth": evil, "metadata": {"note": evil}}])
    upload(owner_client, registry.domain, data)
    content = owner_client.get(
        reverse("registry:domain_detail", args=[registry.domain.pk])
    ).content.decode()
    assert "<script>alert" not in content and "<img src=x" not in content
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in content


# --- search and paging --------------------------------------------------------------------------


def test_search_filters_and_htmx_gets_only_the_results(owner_client: Client, people: Any) -> None:
    for n in range(30):
        make_domain(team=people.team, user=people.owner, slug=f"d{n:02}", title=f"Domain {n}")
    make_domain(team=people.team, user=people.owner, slug="chess", title="Chess puzzles")
    url = reverse("registry:domain_list")
    first = owner_client.get(url).content.decode()
    assert "Page 1 of 2 · 31 in all" in first and "d24" not in first
    second = owner_client.get(url, {"page": 2}).content.decode()
    assert "d29" in second and "d00" not in second
    found = owner_client.get(url, {"q": "puzzles"}, **HTMX).content.decode()
    assert found.lstrip().startswith('<div id="results">')
    assert "chess" in found and "d00" not in found


def test_task_pages_filter_by_split(owner_client: Client, registry: Registry) -> None:
    url = reverse("registry:domain_detail", args=[registry.domain.pk])
    held = owner_client.get(url, {"split": "held_out"}, **HTMX).content.decode()
    expected = Task.objects.filter(domain=registry.domain, split="held_out").count()
    assert held.count('<span class="badge">Held out</span>') == min(expected, 20)
    assert '<span class="badge">Train</span>' not in held


def test_an_annotator_sees_no_edit_controls(
    teammate_annotator_client: Client, registry: Registry
) -> None:
    content = teammate_annotator_client.get(
        reverse("registry:rubric_version", args=[registry.rubric.pk, 2])
    ).content.decode()
    assert "Publish v2" not in content and "Edit draft" not in content
    detail = teammate_annotator_client.get(
        reverse("registry:domain_detail", args=[registry.domain.pk])
    ).content.decode()
    assert "Upload a task set" not in detail


def test_owner_sees_publish_on_a_draft(
    registry: Registry, client_as: Callable[[str], Client]
) -> None:
    content = (
        client_as(OWNER)
        .get(reverse("registry:rubric_version", args=[registry.rubric.pk, 2]))
        .content.decode()
    )
    assert "Publish v2" in content


# --- trying a rubric on a sample ----------------------------------------------------------------


def test_a_rubric_version_scores_a_sample_for_researchers_only(
    client_as: Callable[[str], Client], registry: Registry
) -> None:
    url = reverse("registry:rubric_version_try", args=[registry.rubric.pk, 1])
    sample = {"prompt": "2+2?", "completion": "It is \\boxed{4}", "ground_truth": "4"}
    for who in EVERYONE:
        response = client_as(who).post(url, sample, **HTMX)
        if who in WRITERS:
            content = response.content.decode()
            assert response.status_code == 200, who
            assert '<strong id="try-total">1.1</strong>' in content, who
            assert "<td>correct</td><td>1.0</td>" in content
        elif who == TEAMMATE_ANNOTATOR:
            assert response.status_code == 403
        elif who == OUTSIDER:
            assert response.status_code == 404
        else:
            assert is_login_redirect(response)
    wrong = client_as(OWNER).post(url, {**sample, "completion": "\\boxed{5}"}, **HTMX)
    assert '<strong id="try-total">0.1</strong>' in wrong.content.decode()
    # Without htmx the whole page comes back, with the result in it.
    page = client_as(OWNER).post(url, sample).content.decode()
    assert "<html" in page and '<strong id="try-total">1.1</strong>' in page


def test_a_version_page_shows_what_changed_since_the_previous_version(
    owner_client: Client, registry: Registry
) -> None:
    url = reverse("registry:rubric_version", args=[registry.rubric.pk, 2])
    content = owner_client.get(url).content.decode()
    assert '<pre class="diff" id="version-diff">' in content
    assert '<span class="remove">-  &quot;version&quot;: 1,</span>' in content
    assert '<span class="add">+version: 1</span>' in content
    first = owner_client.get(reverse("registry:rubric_version", args=[registry.rubric.pk, 1]))
    assert "Changes from the previous version" not in first.content.decode()


def test_the_django_admin_shows_the_registry_to_staff(registry: Registry) -> None:
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_superuser("staff", "staff@example.test", "x" * 12)
    client = Client()
    client.force_login(staff)
    for name in ("domain", "rubric", "sandboximage", "rubricversion", "task"):
        assert client.get(reverse(f"admin:registry_{name}_changelist")).status_code == 200, name
    page = client.get(reverse("admin:registry_rubric_change", args=[registry.rubric.pk]))
    assert page.status_code == 200 and "math-rubric v2" in page.content.decode()
    # Versions cannot be added or edited there: drafts change only through validated paths.
    assert client.get(reverse("admin:registry_rubricversion_add")).status_code == 403


# --- the spec editors: one way of checking, never a stale "valid" -------------------------------


def test_a_spec_whose_format_is_refused_is_not_called_valid(
    owner_client: Client, registry: Registry
) -> None:
    url = reverse("registry:rubric_draft", args=[registry.rubric.pk])
    data = {"source": VALID_SOURCE, "source_format": "toml", "_validate": "1"}
    content = owner_client.post(url, data, **HTMX).content.decode()
    assert "The spec is valid." not in content
    assert "Not checked yet" in content


@pytest.mark.parametrize("page", ["rubric_create", "rubric_draft"])
def test_both_spec_editors_check_while_typing_and_mark_the_result_stale(
    page: str, owner_client: Client, registry: Registry
) -> None:
    args = [] if page == "rubric_create" else [registry.rubric.pk]
    content = owner_client.get(reverse(f"registry:{page}", args=args)).content.decode()
    assert 'hx-trigger="input changed delay:400ms"' in content
    assert 'hx-sync="closest form:replace"' in content  # the newest check wins
    assert "data-check-status" in content and "forms.js" in content


def test_checking_the_draft_answers_like_every_other_form(
    owner_client: Client, registry: Registry
) -> None:
    url = reverse("registry:rubric_draft", args=[registry.rubric.pk])
    data = {"source": "{", "source_format": "json", "_validate": "1"}
    content = owner_client.post(url, data, **HTMX).content.decode()
    # Only the error lists, swapped in by id: nothing the user is typing is replaced.
    assert (
        '<div id="spec-issues" aria-live="polite" data-check-status hx-swap-oob="true">' in content
    )
    assert "<textarea" not in content
