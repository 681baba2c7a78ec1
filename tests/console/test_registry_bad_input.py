"""Hostile input to the registry, class by class (issue #10, "Bad input and abuse"): each answer
is a clear 4xx that names the problem, nothing is saved, and no request raises a server error.

Classes: documents nested ~1000 deep (task lines, rubric sources, spec objects); YAML values
that are not JSON (dates, !!binary, !!set); 5,000-digit integers; NUL characters in search
terms, titles, descriptions, file names and JSON strings; integers of 2^63 and more in limit,
offset, split_seed and ids; negative split seeds; list pages past the size cap.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from console.audit.models import AuditEntry
from console.registry import services, tasksets
from console.registry.models import Domain, Rubric, RubricVersion, SandboxImage, Task, TaskSplit
from tests.console.factories import OWNER
from tests.console.test_registry_factories import (
    VALID_SPEC,
    Registry,
    build_registry,
    jsonl,
    make_domain,
    task_rows,
)

pytestmark = pytest.mark.django_db
API = "/api/registry"

DEEP = 1000
DEEP_JSON_LIST = "[" * DEEP + "]" * DEEP
HUGE_INT_TEXT = "9" * 5000
TOO_BIG_FOR_BIGINT = 2**63


@pytest.fixture
def registry(people: Any) -> Registry:
    return build_registry(people)


@pytest.fixture
def api(api_client_as: Callable[[str], Client]) -> Client:
    return api_client_as(OWNER)


def stored_state() -> tuple[int, ...]:
    """Row counts that any accidental write would change."""
    return (
        AuditEntry.objects.count(),
        Domain.objects.count(),
        Rubric.objects.count(),
        RubricVersion.objects.count(),
        SandboxImage.objects.count(),
        Task.objects.count(),
    )


def post_json(client: Client, url: str, body: Any, method: str = "POST") -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    return client.generic(method, url, data, content_type="application/json")


def errors_text(response: Any) -> str:
    return json.dumps(response.json())


def spec_with_params(params: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "criteria": [{"name": "correct", "kind": "exact_match", "weight": 1, "params": params}],
    }


# --- rubric sources -----------------------------------------------------------------------------

BAD_SOURCES = {
    "json nested 1000 deep": ("json", '{"version": 1, "criteria": ' + DEEP_JSON_LIST + "}", "deep"),
    "yaml nested 1000 deep": ("yaml", "version: 1\ncriteria: " + DEEP_JSON_LIST, "deep"),
    "params nested 1000 deep": (
        "json",
        json.dumps(spec_with_params({"a": 1}))
        .replace('{"a": 1}', '{"a": ' * DEEP + "1" + "}" * DEEP)
        .strip(),
        "deep",
    ),
    "params nested 100 deep (parses, still refused)": (
        "json",
        json.dumps(spec_with_params(json.loads('{"a": ' * 100 + "1" + "}" * 100))),
        "deep",
    ),
    "yaml date": ("yaml", "version: 1\ndescription: 2024-01-01\ncriteria: []", "date"),
    "yaml binary": ("yaml", "version: 1\ndescription: !!binary aGVsbG8=\ncriteria: []", "binary"),
    "yaml set": ("yaml", "version: 1\ndescription: !!set {a, b}\ncriteria: []", "set"),
    "yaml non-text key": ("yaml", "version: 1\ncriteria: []\n1: one", "key"),
    "json 5000-digit integer": ("json", f'{{"version": {HUGE_INT_TEXT}}}', "digits"),
    "yaml 5000-digit integer": ("yaml", "version: " + HUGE_INT_TEXT + "\ncriteria: []", "digits"),
    "integer past 64 bits": ("json", '{"version": 1, "weight": 18446744073709551616}', "64 bits"),
    "json NUL escape": ("json", '{"version": 1, "description": "a\\u0000b"}', "NUL"),
}


@pytest.mark.parametrize("case", BAD_SOURCES)
def test_bad_rubric_sources_are_refused_through_the_api_with_nothing_saved(
    case: str, api: Client, registry: Registry
) -> None:
    source_format, source, expected = BAD_SOURCES[case]
    before = stored_state()
    created = post_json(
        api,
        f"{API}/rubrics",
        {"slug": "hostile", "title": "Hostile", "source_format": source_format, "source": source},
    )
    drafted = post_json(
        api,
        f"{API}/rubrics/{registry.rubric.pk}/draft",
        {"source_format": source_format, "source": source},
    )
    for response in (created, drafted):
        assert response.status_code == 422, response.content[:300]
        assert expected.lower() in errors_text(response).lower()
    assert stored_state() == before


@pytest.mark.parametrize("case", ["yaml date", "json nested 1000 deep", "json NUL escape"])
def test_bad_rubric_sources_are_refused_by_the_editor_page(
    case: str, owner_client: Client, registry: Registry
) -> None:
    source_format, source, expected = BAD_SOURCES[case]
    before = stored_state()
    response = owner_client.post(
        f"/rubrics/{registry.rubric.pk}/draft/",
        {"source_format": source_format, "source": source},
    )
    assert response.status_code == 422
    assert expected.lower() in response.content.decode().lower()
    assert stored_state() == before


def test_a_spec_object_nested_deeper_than_the_limit_is_refused(
    api: Client, registry: Registry
) -> None:
    before = stored_state()
    nested: Any = 1
    for _ in range(200):
        nested = {"a": nested}
    response = post_json(
        api, f"{API}/rubrics/{registry.rubric.pk}/draft", {"spec": spec_with_params(nested)}
    )
    assert response.status_code == 422
    assert "deep" in errors_text(response)
    assert stored_state() == before


def test_a_request_body_nested_1000_deep_is_a_client_error(api: Client, registry: Registry) -> None:
    before = stored_state()
    body = '{"spec": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}"
    response = post_json(api, f"{API}/rubrics/{registry.rubric.pk}/draft", body)
    assert response.status_code in (400, 422)
    assert stored_state() == before


# --- task lines ---------------------------------------------------------------------------------

BAD_TASK_LINES = {
    "nested 1000 deep": b'{"prompt": "p", "ground_truth": ' + DEEP_JSON_LIST.encode() + b"}",
    "nested 100 deep": b'{"prompt": "p", "ground_truth": ' + b"[" * 100 + b"]" * 100 + b"}",
    "5000-digit integer": b'{"prompt": "p", "ground_truth": ' + HUGE_INT_TEXT.encode() + b"}",
    "NUL in a string": b'{"prompt": "p\\u0000", "ground_truth": 1}',
}


@pytest.mark.parametrize("case", BAD_TASK_LINES)
def test_bad_task_lines_are_row_errors_and_nothing_is_stored(
    case: str, api: Client, registry: Registry
) -> None:
    before = stored_state()
    body = jsonl(task_rows(2)) + BAD_TASK_LINES[case] + b"\n"
    response = api.generic(
        "POST",
        f"{API}/domains/{registry.domain.pk}/tasks",
        body,
        content_type="application/jsonl",
    )
    assert response.status_code == 422
    report = response.json()
    assert report["stored"] is False
    assert [error["line"] for error in report["errors"]] == [3]
    assert stored_state() == before


def test_a_task_line_just_inside_the_depth_limit_is_stored(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    nested: Any = "leaf"
    for _ in range(60):
        nested = [nested]
    result = services.domain_upload_tasks(
        actor=people.owner,
        domain=domain,
        stream=io.BytesIO(jsonl([{"prompt": "p", "ground_truth": nested}])),
        filename="t.jsonl",
        held_out_fraction=0,
        split_seed=0,
    )
    assert result.stored, result.errors
    assert Task.objects.get(domain=domain).ground_truth == nested


# --- NUL characters -----------------------------------------------------------------------------


def test_nul_in_api_search_terms_is_a_422(api: Client, registry: Registry) -> None:
    for listing in ("domains", "rubrics", "sandbox-images"):
        response = api.get(f"{API}/{listing}", {"q": "a\x00b"})
        assert response.status_code == 422, listing
        assert "q" in response.json()["errors"]


@pytest.mark.parametrize("listing", ["/domains/", "/rubrics/", "/sandbox-images/"])
def test_nul_in_page_search_terms_is_a_400(
    listing: str, owner_client: Client, registry: Registry
) -> None:
    response = owner_client.get(listing, {"q": "a\x00b"})
    assert response.status_code == 400


NUL_WRITES: dict[str, Callable[[Registry], tuple[str, str, dict[str, Any]]]] = {
    "domain title": lambda r: ("POST", f"{API}/domains", {"slug": "d", "title": "a\x00"}),
    "domain description": lambda r: (
        "POST",
        f"{API}/domains",
        {"slug": "d", "title": "D", "description": "a\x00"},
    ),
    "domain patch": lambda r: ("PATCH", f"{API}/domains/{r.domain.pk}", {"title": "a\x00"}),
    "rubric title": lambda r: (
        "POST",
        f"{API}/rubrics",
        {"slug": "r", "title": "a\x00", "spec": VALID_SPEC},
    ),
    "rubric description": lambda r: (
        "PATCH",
        f"{API}/rubrics/{r.rubric.pk}",
        {"description": "a\x00"},
    ),
    "rubric source": lambda r: (
        "POST",
        f"{API}/rubrics/{r.rubric.pk}/draft",
        {"source": "version: 1\x00"},
    ),
    "image title": lambda r: ("POST", f"{API}/sandbox-images", {"slug": "i", "title": "a\x00"}),
    "image description": lambda r: (
        "PATCH",
        f"{API}/sandbox-images/{r.image.pk}",
        {"description": "a\x00"},
    ),
}


@pytest.mark.parametrize("case", NUL_WRITES)
def test_nul_in_text_fields_is_a_422_with_nothing_saved(
    case: str, api: Client, registry: Registry
) -> None:
    method, url, body = NUL_WRITES[case](registry)
    before = stored_state()
    response = post_json(api, url, body, method=method)
    assert response.status_code == 422, response.content[:300]
    assert "NUL" in errors_text(response)
    assert stored_state() == before


def test_nul_in_the_upload_file_name_is_a_422(api: Client, registry: Registry) -> None:
    before = stored_state()
    response = api.generic(
        "POST",
        f"{API}/domains/{registry.domain.pk}/tasks?filename=a%00.jsonl",
        jsonl(task_rows(2)),
        content_type="application/jsonl",
    )
    assert response.status_code == 422
    assert "NUL" in errors_text(response)
    assert stored_state() == before


# --- integers out of range ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["limit", "offset"])
@pytest.mark.parametrize("value", [TOO_BIG_FOR_BIGINT, 2**64, -1, HUGE_INT_TEXT])
def test_paging_values_out_of_range_are_a_422(
    name: str, value: Any, api: Client, registry: Registry
) -> None:
    url = f"{API}/domains/{registry.domain.pk}/tasks"
    response = api.get(url, {name: str(value)})
    assert response.status_code == 422, response.content[:300]
    assert name in response.json()["errors"]


def test_split_seeds_out_of_range_are_a_422_with_nothing_saved(
    api: Client, registry: Registry
) -> None:
    before = stored_state()
    for seed in (TOO_BIG_FOR_BIGINT, -(2**63) - 1):
        resplit = post_json(
            api,
            f"{API}/domains/{registry.domain.pk}/split",
            {"held_out_fraction": 0.5, "split_seed": seed},
        )
        assert resplit.status_code == 422
        assert "split_seed" in resplit.json()["errors"]
        upload = api.generic(
            "POST",
            f"{API}/domains/{registry.domain.pk}/tasks?split_seed={seed}",
            jsonl(task_rows(2)),
            content_type="application/jsonl",
        )
        assert upload.status_code == 422
    assert stored_state() == before


def test_the_services_refuse_split_seeds_outside_bigint(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    with pytest.raises(services.ValidationError):
        services.domain_resplit(
            actor=people.owner, domain=domain, held_out_fraction=0.5, split_seed=2**63
        )
    with pytest.raises(services.ValidationError):
        services.domain_upload_tasks(
            actor=people.owner,
            domain=domain,
            stream=io.BytesIO(jsonl(task_rows(1))),
            filename="t.jsonl",
            held_out_fraction=0.5,
            split_seed=-(2**63) - 1,
        )


def test_huge_ids_in_the_path_are_a_404(
    api: Client, owner_client: Client, registry: Registry
) -> None:
    assert api.get(f"{API}/domains/{2**64}").status_code == 404
    assert api.get(f"{API}/rubrics/{registry.rubric.pk}/versions/{2**63}").status_code == 404
    assert owner_client.get(f"/domains/{2**64}/").status_code == 404


# --- negative split seeds -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, -12345, -(2**63)])
def test_a_negative_split_seed_re_splits_exactly_as_an_upload_with_that_seed_would(
    seed: int, people: Any
) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    services.domain_upload_tasks(
        actor=people.owner,
        domain=domain,
        stream=io.BytesIO(jsonl(task_rows(200))),
        filename="t.jsonl",
        held_out_fraction=0.3,
        split_seed=0,
    )
    resplit = services.domain_resplit(
        actor=people.owner, domain=domain, held_out_fraction=0.3, split_seed=seed
    )
    held = set(
        Task.objects.filter(domain=domain, split=TaskSplit.HELD_OUT).values_list("index", flat=True)
    )
    assert held == {i for i in range(200) if tasksets.held_out(seed, i, 0.3)}
    assert resplit.split_seed == seed
    assert resplit.held_out_count == len(held) > 0


def test_a_negative_split_seed_works_through_the_api_and_the_page(
    api: Client, owner_client: Client, registry: Registry
) -> None:
    url = f"{API}/domains/{registry.domain.pk}/split"
    response = post_json(api, url, {"held_out_fraction": 0.5, "split_seed": -7})
    assert response.status_code == 200, response.content[:300]
    assert response.json()["split_seed"] == -7
    page = owner_client.post(
        f"/domains/{registry.domain.pk}/split/", {"held_out_fraction": 0.5, "split_seed": -8}
    )
    assert page.status_code == 302
    registry.domain.refresh_from_db()
    assert registry.domain.split_seed == -8


# --- page size ----------------------------------------------------------------------------------


def test_list_pages_are_capped(api: Client, registry: Registry, settings: Any) -> None:
    from console.api import API_MAX_PAGE_SIZE

    url = f"{API}/domains/{registry.domain.pk}/tasks"
    too_many = api.get(url, {"limit": API_MAX_PAGE_SIZE + 1})
    assert too_many.status_code == 422
    assert "limit" in too_many.json()["errors"]
    page = api.get(url, {"limit": API_MAX_PAGE_SIZE})
    assert page.status_code == 200
    assert page.json()["count"] == 30
    default = api.get(url).json()
    assert len(default["items"]) <= API_MAX_PAGE_SIZE
