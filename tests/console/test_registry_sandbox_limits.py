"""Every layer agrees on the sandbox limits (issue #10): the bounds live in
``sandboxes.LIMITS`` and the sandbox spec, the rubric's ``sandbox`` block, the registry's
service, its form and its API accept and refuse the same values.

For each limit a sandbox image version stores: its minimum and maximum are accepted
everywhere; one step below and above are refused everywhere, each refusal naming the field
(a 422 from the API, a form error) and saving nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from console.registry import services, specs
from console.registry.forms import SandboxVersionForm
from console.registry.models import FRACTIONAL_LIMITS, LIMIT_BOUNDS, SandboxImage
from sandboxes import LIMITS, SandboxSpec, SandboxSpecError
from tests.console.test_registry_factories import make_image

pytestmark = pytest.mark.django_db


def boundary_cases(name: str) -> list[tuple[float, bool]]:
    """(value, accepted) at the console's bounds for ``name`` and one step outside each."""
    low, high = LIMIT_BOUNDS[name]
    if name in FRACTIONAL_LIMITS:
        below, above = math.nextafter(low, -math.inf), math.nextafter(high, math.inf)
        return [(low, True), (high, True), (below, False), (above, False)]
    return [(int(low), True), (int(high), True), (int(low) - 1, False), (int(high) + 1, False)]


CASES = [
    pytest.param(name, value, accepted, id=f"{name}={value!r}")
    for name in LIMIT_BOUNDS
    for value, accepted in boundary_cases(name)
]


def test_the_console_bounds_are_the_sandbox_bounds() -> None:
    for name, (low, high) in LIMIT_BOUNDS.items():
        bounds = LIMITS[name]
        # Whole-number fields round inwards (timeout_s: whole seconds from 0.1 s up).
        assert bounds.minimum <= low < bounds.minimum + 1
        assert bounds.maximum - 1 < high <= bounds.maximum
        assert bounds.accepts(low if name in FRACTIONAL_LIMITS else int(low))


@pytest.mark.parametrize(("name", "value", "accepted"), CASES)
def test_every_layer_agrees_on_each_bound(
    people: Any, api_client_as: Callable[[str], Client], name: str, value: float, accepted: bool
) -> None:
    # The sandboxes library, which owns the bounds.
    try:
        SandboxSpec(**{name: value})
        assert accepted
    except SandboxSpecError as refused:
        assert not accepted and set(refused.errors) == {name}

    # A rubric's sandbox block, as the console checks a rubric source.
    spec = {
        "version": 1,
        "criteria": [{"name": "runs", "kind": "compiles"}],
        "sandbox": {name: value},
    }
    _, issues = specs.check_rubric_source(json.dumps(spec), "json")
    assert [issue.path for issue in issues] == ([] if accepted else [f"sandbox.{name}"])

    # The registry's form: the field's own min/max, nothing else to complain about.
    form = SandboxVersionForm(data={**services.SANDBOX_DEFAULTS, name: repr(value)})
    assert form.is_valid() is accepted, form.errors
    if not accepted:
        assert set(form.errors) == {name}
    attrs = form.fields[name].widget.attrs
    assert (float(attrs["min"]), float(attrs["max"])) == LIMIT_BOUNDS[name]

    # The registry's service.
    try:
        make_image(team=people.team, user=people.owner, slug="by-service", **{name: value})
        assert accepted
    except ValidationError as refused:
        assert not accepted and set(refused.message_dict) == {name}

    # The registry's API.
    response = api_client_as("owner").post(
        "/api/registry/sandbox-images",
        json.dumps({"slug": "by-api", "title": "T", name: value}),
        content_type="application/json",
    )
    if accepted:
        assert response.status_code == 201, response.content
        assert response.json()["versions"]
    else:
        assert response.status_code == 422 and set(response.json()["errors"]) == {name}
    expected = {"by-service", "by-api"} if accepted else set()
    assert set(SandboxImage.objects.values_list("slug", flat=True)) == expected


def test_the_api_schema_documents_each_range(client: Client) -> None:
    schema = client.get("/api/openapi.json").json()
    properties = schema["components"]["schemas"]["SandboxValues"]["properties"]
    for name, (low, high) in LIMIT_BOUNDS.items():
        assert (properties[name]["minimum"], properties[name]["maximum"]) == (low, high)
