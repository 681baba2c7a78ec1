"""Hostile input to the accounts pages (issue #10): integers past 64 bits and NUL characters
answer 4xx, never a server error, and change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from console.accounts.models import ApiToken, Membership
from console.audit.models import AuditEntry
from tests.console.factories import OWNER, TEAMMATE_ADMIN

pytestmark = pytest.mark.django_db
HUGE = str(2**64)


def state() -> tuple[int, int, int]:
    return AuditEntry.objects.count(), Membership.objects.count(), ApiToken.objects.count()


def test_huge_ids_on_account_pages_are_4xx_with_nothing_changed(
    client_as: Any, people: Any
) -> None:
    owner, admin = client_as(OWNER), client_as(TEAMMATE_ADMIN)
    before = state()
    assert owner.post("/accounts/team/", {"team": HUGE}).status_code == 404
    assert owner.post(f"/accounts/tokens/{HUGE}/revoke/").status_code == 404
    assert admin.post(f"/accounts/members/{HUGE}/role/", {"role": "admin"}).status_code == 404
    assert admin.post(f"/accounts/members/{HUGE}/remove/").status_code == 404
    assert state() == before


def test_nul_in_account_forms_is_refused(client_as: Any, people: Any) -> None:
    before = state()
    token = client_as(OWNER).post("/accounts/tokens/", {"name": "a\x00b"})
    assert token.status_code == 400
    member = client_as(TEAMMATE_ADMIN).post(
        "/accounts/members/", {"username": "a\x00", "role": "researcher"}
    )
    assert member.status_code == 400
    login = client_as("anonymous").post("/accounts/login/", {"username": "a\x00", "password": "x"})
    assert login.status_code == 200  # the form again, with its error
    assert state() == before


def test_audit_filters_with_nul_or_huge_values_are_ignored_not_a_server_error(
    client_as: Any, people: Any
) -> None:
    response = client_as(OWNER).get("/audit/", {"actor": "a\x00", "action": HUGE, "page": HUGE})
    assert response.status_code == 200
