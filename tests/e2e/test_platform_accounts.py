"""Accounts in the browser: an API token shown once, and the audit log recording it."""

from __future__ import annotations

import json
from urllib.request import Request, urlopen

from tests.e2e.conftest import login, screenshot


def test_a_token_made_in_the_browser_works_once_copied_and_the_audit_log_shows_it(
    page, people, live_server_url
):
    login(page, people.teammate_admin)
    page.goto("/accounts/tokens/")
    page.get_by_label("Name").fill("nightly <eval> script")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token").inner_text().strip()
    screenshot(page, "platform-token-created")
    me = Request(f"{live_server_url}/api/me", headers={"Authorization": f"Bearer {secret}"})  # noqa: S310
    with urlopen(me, timeout=10) as response:  # noqa: S310  (the test server)
        assert json.load(response)["username"] == "teammate_admin"

    page.goto("/accounts/tokens/")
    assert page.locator("#new-token").count() == 0
    assert secret not in page.content()

    page.goto("/audit/")
    row = page.locator("table.audit > tbody > tr", has_text="api_token.create")
    assert "nightly <eval> script" in row.inner_text()  # shown as text, not markup
    # Filtering by action swaps the table in place (htmx), without a full reload.
    page.evaluate("window.__same_document = true")
    page.get_by_label("Action").select_option("api_token.create")
    page.wait_for_url("**action=api_token.create**")
    assert page.evaluate("window.__same_document") is True
    assert page.locator("table.audit > tbody > tr").count() == 1
    screenshot(page, "platform-audit-log")

    page.goto("/accounts/members/")
    assert page.locator("table.members tbody tr").count() == 4
    screenshot(page, "platform-members")
