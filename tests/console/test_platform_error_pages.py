"""Error pages (issue #10: they were bare or Django's debug page): 400, 403, 404 and 500 come in
the console's layout with an explanation and a way back, never a traceback. Tests run with
DEBUG off, as production does."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.console.factories import OWNER, TEAMMATE_ANNOTATOR

pytestmark = pytest.mark.django_db


def assert_console_page(response: Any, status: int, title: str) -> str:
    content = response.content.decode()
    assert response.status_code == status
    assert f"<h1>{title}</h1>" in content
    assert 'class="topbar"' in content and "console.css" in content
    assert "Traceback" not in content
    return content


def test_a_missing_page_is_the_consoles_404(client_as: Any, people: Any) -> None:
    content = assert_console_page(client_as(OWNER).get("/domains/987654/"), 404, "Not found (404)")
    assert "Back to the registry" in content


def test_a_role_too_low_is_the_consoles_403_with_the_reason(client_as: Any, people: Any) -> None:
    content = assert_console_page(
        client_as(TEAMMATE_ANNOTATOR).get("/domains/new/"), 403, "Not allowed (403)"
    )
    assert "This needs the researcher role" in content


def test_a_bad_request_is_the_consoles_400(client_as: Any, people: Any) -> None:
    assert_console_page(client_as(OWNER).get("/domains/", {"q": "a\x00"}), 400, "Bad request (400)")


def test_a_form_without_its_csrf_token_is_the_consoles_403(people: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(people.owner)
    content = assert_console_page(
        client.post("/domains/new/", {"slug": "x", "title": "X"}), 403, "Form expired (403)"
    )
    assert "Nothing was changed" in content


def test_a_server_error_is_the_consoles_500(people: Any, monkeypatch: Any) -> None:
    from console.registry import selectors

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(selectors, "registry_counts", broken)
    client = Client(raise_request_exception=False)
    client.force_login(people.owner)
    content = assert_console_page(client.get("/"), 500, "Server error (500)")
    assert "secret internals" not in content
