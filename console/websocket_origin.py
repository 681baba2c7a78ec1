"""The websocket origin check: a page may open a websocket only to its own origin.

Channels' AllowedHostsOriginValidator compares only the Origin's host name with ALLOWED_HOSTS,
so a page on http://localhost:9999 (any other program on the machine) or on plain http could
open an authenticated socket to https://localhost:8000 with the user's cookie. Here the Origin
must match the socket's own scheme, host and port exactly (the Host header it was sent to,
with ws→http and wss→https), or be listed in CSRF_TRUSTED_ORIGINS, the same list Django's
CSRF check trusts for forms; and the Host itself must be in ALLOWED_HOSTS.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            try:
                return value.decode("latin1")
            except UnicodeDecodeError:
                return None
    return None


def _origin_tuple(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None if not an origin."""
    try:
        parts = urlsplit(url.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def _page_scheme(scope: dict[str, Any]) -> str:
    scheme = "https" if scope.get("scheme") == "wss" else "http"
    # Behind a proxy that terminates TLS and says so in a header the deployment trusts.
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, value = proxy_header
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        if _header(scope, header) == value:
            scheme = "https"
    return scheme


def _trusted(origin: tuple[str, str, int], patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if "://*." in pattern:  # Django's form for "any subdomain"
            scheme, _, domain = pattern.lower().partition("://*.")
            if origin[0] == scheme and origin[1].endswith("." + domain.split(":")[0]):
                return True
        elif _origin_tuple(pattern) == origin:
            return True
    return False


def origin_allowed(scope: dict[str, Any]) -> bool:
    host = _header(scope, b"host")
    origin_header = _header(scope, b"origin")
    if not host or not origin_header:
        return False
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    origin = _origin_tuple(origin_header)
    if origin is None:
        return False
    if origin == _origin_tuple(f"{_page_scheme(scope)}://{host}"):
        return True
    return _trusted(origin, settings.CSRF_TRUSTED_ORIGINS)


class SameOriginValidator:
    """ASGI middleware for websocket routes: refuses the handshake (403) unless
    `origin_allowed`."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
