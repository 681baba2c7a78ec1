"""One navigation on every page: the registry's pages used to replace it with their own and
drop API tokens, the API docs and (for admins) members."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, TEAMMATE_ADMIN
from tests.console.test_registry_factories import build_registry

pytestmark = pytest.mark.django_db

EVERY_SECTION = (
    "Registry",
    "Domains",
    "Rubrics",
    "Sandbox images",
    "Runs",
    "Models",
    "Hosts",
    "Scheduler",
    "Audit log",
    "Status",
    "API tokens",
    "API",
)


def _page_urls(people: Any) -> list[str]:
    registry = build_registry(people)
    return [
        reverse("registry:home"),
        reverse("registry:domain_list"),
        reverse("registry:domain_detail", args=[registry.domain.pk]),
        reverse("registry:rubric_list"),
        reverse("registry:rubric_detail", args=[registry.rubric.pk]),
        reverse("registry:rubric_version", args=[registry.rubric.pk, 1]),
        reverse("registry:sandbox_image_detail", args=[registry.image.pk]),
        reverse("audit:list"),
        reverse("status:page"),
        reverse("accounts:tokens"),
        reverse("runs:run_list"),
        reverse("runs:model_list"),
        reverse("runs:host_list"),
        reverse("scheduling:queue"),
        reverse("scheduling:fleet"),
    ]


def _nav_links(content: str) -> list[str]:
    nav = re.search(r'<nav class="mainnav">(.*?)</nav>', content, re.S)
    assert nav, "no main navigation"
    return [re.sub(r"\s+", " ", text).strip() for text in re.findall(r">([^<]+)</a>", nav[1])]


@pytest.mark.parametrize("who", EVERYONE)
def test_every_page_shows_the_same_navigation(
    who: str, people: Any, client_as: Callable[[str], Client]
) -> None:
    client = client_as(who)
    for url in _page_urls(people):
        response = client.get(url)
        if who == ANONYMOUS:
            assert response.status_code == 302, url
            continue
        if who == OUTSIDER and response.status_code == 404:
            continue  # another team's object: not there for them
        assert response.status_code == 200, url
        expected = list(EVERY_SECTION)
        if who == TEAMMATE_ADMIN:
            expected.insert(expected.index("Status") + 1, "Members")
        assert _nav_links(response.content.decode()) == expected, url


def test_the_current_section_is_marked(owner_client: Client, people: Any) -> None:
    build_registry(people)
    content = owner_client.get(reverse("registry:rubric_list")).content.decode()
    assert 'class="active" aria-current="page">Rubrics</a>' in content
    assert content.count('aria-current="page"') == 1
