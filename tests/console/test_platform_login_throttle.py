"""Login throttling (issue #10: 40 wrong passwords in a row, then the right one, were all
accepted). Per account and per address, with a clear message; the right password is refused
too while throttled; /admin/login/ is covered as well."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client

from console.accounts.models import LoginFailure
from tests.console.factories import UserFactory, password_for

pytestmark = pytest.mark.django_db
LOGIN = "/accounts/login/"


def attempt(username: str, password: str, address: str = "127.0.0.1") -> tuple[Any, Client]:
    client = Client(REMOTE_ADDR=address)
    return client.post(LOGIN, {"username": username, "password": password}), client


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(username: str, times: int, address: str = "127.0.0.1") -> None:
    for _ in range(times):
        response, _ = attempt(username, "wrong-password", address)
        # The form again: first with the generic message, then with the throttle's (429).
        assert response.status_code in (200, 429)


def test_a_few_wrong_passwords_do_not_lock_anyone_out(people: Any, settings: Any) -> None:
    fail("owner", settings.LOGIN_FAILURES_PER_ACCOUNT - 1)
    response, client = attempt("owner", password_for("owner"))
    assert response.status_code == 302
    assert logged_in(client)


def test_after_too_many_wrong_passwords_the_right_one_is_refused_with_a_clear_message(
    people: Any, settings: Any
) -> None:
    fail("owner", 40)
    response, client = attempt("owner", password_for("owner"))
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert int(response["Retry-After"]) > 0
    assert not logged_in(client)


def test_the_account_limit_holds_across_addresses_and_letter_case(
    people: Any, settings: Any
) -> None:
    for number in range(settings.LOGIN_FAILURES_PER_ACCOUNT):
        fail("Owner" if number % 2 else "owner", 1, address=f"10.0.0.{number + 1}")
    response, client = attempt("owner", password_for("owner"), address="10.9.9.9")
    assert response.status_code == 429
    assert not logged_in(client)


def test_the_address_limit_holds_across_accounts_and_spares_other_addresses(
    people: Any, settings: Any
) -> None:
    for number in range(settings.LOGIN_FAILURES_PER_ADDRESS):
        fail(f"nobody-{number}", 1, address="10.1.1.1")
    refused, client = attempt("owner", password_for("owner"), address="10.1.1.1")
    assert refused.status_code == 429
    assert not logged_in(client)
    allowed, other = attempt("owner", password_for("owner"), address="10.2.2.2")
    assert allowed.status_code == 302
    assert logged_in(other)


def test_the_throttle_lifts_when_the_failures_leave_the_window(people: Any, settings: Any) -> None:
    fail("owner", settings.LOGIN_FAILURES_PER_ACCOUNT)
    LoginFailure.objects.update(
        at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S + 1)
    )
    response, client = attempt("owner", password_for("owner"))
    assert response.status_code == 302
    assert logged_in(client)


def test_a_successful_login_clears_its_accounts_failures_only(people: Any, settings: Any) -> None:
    fail("owner", settings.LOGIN_FAILURES_PER_ACCOUNT - 1)
    fail("outsider", 1)
    attempt("owner", password_for("owner"))
    assert list(LoginFailure.objects.values_list("username", flat=True)) == ["outsider"]


def test_the_admin_login_is_throttled_too(db: None, settings: Any) -> None:
    staff = UserFactory(username="staffer", is_staff=True, is_superuser=True)
    fail("staffer", settings.LOGIN_FAILURES_PER_ACCOUNT)
    client = Client()
    client.post(
        "/admin/login/?next=/admin/",
        {"username": "staffer", "password": password_for(staff.username), "next": "/admin/"},
    )
    assert not logged_in(client)


def test_failures_are_recorded_without_the_password(people: Any) -> None:
    fail("owner", 1)
    failure = LoginFailure.objects.get()
    assert (failure.username, failure.address) == ("owner", "127.0.0.1")
    assert "wrong-password" not in str(
        LoginFailure.objects.values().get()
    )  # only who and from where
