"""Health probes of the console's parts: PostgreSQL, Redis, the channel layer, Celery workers.

Each probe answers within a short timeout and turns failures into a "down" row with the reason;
a probe never raises, because the status page must render precisely when things are broken."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.status.models import WorkerSighting

WORKER_REPLY_TIMEOUT_S = 0.5
CHANNEL_LAYER_TIMEOUT_S = 2.0
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    up: bool
    version: str = ""
    detail: str = ""
    latency_ms: float | None = None


@dataclass(frozen=True)
class WorkerStatus:
    name: str
    up: bool
    queues: list[str]
    celery_version: str
    python_version: str
    last_seen_at: datetime | None


@dataclass(frozen=True)
class StatusSnapshot:
    components: list[ComponentStatus]
    workers: list[WorkerStatus]
    checked_at: datetime = field(default_factory=timezone.now)

    @property
    def all_up(self) -> bool:
        return all(c.up for c in self.components) and all(w.up for w in self.workers)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def probe_postgres() -> ComponentStatus:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            (version,) = cursor.fetchone()
    except Exception as error:
        # A broken connection (server restarted) must not be reused by the next round.
        connection.close()
        return ComponentStatus("PostgreSQL", False, detail=_describe(error))
    return ComponentStatus(
        "PostgreSQL", True, version=version.split()[0], detail=connection.settings_dict["NAME"],
        latency_ms=_elapsed_ms(started),
    )  # fmt: skip


def redis_client_url(url: str) -> str:
    """redis-py spells a Unix socket unix:///path; Celery's spelling is redis+socket:///path."""
    if url.startswith("redis+socket://"):
        return "unix://" + url.removeprefix("redis+socket://")
    return url


def probe_redis() -> ComponentStatus:
    import redis

    started = time.perf_counter()
    try:
        client = redis.Redis.from_url(
            redis_client_url(settings.REDIS_URL),
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
        try:
            info = client.info("server")
        finally:
            client.close()
    except Exception as error:
        return ComponentStatus("Redis", False, detail=_describe(error))
    return ComponentStatus(
        "Redis", True, version=str(info.get("redis_version", "")), detail="broker and channels",
        latency_ms=_elapsed_ms(started),
    )  # fmt: skip


async def probe_channel_layer() -> ComponentStatus:
    """Send a message to a fresh channel and receive it back."""
    name = "Channel layer"
    layer = get_channel_layer()
    if layer is None:
        return ComponentStatus(name, False, detail="CHANNEL_LAYERS is not configured")
    started = time.perf_counter()
    nonce = uuid.uuid4().hex
    try:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "status.probe", "nonce": nonce})
        received = await asyncio.wait_for(layer.receive(channel), CHANNEL_LAYER_TIMEOUT_S)
    except Exception as error:
        return ComponentStatus(name, False, detail=_describe(error) or "timed out")
    if received.get("nonce") != nonce:
        return ComponentStatus(name, False, detail="received someone else's message")
    return ComponentStatus(
        name, True, version=type(layer).__name__, detail="send → receive round trip",
        latency_ms=_elapsed_ms(started),
    )  # fmt: skip


def ask_workers(timeout: float = WORKER_REPLY_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """Every worker's answer to `console_info` within `timeout`: {node name: info}."""
    from console.celery import app

    replies = app.control.broadcast("console_info", reply=True, timeout=timeout)
    answers: dict[str, dict[str, Any]] = {}
    for reply in replies or []:
        for node, info in reply.items():
            answers[node] = info if isinstance(info, dict) else {}
    return answers


def record_workers(answers: dict[str, dict[str, Any]]) -> list[WorkerStatus]:
    """Store who answered; return every worker ever seen, up if it answered now."""
    now = timezone.now()
    for node, info in answers.items():
        WorkerSighting.objects.update_or_create(
            name=node,
            defaults={
                "queues": list(info.get("queues", [])),
                "celery_version": str(info.get("celery", ""))[:50],
                "python_version": str(info.get("python", ""))[:50],
                "last_seen_at": now,
            },
        )
    return [
        WorkerStatus(
            name=sighting.name,
            up=sighting.name in answers,
            queues=list(sighting.queues),
            celery_version=sighting.celery_version,
            python_version=sighting.python_version,
            last_seen_at=sighting.last_seen_at,
        )
        for sighting in WorkerSighting.objects.order_by("name")
    ]


def _record_workers_or_reconnect(answers: dict[str, dict[str, Any]]) -> list[WorkerStatus]:
    try:
        return record_workers(answers)
    except Exception:
        connection.close()
        raise


# The database work runs in the thread Django gives to sync code (thread_sensitive), whose
# connection persists between rounds; probe failures close it so the next round reconnects.
# (channels' database_sync_to_async would instead close the connection after every call.)
async def collect_status() -> StatusSnapshot:
    """Probe everything concurrently (the slowest probe bounds the time)."""
    postgres_probe = sync_to_async(probe_postgres)()
    redis_probe = asyncio.to_thread(probe_redis)
    layer_probe = probe_channel_layer()
    workers_probe = asyncio.to_thread(ask_workers)
    postgres, redis_status, layer, answers = await asyncio.gather(
        postgres_probe, redis_probe, layer_probe, workers_probe, return_exceptions=True
    )
    components = [
        postgres if isinstance(postgres, ComponentStatus) else
        ComponentStatus("PostgreSQL", False, detail=_describe(postgres)),  # type: ignore[arg-type]
        redis_status if isinstance(redis_status, ComponentStatus) else
        ComponentStatus("Redis", False, detail=_describe(redis_status)),  # type: ignore[arg-type]
        layer if isinstance(layer, ComponentStatus) else
        ComponentStatus("Channel layer", False, detail=_describe(layer)),  # type: ignore[arg-type]
    ]  # fmt: skip
    broker_error = None
    if isinstance(answers, BaseException):
        broker_error = _describe(answers)
        answers = {}
    try:
        workers = await sync_to_async(_record_workers_or_reconnect)(answers)
    except Exception as error:
        workers = []
        broker_error = broker_error or _describe(error)
    if broker_error:
        components.append(ComponentStatus("Celery control", False, detail=broker_error))
    return StatusSnapshot(components=components, workers=workers)
