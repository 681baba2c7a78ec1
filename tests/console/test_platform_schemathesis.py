"""schemathesis against the app's own /api/openapi.json, as the team's owner (a Bearer token).

Every operation in the document gets generated requests, valid ones and deliberately invalid
ones, sent in-process through Django's WSGI handler (the same database transaction as the test,
so the objects built here are visible and everything is rolled back after). The bar is the
issue's: no server error, and every answer has a status, content type and body the document
declares. Path ids are steered to the team's real objects half of the time, otherwise nearly
every request would be a 404 and the write paths would go untested.

Examples per operation are bounded (SCHEMATHESIS_EXAMPLES, default 25) so the test takes a
minute or two on two cores.
"""

from __future__ import annotations

import os
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.console.factories import OWNER
from tests.console.test_registry_factories import Registry, build_registry

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EXAMPLES_PER_OPERATION = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# The task-set upload takes the raw JSONL body, declared as a binary string: send it as bytes.
schemathesis.serializer.alias("application/jsonl", "application/octet-stream")

MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


@pytest.fixture
def in_test_transaction() -> Any:
    """Requests through the plain WSGI handler would close the test's database connection at
    their end (and with it the transaction the test's objects live in); Django's test Client
    unhooks the same signal handler for the same reason."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _real_ids(registry: Registry) -> dict[str, int]:
    return {
        "domain_id": registry.domain.pk,
        "rubric_id": registry.rubric.pk,
        "image_id": registry.image.pk,
        "number": 1,
    }


def _steered(case: Any, real: dict[str, int], use_real: bool) -> Any:
    """The case with its path ids replaced by the team's objects' (when asked and when the
    generated value is a valid one: negative cases keep their deliberately bad ids)."""
    if use_real and case.path_parameters:
        for name, value in list(case.path_parameters.items()):
            if name in real and isinstance(value, int):
                case.path_parameters[name] = real[name]
    return case


def test_schemathesis_finds_no_server_error_and_no_answer_the_document_does_not_declare(
    people: Any, settings: Any, in_test_transaction: None
) -> None:
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    registry = build_registry(people)
    real = _real_ids(registry)
    headers = {"Authorization": f"Bearer {people.token(OWNER)}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", WSGIHandler())
    failures: list[str] = []
    operations: list[Any] = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) > 10, "the document lost its operations"

    for operation in operations:
        for mode in MODES:
            _explore(operation, mode, real=real, headers=headers, failures=failures)

    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:20])


def _explore(
    operation: Any,
    mode: schemathesis.GenerationMode,
    *,
    real: dict[str, int],
    headers: dict[str, str],
    failures: list[str],
) -> None:
    strategy = st.tuples(operation.as_strategy(generation_mode=mode), st.booleans())

    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(drawn=strategy)
    def exercise(drawn: tuple[Any, bool]) -> None:
        case = _steered(drawn[0], real, drawn[1])
        response = case.call(headers=headers)
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (AssertionError, BaseExceptionGroup) as failure:
            failures.append(
                f"{mode.value} {operation.method.upper()} {operation.path} "
                f"{case.path_parameters} {case.query} -> {response.status_code}: "
                f"{str(failure)[:800]}"
            )

    exercise()
