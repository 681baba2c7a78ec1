"""Settings from the environment: deploy checks pass with DEBUG off; bad values stop start-up;
docker-compose.yml is a valid compose file."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from console.env import EnvError, database_from_url

BASE_DIR = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "console.example.org",
}


def load_settings(monkeypatch: pytest.MonkeyPatch, **env: str | None) -> ModuleType:
    """A fresh copy of console/settings.py evaluated under `env` (None unsets a variable)."""
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location(
        "settings_under_test", BASE_DIR / "console" / "settings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_check_deploy_reports_nothing_with_debug_off_and_secrets_given():
    env = {**os.environ, **PRODUCTION}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_production_settings_are_secure(monkeypatch):
    settings = load_settings(monkeypatch, **PRODUCTION)
    assert settings.DEBUG is False
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE
    assert settings.SECURE_SSL_REDIRECT and settings.SECURE_HSTS_SECONDS >= 31536000
    assert settings.ALLOWED_HOSTS == ["console.example.org"]
    # X-Forwarded-Proto is trusted only when a proxy is declared.
    assert not hasattr(settings, "SECURE_PROXY_SSL_HEADER")
    behind_proxy = load_settings(monkeypatch, TRUST_X_FORWARDED_PROTO="1")
    assert behind_proxy.SECURE_PROXY_SSL_HEADER == ("HTTP_X_FORWARDED_PROTO", "https")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "flase"}, "DEBUG='flase' is not a boolean"),
        (
            {"DEBUG": "0", "SECRET_KEY": None, "ALLOWED_HOSTS": "a.example"},
            "SECRET_KEY must be set",
        ),
        ({"DEBUG": "0", "ALLOWED_HOSTS": None}, "ALLOWED_HOSTS must be set"),
        ({"DEBUG": "0", "ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS must not be empty"),
        ({"DATABASE_URL": "mysql://u@h/db"}, "DATABASE_URL scheme 'mysql'"),
        ({"DATABASE_URL": "postgresql://u@h/"}, "DATABASE_URL has no database name"),
        ({"STATUS_PROBE_INTERVAL_S": "0"}, "STATUS_PROBE_INTERVAL_S=0 must be ≥ 1"),
        ({"TASKSET_MAX_LINE_BYTES": "1MB"}, "TASKSET_MAX_LINE_BYTES='1MB' is not an integer"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL='LOUD' is not one of"),
        ({"SECURE_SSL_REDIRECT": "maybe"}, "SECURE_SSL_REDIRECT='maybe' is not a boolean"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(monkeypatch, env, message):
    base = {**PRODUCTION} if env.get("DEBUG") == "0" else {}
    with pytest.raises(EnvError, match=re.escape(message)):
        load_settings(monkeypatch, **{**base, **env})


def test_the_dev_key_is_refused_with_debug_off(monkeypatch):
    from console import settings as dev_settings

    with pytest.raises(EnvError, match="real secret"):
        load_settings(monkeypatch, **{**PRODUCTION, "SECRET_KEY": dev_settings._INSECURE_DEV_KEY})


def test_database_urls_for_sockets_and_tcp_parse():
    socket = database_from_url("postgresql://postgres@/console?host=/work/var/pg")
    assert (socket["NAME"], socket["HOST"], socket["USER"]) == (
        "console",
        "/work/var/pg",
        "postgres",
    )
    tcp = database_from_url("postgres://app:p%40ss@db.internal:6543/prod?sslmode=require")
    assert (tcp["HOST"], tcp["PORT"], tcp["PASSWORD"]) == ("db.internal", "6543", "p@ss")
    assert tcp["OPTIONS"] == {"sslmode": "require"}


def test_the_channel_layer_and_celery_share_the_redis_url(monkeypatch):
    settings = load_settings(monkeypatch, REDIS_URL="redis+socket:///tmp/r/redis.sock")
    assert settings.CELERY_BROKER_URL == "redis+socket:///tmp/r/redis.sock"
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] == [
        {"address": "unix:///tmp/r/redis.sock", "socket_timeout": None, "socket_connect_timeout": 5}
    ]
    tcp = load_settings(monkeypatch, REDIS_URL="redis://cache:6379/0")
    assert tcp.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] == [
        {
            "address": "redis://cache:6379/0",
            "socket_timeout": None,
            "socket_connect_timeout": 5,
            "socket_keepalive": True,
        }
    ]


# --- docker-compose.yml

COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not installed (scripts/bootstrap.sh installs it)"
)


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"SECRET_KEY", "POSTGRES_PASSWORD", "ALLOWED_HOSTS"}
    }
    return subprocess.run(
        [str(COMPOSE), "-f", "docker-compose.yml", "config"],
        cwd=BASE_DIR, env={**clean, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@needs_compose
def test_docker_compose_file_is_valid_and_has_every_service():
    import yaml

    done = compose_config(
        {"SECRET_KEY": "s" * 60, "POSTGRES_PASSWORD": "pw", "ALLOWED_HOSTS": "a.example"}
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert set(config["services"]) == {"postgres", "redis", "web", "control-worker", "host-agent"}
    web = config["services"]["web"]
    assert web["environment"]["DEBUG"] == "0"
    command = web["command"] if isinstance(web["command"], str) else " ".join(web["command"])
    assert "migrate" in command and "console.asgi:application" in command
    # The host agent command registers the host and consumes host.<name> (its queue).
    agent = config["services"]["host-agent"]
    assert agent["command"] == ["python", "manage.py", "host_agent", "--name", "gpu-host-1"]
    control = config["services"]["control-worker"]["command"]
    assert "-B" in control and control[control.index("-Q") + 1] == "control"


@needs_compose
def test_docker_compose_refuses_to_run_without_its_secrets():
    done = compose_config({})
    assert done.returncode != 0
    assert "set SECRET_KEY" in done.stderr or "set POSTGRES_PASSWORD" in done.stderr


def test_every_variable_the_settings_read_is_documented_in_settings_md():
    source = (BASE_DIR / "console" / "settings.py").read_text()
    read = set(re.findall(r"\benv_\w+\(\s*\"([A-Z][A-Z0-9_]*)\"", source))
    assert {"DEBUG", "DATABASE_URL", "RUNS_SWEEP_S"} <= read  # the pattern finds the readers
    documented = set(
        re.findall(
            r"^\| `([A-Z][A-Z0-9_]*)` \|", (BASE_DIR / "docs" / "SETTINGS.md").read_text(), re.M
        )
    )
    assert sorted(read - documented) == []
