"""The console's ASGI application with the live stream's server-side moments recorded, for
`bench_live.py --trace` (the bench's server imports this instead of `console.asgi`).

Each line of the file named by ``BENCH_LIVE_TRACE`` is JSON: ``{"ring": t}`` when a doorbell
reaches the server's pages (once per doorbell, not per page), and for each shared delta read
``{"task": t0, "read": t1, "done": t2, "encoded": t3, "sent": t4, "ids": [event ids]}``: the
read's task started (t0), its database work began in the thread for synchronous calls (t1) and
ended (t2), the JSON was encoded (t3), and the first page's frame was handed to the server
(t4). Wall-clock seconds, as the bench's clients and writers record theirs. Nothing of the
console is changed: its functions are wrapped here."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from channels.db import database_sync_to_async

from console.asgi import application  # noqa: F401  (what uvicorn serves)
from console.runs import consumers, live

_file = open(os.environ["BENCH_LIVE_TRACE"], "a", buffering=1)  # noqa: SIM115
_lock = threading.Lock()
_moments: dict[int, dict[str, Any]] = {}  # a read's, by its encoded text (shared by pages)
_last_ring = 0.0


def _write(record: dict[str, Any]) -> None:
    with _lock:
        _file.write(json.dumps(record) + "\n")


def _timed_delta(run_id: int, since: Any) -> dict[str, Any]:
    started = time.time()
    message = live.delta(run_id, since)
    message["_trace"] = (started, time.time())
    return message


async def _traced_read(run_id: int, cursors: Any) -> tuple[dict[str, Any], str]:
    """`consumers._read_delta`, the same two steps, timed."""
    task = time.time()
    message = await database_sync_to_async(_timed_delta)(run_id, cursors)
    read, done = message.pop("_trace")
    text = json.dumps(message)[:-1]
    _moments[id(text)] = {"task": task, "read": read, "done": done, "encoded": time.time(),
                          "ids": [e["id"] for e in message.get("events", [])]}  # fmt: skip
    return message, text


consumers._read_delta = _traced_read
_send = consumers.RunLiveConsumer._send


async def _traced_send(self: Any, message: dict[str, Any], text: str | None = None) -> None:
    await _send(self, message, text)
    moments = _moments.pop(id(text), None) if text is not None else None
    if moments is not None:  # the first page of this read; the others share it
        _write({**moments, "sent": time.time()})


consumers.RunLiveConsumer._send = _traced_send  # type: ignore[method-assign]
_ring = consumers.RunLiveConsumer._ring


def _traced_ring(self: Any) -> None:
    global _last_ring
    now = time.time()
    if now - _last_ring > 0.001:  # one doorbell rings every page at once
        _write({"ring": now})
    _last_ring = now
    _ring(self)


consumers.RunLiveConsumer._ring = _traced_ring  # type: ignore[method-assign]
