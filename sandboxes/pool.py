"""SandboxPool: at most ``max_active`` sandboxes at once, first come first served.

Each ``acquire`` gets a fresh sandbox (never one another caller used: episodes must not see
each other's leftovers). With ``prewarm=n`` the pool keeps up to n sandboxes of
``prewarm_spec`` created in advance (cgroup, tmpfs and limits ready), so an acquire only pays
for the run. A caller that raises, is interrupted, or (asyncio) is cancelled, releases its
slot and its sandbox is killed and removed; a waiter cancelled in the queue gives its turn on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from sandboxes.errors import SandboxError
from sandboxes.result import ExecResult
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec, default_max_active


class _Ticket:
    __slots__ = ("event", "granted", "cancelled", "on_grant")

    def __init__(self, on_grant: Callable[[], None] | None = None):
        self.event = threading.Event()
        self.granted = False
        self.cancelled = False
        self.on_grant = on_grant


class SandboxPool:
    def __init__(
        self,
        max_active: int | None = None,
        prewarm: int = 0,
        prewarm_spec: SandboxSpec | Mapping[str, Any] | None = None,
    ):
        if max_active is None:
            max_active = default_max_active()
        if not isinstance(max_active, int) or max_active < 1:
            raise SandboxError("max_active must be an integer >= 1")
        if not isinstance(prewarm, int) or prewarm < 0:
            raise SandboxError("prewarm must be an integer >= 0")
        self.max_active = max_active
        self.prewarm = prewarm
        if prewarm_spec is None:
            prewarm_spec = SandboxSpec()
        elif not isinstance(prewarm_spec, SandboxSpec):
            prewarm_spec = SandboxSpec.from_dict(prewarm_spec)
        self.prewarm_spec = prewarm_spec
        self._lock = threading.Lock()
        self._active = 0
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._warm: collections.deque[Sandbox] = collections.deque()
        self._warm_wanted = threading.Condition(self._lock)
        self._closed = False
        self._warmer: threading.Thread | None = None
        if prewarm:
            self._warmer = threading.Thread(target=self._keep_warm, name="sandbox-prewarm")
            self._warmer.daemon = True
            self._warmer.start()

    # -- slots --------------------------------------------------------------------------------
    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(1 for t in self._queue if not t.cancelled)

    def _enqueue(self, on_grant: Callable[[], None] | None = None) -> _Ticket:
        ticket = _Ticket(on_grant)
        with self._lock:
            if self._closed:
                raise SandboxError("the pool is closed")
            if self._active < self.max_active and not self._queue:
                self._active += 1
                ticket.granted = True
                ticket.event.set()
            else:
                self._queue.append(ticket)
        if ticket.granted and on_grant is not None:
            on_grant()
        return ticket

    def _release_slot(self) -> None:
        granted: _Ticket | None = None
        with self._lock:
            while self._queue:
                ticket = self._queue.popleft()
                if not ticket.cancelled:
                    ticket.granted = True
                    granted = ticket
                    break
            else:
                self._active -= 1
        if granted is not None:
            granted.event.set()
            if granted.on_grant is not None:
                granted.on_grant()

    def _cancel(self, ticket: _Ticket) -> None:
        with self._lock:
            if not ticket.granted:
                ticket.cancelled = True
                return
        self._release_slot()  # granted while we were giving up: hand the slot on

    def _wait_slot(self) -> None:
        ticket = self._enqueue()
        try:
            ticket.event.wait()
        except BaseException:
            self._cancel(ticket)
            raise

    # -- sandboxes ----------------------------------------------------------------------------
    def _take_sandbox(self, spec: SandboxSpec) -> Sandbox:
        if self.prewarm and spec == self.prewarm_spec:
            with self._lock:
                sandbox = self._warm.popleft() if self._warm else None
                self._warm_wanted.notify()
            if sandbox is not None:
                return sandbox
        return Sandbox(spec).open()

    def _keep_warm(self) -> None:
        while True:
            with self._lock:
                while not self._closed and len(self._warm) >= self.prewarm:
                    self._warm_wanted.wait()
                if self._closed:
                    return
            try:
                sandbox = Sandbox(self.prewarm_spec).open()
            except SandboxError:
                with self._lock:
                    self._warm_wanted.wait(1.0)
                continue
            with self._lock:
                if self._closed:
                    sandbox.close()
                    return
                self._warm.append(sandbox)

    @contextlib.contextmanager
    def acquire(self, spec: SandboxSpec | Mapping[str, Any] | None = None) -> Iterator[Sandbox]:
        """Waits for a slot (FIFO), yields an open sandbox, and always closes it after."""
        spec = _as_spec(spec)
        self._wait_slot()
        try:
            sandbox = self._take_sandbox(spec)
            try:
                yield sandbox
            finally:
                sandbox.close()
        finally:
            self._release_slot()

    def run(
        self,
        spec: SandboxSpec | Mapping[str, Any] | None,
        argv: Sequence[str],
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """One command in a fresh sandbox: acquire, write ``files``, run, close."""
        with self.acquire(spec) as sandbox:
            if files:
                sandbox.write_files(files)
            return sandbox.run(argv, stdin=stdin, timeout=timeout)

    # -- asyncio ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def acquire_async(
        self, spec: SandboxSpec | Mapping[str, Any] | None = None
    ) -> AsyncIterator[Sandbox]:
        """The asyncio form of :meth:`acquire`; waiting never blocks the event loop."""
        spec = _as_spec(spec)
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()

        def on_grant() -> None:
            def grant() -> None:
                if not granted.done():
                    granted.set_result(None)

            try:
                loop.call_soon_threadsafe(grant)
            except RuntimeError:  # the waiter's event loop is gone: pass the slot on
                self._cancel(ticket)

        ticket = self._enqueue(on_grant)
        try:
            await granted
        except BaseException:
            self._cancel(ticket)
            raise
        try:
            sandbox = await asyncio.to_thread(self._take_sandbox, spec)
            try:
                yield sandbox
            finally:
                # Close even when cancelled: shielded, so the slot is never returned while
                # the sandbox still has processes.
                await asyncio.shield(asyncio.to_thread(sandbox.close))
        finally:
            self._release_slot()

    async def run_async(
        self,
        spec: SandboxSpec | Mapping[str, Any] | None,
        argv: Sequence[str],
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Like :meth:`run`; cancelling it kills the command at once and frees the slot."""
        async with self.acquire_async(spec) as sandbox:
            if files:
                await asyncio.to_thread(sandbox.write_files, files)
            work = asyncio.ensure_future(
                asyncio.to_thread(sandbox.run, argv, stdin=stdin, timeout=timeout)
            )
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                sandbox.kill()
                with contextlib.suppress(BaseException):
                    await work
                raise

    # -- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stops pre-warming and removes idle sandboxes (busy ones close with their caller)."""
        with self._lock:
            self._closed = True
            warm = list(self._warm)
            self._warm.clear()
            self._warm_wanted.notify_all()
        if self._warmer is not None:
            self._warmer.join(timeout=30)
        for sandbox in warm:
            sandbox.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_spec(spec: SandboxSpec | Mapping[str, Any] | None) -> SandboxSpec:
    if spec is None:
        return SandboxSpec()
    if isinstance(spec, SandboxSpec):
        return spec
    return SandboxSpec.from_dict(spec)
