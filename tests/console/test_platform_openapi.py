"""The OpenAPI document at /api/openapi.json tells the truth: every operation, asked as each
kind of caller and with bad input, answers with a status the document declares and a body that
matches the declared schema, and never with a server error.

It walks every operation in the document rather than a list kept here, so a new endpoint is
covered at once, with hand-picked hostile input for each kind of caller; the generated input is
test_platform_schemathesis.py's (schemathesis, as the team's owner).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from django.test import Client

from tests.console.factories import ANONYMOUS, OUTSIDER, OWNER, TEAMMATE_ANNOTATOR, attempt_create
from tests.console.test_registry_factories import Registry, build_registry

pytestmark = pytest.mark.django_db

WRITE_METHODS = ("post", "patch", "put", "delete")


@pytest.fixture
def registry(people: Any, tmp_path: Any) -> Registry:
    """The registry's objects, plus a run of the team with an attempt and a checkpoint (the
    runs endpoints' ids)."""
    from console.runs import services
    from console.runs.models import Checkpoint, Host, Run

    registry = build_registry(people)
    (tmp_path / "config.json").write_text("{}")
    version = services.model_register(
        actor=people.owner, team=people.team, slug="base", title="Base", path=str(tmp_path)
    )
    run = Run.objects.create(
        team=people.team, created_by=people.owner, name="r", request={}, spec={},
        pins={"domains": []}, model_version=version, state="running",
    )  # fmt: skip
    attempt = attempt_create(run, Host.objects.create(name="h"), state="running")
    checkpoint = Checkpoint.objects.create(
        run=run, attempt=attempt, step=1, path=str(tmp_path), reason="periodic"
    )
    registry.ids = {  # type: ignore[attr-defined]
        "run_id": run.pk,
        "checkpoint_id": checkpoint.pk,
        # The scheduler's fleet-wide objects: a host (by name), an action, a preemption request.
        "name": "h",
        "action": "cordon",
        "pk": 1,
    }
    return registry


@pytest.fixture
def document(client: Client) -> dict[str, Any]:
    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (path, method)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", *WRITE_METHODS)
    ]


def concrete(path: str, registry: Registry) -> str:
    ids = {
        "domain_id": registry.domain.pk,
        "rubric_id": registry.rubric.pk,
        "image_id": registry.image.pk,
        "number": 1,
        "step": 1,
        **getattr(registry, "ids", {}),
    }
    return re.sub(r"\{(\w+)\}", lambda match: str(ids[match.group(1)]), path)


def call(client: Client, method: str, url: str, body: Any = None) -> Any:
    if method == "get":
        return client.get(url)
    return client.generic(
        method.upper(), url, json.dumps(body or {}), content_type="application/json"
    )


def assert_declared(document: dict[str, Any], path: str, method: str, response: Any) -> None:
    """The response's status is declared for the operation and its body fits the schema."""
    operation = document["paths"][path][method]
    status = str(response.status_code)
    where = f"{method.upper()} {path} answered {status}"
    assert response.status_code < 500, f"{where}: {response.content[:500]!r}"
    assert status in operation["responses"], f"{where}, which the document does not declare"
    content = operation["responses"][status].get("content", {})
    if "application/json" not in content:
        return
    # Refs in the operation point at #/components/...: validate with the components at the root.
    schema = {**content["application/json"]["schema"], "components": document["components"]}
    try:
        jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as mismatch:
        message = f"{where} with a body the schema refuses: {mismatch.message}"
        raise AssertionError(message) from None


def test_the_document_declares_the_error_answers_of_every_operation(
    document: dict[str, Any],
) -> None:
    for path, method in operations(document):
        declared = document["paths"][path][method]["responses"]
        for status in ("401", "403", "404", "422"):
            assert status in declared, f"{method.upper()} {path} does not declare {status}"
            schema = declared[status]["content"]["application/json"]["schema"]
            assert "ErrorOut" in json.dumps(schema), f"{method.upper()} {path} {status}"


def test_anonymous_callers_get_a_declared_401_everywhere(
    document: dict[str, Any], api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as(ANONYMOUS)
    for path, method in operations(document):
        response = call(client, method, concrete(path, registry))
        assert response.status_code == 401, f"{method.upper()} {path}"
        assert_declared(document, path, method, response)


def test_outsiders_get_a_declared_404_for_every_object(
    document: dict[str, Any], api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as(OUTSIDER)
    for path, method in operations(document):
        if "{" not in path or path.startswith("/api/scheduling/"):
            # The scheduler's objects (hosts, classes, preemption requests) belong to no team:
            # a non-admin gets 403 there (tests/console/test_scheduling_api.py).
            continue
        response = call(client, method, concrete(path, registry))
        # An empty body may fail the schema first (422, the same for any id: no leak).
        expected = (404,) if method == "get" else (404, 422)
        assert response.status_code in expected, f"{method.upper()} {path}"
        assert_declared(document, path, method, response)


def test_annotators_get_a_declared_403_for_every_write(
    document: dict[str, Any], api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as(TEAMMATE_ANNOTATOR)
    for path, method in operations(document):
        if method == "get":
            continue
        response = call(client, method, concrete(path, registry))
        # Schema validation of the body may answer first (422); both must be declared.
        assert response.status_code in (403, 422), f"{method.upper()} {path}"
        assert_declared(document, path, method, response)


BAD_BODIES: list[Any] = [
    {},
    {"slug": 5, "title": None, "split_seed": 2**63, "held_out_fraction": "x"},
    {"source": "\x00", "spec": {"a": [[[[]]]]}, "cpu": -1, "driver": "lxc"},
    [1, 2, 3],
]
# Raw JSON text: numbers Python would not write (1e400 reads as infinity), NaN, huge ids.
RAW_BAD_BODIES = [
    '{"slug": "s", "title": "t", "default_mix_weight": 1e400, "held_out_fraction": NaN}',
    '{"slug": "s", "title": "t", "rubric_id": 18446744073709551616, "sandbox_image_id": -1}',
    '{"slug": "s", "title": "t", "memory_mb": 99999999999999999999999, "cpu": 1e400}',
    '{"held_out_fraction": 0.5, "split_seed": -9223372036854775809}',
    '{"source_format": "yaml", "source": "a: !!python/object:os.system {}"}',
    '{"spec": {"version": 1, "criteria": [{"name": "x", "kind": "python_function", '
    '"params": {"function": "os:system"}}]}}',
]
BAD_QUERIES = ["?limit=0", "?limit=9223372036854775808", "?offset=-1", "?q=%00", "?split=none"]


def test_owners_sending_bad_input_get_declared_answers(
    document: dict[str, Any], api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    client = api_client_as(OWNER)
    for path, method in operations(document):
        url = concrete(path, registry)
        if method == "get":
            for query in BAD_QUERIES:
                assert_declared(document, path, method, client.get(url + query))
            assert_declared(document, path, method, client.get(url))
            continue
        for body in BAD_BODIES:
            assert_declared(document, path, method, call(client, method, url, body))
        for raw in RAW_BAD_BODIES:
            response = client.generic(method.upper(), url, raw, content_type="application/json")
            assert_declared(document, path, method, response)
        broken = client.generic(method.upper(), url, "{not json", content_type="application/json")
        assert_declared(document, path, method, broken)


def test_validation_errors_name_the_field(
    api_client_as: Callable[[str], Client], registry: Registry
) -> None:
    response = call(api_client_as(OWNER), "post", "/api/registry/domains", {"slug": "x"})
    assert response.status_code == 422
    assert response.json() == {
        "detail": "invalid input",
        "errors": {"title": ["Field required"]},
    }
