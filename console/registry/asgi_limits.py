"""An ASGI guard that refuses an oversized request body before anything reads it.

Django's ASGI handler spools every request body to a temporary file before a view runs, so a
view can only refuse a 2 GB task set after 2 GB have been written to disk. This guard sits in
front of Django: a request whose declared Content-Length is over the limit gets 413 at once,
and a body sent without a length (chunked) is cut off as soon as it passes the limit. The
largest legitimate body is a task set, so the limit is `TASKSET_MAX_UPLOAD_BYTES` plus room
for the multipart envelope.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# Loose on purpose: Django's handler and Channels' routers each type scope/receive/send differently.
ASGIApp = Callable[..., Awaitable[None]]

ENVELOPE_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    pass


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestBodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int | None = None) -> None:
        self.app = app
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        if self._max_bytes is not None:
            return self._max_bytes
        from django.conf import settings

        return int(settings.TASKSET_MAX_UPLOAD_BYTES) + ENVELOPE_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(scope, send, limit)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, send, limit)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, limit: int) -> None:
        text = (
            f"The request body is larger than the limit of {limit:,} bytes "
            "(TASKSET_MAX_UPLOAD_BYTES plus the form envelope); nothing was stored."
        )
        if scope.get("path", "").startswith("/api/"):
            body, content_type = json.dumps({"detail": text}).encode(), b"application/json"
        else:
            body, content_type = text.encode(), b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
