"""Browser tests: the real ASGI server (uvicorn, websockets on) and Debian's Chromium.

Fixtures:

- `live_server_url`: the base URL of a uvicorn subprocess serving `console.asgi:application`
  against the pytest test database and the run's Redis. The server starts once per session;
  each test that uses it gets `transactional_db` (data is committed, so the server sees it, and
  the tables are emptied after the test).
- `browser` (session) and `page` (per test, a fresh context with `base_url` set, so
  `page.goto("/status/")` works): Playwright driving `/usr/bin/chromium`.
- `people`: the role matrix from tests/conftest.py (real password hashes here; each user's
  password is `tests.console.factories.password_for(username)`).

Helpers: `login(page, user)` logs in through the login form; `screenshot(page, name)` saves
`test-artifacts/<name>.png` and returns its path. For the run pages: `model_version(people,
tmp_path)` registers a model, `run_of(people, version, name, state)` saves a run of 20 steps on
it and `sink_on(run, host)` is the writer of its running attempt on a new host (`ConsoleSink`,
the job's own: the pages cannot tell its rows from a trained run's).

All tests here are marked `e2e` (and `slow`) automatically.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.parse import quote
from urllib.request import urlopen

import pytest

from console.runs import services
from console.runs.models import Host, Run
from console.runs.sink import ConsoleSink
from tests.console.factories import attempt_create, password_for

BASE_DIR = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = BASE_DIR / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SERVER_START_TIMEOUT_S = 90
UI_TIMEOUT_MS = 20_000


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


# Package scope, not session: Playwright's loop must stop once the browser tests are done, or
# every later test that calls asyncio.run() (sandbox pools, channel layers) finds a running loop.
@pytest.fixture(scope="package")
def _allow_orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API keeps an event loop in this thread from the browser's start to the
    # end of the session; Django would then refuse the (sync) ORM calls of fixtures and tests
    # ("SynchronousOnlyOperation"). Set only once a browser starts, and undone at the end.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def database_url_for(settings_dict: dict[str, Any]) -> str:
    """A DATABASE_URL (the form console.env parses) for Django's current `default` database —
    during tests that is the test database pytest-django created."""
    user = quote(settings_dict.get("USER") or "", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}@" if password else f"{user}@"
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    name = quote(settings_dict["NAME"], safe="")
    if host.startswith("/"):
        return f"postgresql://{auth}/{name}?host={quote(host, safe='/')}"
    return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{name}"


def _answers(url: str) -> bool:
    try:
        with urlopen(url, timeout=5) as response:  # noqa: S310  (our own server)
            return bool(response.status == 200)
    except (URLError, ConnectionError, OSError):
        return False


@pytest.fixture(scope="session")
def _asgi_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    from django.conf import settings
    from django.db import connection

    with django_db_blocker.unblock():
        database_url = database_url_for(connection.settings_dict)
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        "DEBUG": "1",
        "STATUS_PROBE_INTERVAL_S": "1",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # Per port: concurrent test runs share test-artifacts/.
    log_path = ARTIFACTS_DIR / f"asgi-server-{port}.log"
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--ws", "websockets-sansio", "--lifespan", "off",
             "--no-access-log"],
            cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while True:
                if server.poll() is not None:
                    pytest.fail(f"uvicorn exited ({server.returncode}): {log_path.read_text()}")
                if _answers(f"{url}/accounts/login/"):
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"uvicorn did not answer in time: {log_path.read_text()}")
                time.sleep(0.2)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


@pytest.fixture
def live_server_url(_asgi_server: str, transactional_db: None) -> str:
    return _asgi_server


@pytest.fixture(scope="package")
def browser(_allow_orm_beside_playwright: None) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/bootstrap.sh (apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, live_server_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=live_server_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(UI_TIMEOUT_MS)
    new_page = context.new_page()
    try:
        yield new_page
    finally:
        context.close()


def login(page: Any, user: Any, password: str | None = None) -> None:
    """Log in through the login form as `user` (password defaults to the factories' one)."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(password or password_for(user.get_username()))
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def model_version(people: Any, tmp_path: Path) -> Any:
    """A model registered by the owner from an empty directory (the run pages only name it)."""
    (tmp_path / "config.json").write_text("{}")
    return services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )


def run_of(people: Any, version: Any, name: str, state: str) -> Run:
    """A run of the owner's team on `version`, in `state`, of 20 steps."""
    return Run.objects.create(
        team=people.team, created_by=people.owner, name=name, request={}, spec={},
        pins={"domains": []}, model_version=version, state=state, max_steps=20,
    )  # fmt: skip


def sink_on(run: Run, host: str) -> ConsoleSink:
    """The `ConsoleSink` of the run's first attempt, running on a new host named `host`."""
    where = Host.objects.create(name=host, cpu_slots=1)
    return ConsoleSink(attempt_create(run, where, state="running"))


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as test-artifacts/<name>.png."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    path = ARTIFACTS_DIR / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
