"""The status page against the real PostgreSQL, Redis, channel layer and a real Celery worker."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction

from console.asgi import application
from console.broadcast import broadcast_on_commit, team_group
from console.status.models import WorkerSighting
from console.status.prober import prober
from console.status.probes import ask_workers, collect_status
from tests.console.factories import ANONYMOUS, EVERYONE, UserFactory

WORKER_START_TIMEOUT_S = 90


def test_every_part_is_up_with_its_version(db):
    snapshot = async_to_sync(collect_status)()
    parts = {part.name: part for part in snapshot.components}
    assert set(parts) == {"PostgreSQL", "Redis", "Channel layer"}, parts
    assert all(part.up for part in parts.values()), parts
    assert parts["PostgreSQL"].version.split(".")[0].isdigit()
    assert parts["Redis"].version.count(".") == 2


def test_a_redis_that_does_not_answer_shows_down_with_the_reason(db, settings, tmp_path):
    settings.REDIS_URL = f"redis+socket://{tmp_path}/nothing-listens-here.sock"
    snapshot = async_to_sync(collect_status)()
    redis_row = next(part for part in snapshot.components if part.name == "Redis")
    assert not redis_row.up
    assert "No such file" in redis_row.detail or "Error" in redis_row.detail


@pytest.mark.parametrize("who", EVERYONE)
def test_the_status_page_needs_a_login(who, client_as, people):
    response = client_as(who).get("/status/")
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    else:
        assert response.status_code == 200
        assert 'data-part="PostgreSQL" data-up="true"' in response.content.decode()


def test_an_htmx_refresh_gets_only_the_table(owner_client):
    response = owner_client.get("/status/", headers={"HX-Request": "true"})
    content = response.content.decode()
    assert content.strip().startswith('<div id="components"')
    assert "<html" not in content


# --- a real Celery worker


def start_worker(node: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", f"control,host.{node}",
         "-n", node, "--pool", "solo", "--without-heartbeat", "--without-gossip",
         "--without-mingle", "-l", "WARNING"],
        env={**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL", "")},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


@pytest.mark.slow
def test_a_worker_shows_up_with_its_queues_and_then_down_when_it_stops(db):
    node = f"probe-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    worker = start_worker(node)
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while node not in ask_workers(timeout=1.0):
            assert worker.poll() is None, f"worker exited with {worker.returncode}"
            assert time.monotonic() < deadline, "worker did not answer in time"
        snapshot = async_to_sync(collect_status)()
        row = next(w for w in snapshot.workers if w.name == node)
        assert row.up
        assert row.queues == sorted(["control", f"host.{node}"])
        assert row.celery_version.startswith("5.")
    finally:
        stop_worker(worker)
    snapshot = async_to_sync(collect_status)()
    row = next(w for w in snapshot.workers if w.name == node)
    assert not row.up
    assert WorkerSighting.objects.get(name=node).last_seen_at == row.last_seen_at


# --- the websocket


def session_headers(client) -> list[tuple[bytes, bytes]]:
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [
        (b"host", b"testserver"),
        (b"origin", b"http://testserver"),
        (b"cookie", cookie.encode()),
    ]


async def _connect(headers):
    communicator = WebsocketCommunicator(application, "/ws/status/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    return communicator, connected


@pytest.mark.django_db(transaction=True)
def test_a_logged_in_browser_receives_live_snapshots(client, settings):
    settings.STATUS_PROBE_INTERVAL_S = 1
    client.force_login(UserFactory(username="watcher"))
    headers = session_headers(client)

    async def scenario():
        communicator, connected = await _connect(headers)
        assert connected
        try:
            first = await communicator.receive_json_from(timeout=15)
            second = await communicator.receive_json_from(timeout=15)
        finally:
            await communicator.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    # Nobody watches any more: the prober stopped probing.
    assert prober.subscribers == 0 and prober._task is None
    assert first["event"] == "status.snapshot"
    assert 'data-part="Channel layer" data-up="true"' in first["html"]
    # A second round came by itself: the page is live, not a one-off.
    assert second["event"] == "status.snapshot"


@pytest.mark.django_db(transaction=True)
def test_an_anonymous_websocket_is_refused():
    async def scenario():
        communicator, connected = await _connect(
            [(b"host", b"testserver"), (b"origin", b"http://testserver")]
        )
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


@pytest.mark.django_db(transaction=True)
def test_a_websocket_from_a_foreign_origin_is_refused(client):
    client.force_login(UserFactory(username="watcher"))
    headers = [(b"origin", b"http://evil.example")] + session_headers(client)[1:]

    async def scenario():
        communicator, connected = await _connect(headers)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


# --- the broadcast module


@pytest.mark.django_db(transaction=True)
def test_broadcast_on_commit_sends_after_the_commit_and_never_on_rollback():
    layer = get_channel_layer()
    group = team_group(1, "tests")

    def write(*, fail: bool) -> None:
        with transaction.atomic():
            broadcast_on_commit(group, "thing.changed", {"id": 8 if fail else 7})
            if fail:
                raise RuntimeError("the write fails after announcing itself")

    async def receive(channel, timeout):
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout)
        except TimeoutError:
            return None

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        await sync_to_async(write)(fail=False)
        committed = await receive(channel, 5)
        with pytest.raises(RuntimeError):
            await sync_to_async(write)(fail=True)
        rolled_back = await receive(channel, 1)
        return committed, rolled_back

    committed, rolled_back = async_to_sync(scenario)()
    assert committed == {"type": "broadcast.event", "event": "thing.changed", "payload": {"id": 7}}
    assert rolled_back is None
