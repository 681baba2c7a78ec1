"""Helper processes for in-library work that might not stop: symbolic maths on hostile text.

SymPy can spend minutes (holding the GIL, so no thread can interrupt it) on an answer such
as ``9^{9^{9^{9}}}``. Such work runs in a small pool of long-lived worker processes
(``python -m rewards.workers``, so the caller's ``__main__`` is never re-imported); a call
that overruns its deadline kills its worker, which is replaced on the next call. Workers run
only this library's own functions, named by module and attribute; they are not a sandbox and
never run model-written code (that goes to `sandboxes`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

from rewards.rubric import DeadlineExceeded

# Address-space cap for a worker: SymPy on a hostile expression otherwise grows until the
# machine swaps.
WORKER_MEMORY_BYTES = 3 * 1024**3
_HEADER = struct.Struct("!I")


def _write_message(stream: IO[bytes], payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the worker closed its pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_message(stream: IO[bytes]) -> Any:
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    # Only our own worker writes to this pipe, and it runs only our own functions.
    return pickle.loads(_read_exact(stream, size))  # noqa: S301


def _serve() -> None:
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    # Whatever the functions print goes to stderr, never into the reply pipe.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for module_name in sys.argv[1:]:
        importlib.import_module(module_name)
    _write_message(replies, "ready")
    while True:
        try:
            module_name, attribute, args = _read_message(requests)
        except EOFError:
            return
        try:
            function = getattr(importlib.import_module(module_name), attribute)
            reply: tuple[bool, Any] = (True, function(*args))
        except MemoryError:
            reply = (False, "ran out of memory")
        except Exception as exc:
            reply = (False, f"{type(exc).__name__}: {exc}")
        _write_message(replies, reply)


# Imported by each worker before it takes calls, so start-up never eats a call's deadline.
PRELOAD = ("math_verify", "rewards.criteria.maths")
START_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rewards.workers", *PRELOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests: Any = self.process.stdin
        self.replies: Any = self.process.stdout
        readable, _, _ = select.select([self.replies], [], [], START_TIMEOUT_S)
        if not readable or _read_message(self.replies) != "ready":
            self.kill()
            raise WorkerError("a worker process did not start")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                stream.close()


class WorkerError(Exception):
    """The function raised inside the worker, or the worker died; the message says which."""


class WorkerPool:
    """At most ``size`` worker processes; `call` waits while all are busy."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size or max(1, os.cpu_count() or 1)
        self._idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(self.size):
            self._idle.put(None)  # a free slot; its worker starts on first use
        self._lock = threading.Lock()
        self._all: list[_Worker] = []

    def call(self, module: str, attribute: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """``module.attribute(*args)`` in a worker, within ``timeout_s`` of the call starting
        to run (start-up of a fresh worker, which imports SymPy, is not counted)."""
        worker = self._idle.get()
        try:
            if worker is None or not worker.alive():
                if worker is not None:
                    self._discard(worker)
                    worker = None
                try:
                    worker = self._start()
                except (EOFError, OSError) as exc:
                    raise WorkerError(f"a worker process did not start: {exc}") from exc
            try:
                _write_message(worker.requests, (module, attribute, args))
                deadline = time.monotonic() + timeout_s
                while True:
                    left = deadline - time.monotonic()
                    readable, _, _ = select.select([worker.replies], [], [], max(0.0, left))
                    if readable or left <= 0:
                        break
                if not readable:
                    self._discard(worker)
                    worker = None
                    raise DeadlineExceeded(f"timed out after {timeout_s:g}s")
                ok, value = _read_message(worker.replies)
            except (EOFError, OSError) as exc:
                if worker is not None:
                    self._discard(worker)
                worker = None
                raise WorkerError("the worker process died (out of memory?)") from exc
            if not ok:
                raise WorkerError(value)
            return value
        finally:
            self._idle.put(worker)

    def _start(self) -> _Worker:
        worker = _Worker()
        with self._lock:
            self._all.append(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.kill()


_shared: WorkerPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool (created on first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WorkerPool()
            atexit.register(_shared.close)
        return _shared


if __name__ == "__main__":
    _serve()
