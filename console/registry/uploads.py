"""An upload handler that stops a task-set upload as soon as it passes the size limit.

It runs before Django's own handlers, so an oversized file is never written to a temporary file
or parsed. (An ASGI server may still have buffered the raw request body; a reverse proxy's body
limit is the place to stop it before that.)
"""

from __future__ import annotations

from typing import Any

from django.core.files.uploadhandler import FileUploadHandler, StopUpload


class SizeLimitHandler(FileUploadHandler):
    def __init__(self, request: Any, max_bytes: int) -> None:
        super().__init__(request)
        self.max_bytes = max_bytes
        self.received = 0
        self.exceeded = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.max_bytes:
            self.exceeded = True
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None
