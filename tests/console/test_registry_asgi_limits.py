"""The ASGI body guard in front of Django: an oversized task set is refused before Django spools
it to disk, with a clear 413, and ordinary requests pass through untouched."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application

from console.registry.asgi_limits import RequestBodyLimit


def http_scope(path: str, method: str = "POST", length: int | None = None) -> dict[str, Any]:
    headers = [(b"host", b"testserver"), (b"content-type", b"application/jsonl")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80),
    }  # fmt: skip


def exchange(app: Any, scope: dict[str, Any], chunks: list[bytes]) -> tuple[int, bytes]:
    # Its own thread and event loop: the browser tests' Playwright keeps a loop running in the
    # main thread for the whole session, and they may run first.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _exchange(app, scope, chunks)).result(timeout=60)


async def _exchange(app: Any, scope: dict[str, Any], chunks: list[bytes]) -> tuple[int, bytes]:
    communicator = ApplicationCommunicator(app, scope)
    for position, chunk in enumerate(chunks):
        more = position < len(chunks) - 1
        await communicator.send_input({"type": "http.request", "body": chunk, "more_body": more})
    start = await communicator.receive_output(timeout=20)
    body = b""
    while True:
        message = await communicator.receive_output(timeout=20)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=20)
    return start["status"], body


class RecordingApp:
    """Stands in for Django only to prove the guard answered without calling it."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_a_declared_oversized_body_is_refused_before_the_app_runs() -> None:
    inner = RecordingApp()
    status, body = exchange(
        RequestBodyLimit(inner, max_bytes=1000),
        http_scope("/domains/1/upload/", length=5000),
        [b""],
    )
    assert status == 413 and not inner.called
    assert b"larger than the limit of 1,000 bytes" in body and b"nothing was stored" in body


def test_the_api_gets_its_413_as_json() -> None:
    status, body = exchange(
        RequestBodyLimit(RecordingApp(), max_bytes=1000),
        http_scope("/api/registry/domains/1/tasks", length=2_000_000_000),
        [b""],
    )
    assert status == 413 and body.startswith(b'{"detail": "The request body is larger')


@pytest.mark.django_db
def test_a_chunked_body_is_cut_off_once_it_passes_the_limit_in_front_of_django() -> None:
    app = RequestBodyLimit(get_asgi_application(), max_bytes=1000)
    status, body = exchange(app, http_scope("/api/registry/domains/1/tasks"), [b"x" * 600] * 3)
    assert status == 413 and b"nothing was stored" in body


@pytest.mark.django_db
def test_ordinary_requests_reach_django_unchanged() -> None:
    app = RequestBodyLimit(get_asgi_application(), max_bytes=1000)
    status, body = exchange(app, http_scope("/accounts/login/", method="GET", length=0), [b""])
    assert status == 200 and b"Log in" in body


@pytest.mark.django_db
def test_the_served_application_refuses_a_2_gb_task_set_before_django_reads_it() -> None:
    from console.asgi import application

    status, body = exchange(
        application, http_scope("/api/registry/domains/1/tasks", length=2 * 1024**3), [b""]
    )
    assert status == 413 and b"nothing was stored" in body
