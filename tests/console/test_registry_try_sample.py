"""Reward code and the web process (issue #10): a rubric's `python_function` may name only a
function in TRUSTED_REWARD_FUNCTIONS, and "try it on a sample" scores in a child process, with
a deadline and without the console's secrets, never inside the web process."""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.registry import services
from console.registry.models import RubricVersion
from tests.console.factories import (
    ANONYMOUS,
    EVERYONE,
    OUTSIDER,
    OWNER,
    TEAMMATE_ANNOTATOR,
    WRITERS,
)
from tests.console.test_registry_factories import make_rubric

pytestmark = pytest.mark.django_db
PROBE = "tests.console.reward_probe:where_am_i"
HTMX = {"HTTP_HX_REQUEST": "true"}
SAMPLE = {"prompt": "p", "completion": "c", "ground_truth": "g"}


def python_function_source(function: str) -> str:
    criterion = {"name": "fn", "kind": "python_function", "params": {"function": function}}
    return json.dumps({"version": 1, "criteria": [criterion]})


def shown_details(response: Any) -> dict[str, Any]:
    """The criterion details the result panel shows (as formatted JSON)."""
    found = re.search(
        r"<summary>Details</summary><pre>(.*?)</pre>", response.content.decode(), re.S
    )
    assert found, response.content.decode()
    return json.loads(html.unescape(found.group(1)))  # type: ignore[no-any-return]


def shown_text(response: Any) -> str:
    return html.unescape(response.content.decode())


@pytest.fixture
def trusted_probe(settings: Any) -> None:
    settings.TRUSTED_REWARD_FUNCTIONS = [PROBE]


@pytest.mark.parametrize("function", ["os:system", "subprocess.run", "builtins:eval", PROBE])
def test_a_python_function_outside_the_allow_list_is_refused_with_nothing_saved(
    function: str, api_client_as: Callable[[str], Client], people: Any
) -> None:
    before = RubricVersion.objects.count()
    response = api_client_as(OWNER).post(
        "/api/registry/rubrics",
        {"slug": "fn", "title": "Fn", "source": python_function_source(function)},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert "TRUSTED_REWARD_FUNCTIONS" in json.dumps(response.json())
    assert "criteria[0].params.function" in json.dumps(response.json())
    assert RubricVersion.objects.count() == before


@pytest.mark.parametrize("function", [PROBE, PROBE.replace(":", ".")])
def test_a_listed_function_is_accepted_in_either_spelling(
    function: str, trusted_probe: None, api_client_as: Callable[[str], Client], people: Any
) -> None:
    response = api_client_as(OWNER).post(
        "/api/registry/rubrics",
        {"slug": "fn", "title": "Fn", "source": python_function_source(function)},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    version = RubricVersion.objects.get(rubric__team=people.team, rubric__slug="fn")
    assert version.spec["criteria"][0]["params"]["function"] == function
    published = services.rubric_version_publish(actor=people.owner, version=version)
    assert published.status == "published"


def test_trying_a_sample_scores_in_a_child_process_without_the_consoles_secrets(
    trusted_probe: None, people: Any, client_as: Callable[[str], Client]
) -> None:
    rubric = make_rubric(team=people.team, user=people.owner, source=python_function_source(PROBE))
    url = reverse("registry:rubric_version_try", args=[rubric.pk, 1])
    for who in EVERYONE:
        response = client_as(who).post(url, SAMPLE, **HTMX)
        if who in WRITERS:
            assert response.status_code == 200, who
            content = response.content.decode()
            assert '<strong id="try-total">1.0</strong>' in content, content
            details = shown_details(response)["fn"]
            assert details["pid"] != os.getpid()
            assert details["sees_console_settings"] is False
            assert details["cwd"] != os.getcwd()
        elif who == TEAMMATE_ANNOTATOR:
            assert response.status_code == 403
        elif who == OUTSIDER:
            assert response.status_code == 404
        else:
            assert who == ANONYMOUS and response.status_code == 302


def test_a_version_saved_before_the_allow_list_changed_is_not_run(
    trusted_probe: None, people: Any, owner_client: Client, settings: Any
) -> None:
    rubric = make_rubric(team=people.team, user=people.owner, source=python_function_source(PROBE))
    settings.TRUSTED_REWARD_FUNCTIONS = []
    url = reverse("registry:rubric_version_try", args=[rubric.pk, 1])
    response = owner_client.post(url, SAMPLE, **HTMX)
    assert response.status_code == 200
    assert 'id="try-total"' not in response.content.decode()
    assert "not a trusted reward function" in shown_text(response)
    with pytest.raises(services.ValidationError):
        services.rubric_version_publish(actor=people.owner, version=rubric.versions.get())


def test_scoring_that_overruns_its_deadline_is_stopped_with_a_message(
    people: Any, owner_client: Client, settings: Any
) -> None:
    slow = "tests.console.reward_probe:sleeps"
    settings.TRUSTED_REWARD_FUNCTIONS = [slow]
    settings.TRY_SAMPLE_TIMEOUT_S = 3
    rubric = make_rubric(team=people.team, user=people.owner, source=python_function_source(slow))
    url = reverse("registry:rubric_version_try", args=[rubric.pk, 1])
    response = owner_client.post(url, SAMPLE, **HTMX)
    assert response.status_code == 200
    assert "longer than 3 s" in shown_text(response)
