"""Login throttling, per account and per client address.

After LOGIN_FAILURES_PER_ACCOUNT failed passwords for one username, or
LOGIN_FAILURES_PER_ADDRESS from one address, within LOGIN_THROTTLE_WINDOW_S, every login for
that username or from that address is refused, the right password included, until the oldest
failure leaves the window. The account limit stops a slow guess at one account from many
addresses; the address limit stops one client guessing across many accounts.

It is enforced in the authentication backend (`ThrottledModelBackend`), so every login form
(the console's and /admin/'s) is covered; the login view asks `login_wait_s` first to say so
clearly with a 429. A successful login clears its account's failures, never its address's
(or an attacker could reset the address count with an account of their own).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from console.accounts.models import LoginFailure


def _window() -> dt.timedelta:
    return dt.timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S)


def normalized_username(username: Any) -> str:
    # Usernames are matched case-insensitively here so "Owner" and "owner" share one count.
    return str(username or "").replace("\x00", "").strip().lower()[:150]


def client_address(request: HttpRequest | None) -> str | None:
    """The peer's address. A deployment behind a proxy must have the proxy set REMOTE_ADDR
    (X-Forwarded-For is client-controlled and is not trusted here)."""
    if request is None:
        return None
    raw = request.META.get("REMOTE_ADDR") or ""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def login_wait_s(*, username: Any, address: str | None) -> int:
    """Seconds until a login for `username` from `address` is allowed again; 0 when it is."""
    now = timezone.now()
    recent = LoginFailure.objects.filter(at__gt=now - _window())
    waits = [0.0]
    for condition, limit in (
        (Q(username=normalized_username(username)), settings.LOGIN_FAILURES_PER_ACCOUNT),
        (Q(address=address) if address else None, settings.LOGIN_FAILURES_PER_ADDRESS),
    ):
        if condition is None:
            continue
        failures = recent.filter(condition)
        if failures.count() >= limit:
            # Allowed again once enough failures age out to bring the count under the limit.
            times = list(failures.order_by("-at").values_list("at", flat=True)[:limit])
            waits.append((times[-1] + _window() - now).total_seconds())
    return max(0, math.ceil(max(waits)))


@transaction.atomic
def login_failure_record(*, username: Any, address: str | None) -> None:
    now = timezone.now()
    # Rows older than the window never count again: prune them as new ones arrive.
    LoginFailure.objects.filter(at__lte=now - _window()).delete()
    LoginFailure.objects.create(username=normalized_username(username), address=address, at=now)


def login_failures_clear(*, username: Any) -> None:
    LoginFailure.objects.filter(username=normalized_username(username)).delete()


def wait_message(wait_s: int) -> str:
    minutes = max(1, math.ceil(wait_s / 60))
    unit = "minute" if minutes == 1 else "minutes"
    return (
        "Too many failed logins for this account or from this address. "
        f"Try again in {minutes} {unit}."
    )


class ThrottledModelBackend(ModelBackend):
    """Django's username/password check behind the throttle. Raising PermissionDenied stops
    Django's authenticate() from trying any other backend, so a throttled login fails even
    with the right password."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if username is None:
            username = kwargs.get("username")
        if username is None or password is None:
            return None
        address = client_address(request)
        wait_s = login_wait_s(username=username, address=address)
        if wait_s > 0:
            raise PermissionDenied(wait_message(wait_s))
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failure_record(username=username, address=address)
        else:
            login_failures_clear(username=username)
        return user
