"""Typed readers for environment variables that fail loudly on bad values.

Settings are driven only by the environment; a typo such as DEBUG=flase must stop start-up
with a message naming the variable, not silently fall back to a default.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse


class EnvError(ValueError):
    """An environment variable is set to a value that cannot be used."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise EnvError(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} must be ≥ {minimum}")
    return value


def env_list(name: str, default: list[str] | None) -> list[str]:
    """Comma-separated values; with `default=None` the variable must be set and non-empty."""
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise EnvError(f"{name} must be set (comma-separated)")
        return list(default)
    values = [item.strip() for item in raw.split(",") if item.strip()]
    if default is None and not values:
        raise EnvError(f"{name} must not be empty")
    return values


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise EnvError(f"{name}={value!r} is not one of {', '.join(sorted(choices))}")
    return value


def database_from_url(url: str) -> dict[str, object]:
    """Django DATABASES entry from postgres://user:pass@host:port/name (host may be a socket dir
    given as ?host=/path)."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise EnvError(f"DATABASE_URL scheme {parsed.scheme!r} is not postgres:// or postgresql://")
    name = unquote(parsed.path.lstrip("/"))
    if not name:
        raise EnvError("DATABASE_URL has no database name")
    query = dict(part.split("=", 1) for part in parsed.query.split("&") if "=" in part)
    host = unquote(query.pop("host", "") or (parsed.hostname or ""))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": query,
    }
