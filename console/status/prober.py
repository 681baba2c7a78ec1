"""Probes the console's parts periodically while anyone watches the status page.

One prober per web process and event loop; it runs only while at least one status websocket is
open, and broadcasts each snapshot, rendered as the page's table, to the status group through
console.broadcast. It lives in the web process rather than on a Celery worker on purpose: the
page must keep updating when the workers are the thing that is down."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings
from django.template.loader import render_to_string

from console.broadcast import STATUS_GROUP, abroadcast
from console.status.probes import StatusSnapshot, collect_status

logger = logging.getLogger(__name__)

STATUS_EVENT = "status.snapshot"


def render_snapshot(snapshot: StatusSnapshot) -> str:
    return render_to_string("status/page.html#components", {"snapshot": snapshot})


class StatusProber:
    def __init__(self) -> None:
        self.subscribers = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        return float(settings.STATUS_PROBE_INTERVAL_S)

    def subscribe(self) -> None:
        self.subscribers += 1
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="status-prober")

    def unsubscribe(self) -> None:
        self.subscribers = max(0, self.subscribers - 1)
        if self.subscribers == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                snapshot = await collect_status()
                await abroadcast(STATUS_GROUP, STATUS_EVENT, {"html": render_snapshot(snapshot)})
            except asyncio.CancelledError:
                raise
            except Exception:
                # The probes never raise; this is the broadcast itself failing (Redis down).
                # Keep going: the page shows the websocket as stale meanwhile.
                logger.exception("status probe round failed")
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        self.subscribers = 0
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


prober = StatusProber()
