"""SandboxPool: at most ``max_active`` sandboxes at once, first come first served.

Each ``acquire`` gets a fresh sandbox (never one another caller used: episodes must not see
each other's leftovers), unless the pool was made with ``recycle=True`` (below). With
``prewarm=n`` the pool keeps up to n sandboxes of ``prewarm_spec`` created in advance (cgroup,
tmpfs and limits ready), so an acquire only pays for the run. A caller that raises, is
interrupted, or (asyncio) is cancelled, releases its slot and its sandbox is killed and
removed; a waiter cancelled in the queue gives its turn on.

``SandboxPool(recycle=True)`` (opt-in) keeps released sandboxes and hands them to the next
``acquire`` of an equal spec after a reset, instead of paying a new set of namespaces each
time (most of the CPU of a short run). A recycled sandbox runs every command through its
supervisor, which starts before any user's code. On release: the user's handle is fenced off
(a stray thread of theirs can no longer reach the sandbox; a call of theirs still inside means
discard), every run's processes are already killed with its cgroup, and
``BwrapDriver.recycle`` checks that only bwrap and the supervisor are left, has the supervisor
remove SysV IPC and check its ipc and pid namespaces and its own inherited state, empties
/work, /tmp and /dev/shm and proves the tmpfs as empty as when made, and checks that no
cgroup limit was hit. A sandbox is closed instead when any step fails or raises, when a run
timed out, was killed, was OOM-killed or hit its output cap, when its user closed it, after
``max_uses`` users (64), or when it cannot be checked that way (another driver, a weaker
sandbox, ``network="loopback"``). POSIX message queues are refused in recycled sandboxes.
Shared between its users, as between a zygote's evaluations: the namespaces' counters (pid
numbers and tmpfs inode numbers go on counting, and pid 1's own CPU, context-switch and fault
counts in /proc/1/stat grow, so a user can tell roughly how much the ones before it did: a
narrow channel that needs both sides to cooperate, which fresh sandboxes do not have) and the
machine's timing. At most ``max_active`` reset
sandboxes wait idle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandboxes.errors import SandboxError
from sandboxes.result import ExecResult, OutputCallback
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec, default_max_active

if TYPE_CHECKING:
    from sandboxes.bwrap import BwrapDriver

#: Users per recycled sandbox before it is closed and a fresh one made.
DEFAULT_MAX_USES = 64


class _Ticket:
    __slots__ = ("event", "granted", "cancelled", "on_grant")

    def __init__(self, on_grant: Callable[[], None] | None = None):
        self.event = threading.Event()
        self.granted = False
        self.cancelled = False
        self.on_grant = on_grant


class _Lease:
    """One user's access to a recycled sandbox's driver, until the pool takes it back.

    Every call passes a fence: once revoked, nothing of this user reaches the driver (a stray
    thread's run or kill would otherwise land in the next user's sandbox).
    """

    def __init__(self, driver: BwrapDriver):
        self._driver = driver
        self.weakened = driver.weakened
        self.image_digest = driver.image_digest
        self._fence = threading.Lock()
        self._inside = 0
        self._revoked = False
        self.closed = False

    @contextlib.contextmanager
    def _call(self) -> Iterator[BwrapDriver]:
        with self._fence:
            if self._revoked:
                raise SandboxError("the sandbox is closed (given back to the pool)")
            self._inside += 1
        try:
            yield self._driver
        finally:
            with self._fence:
                self._inside -= 1

    def revoke(self) -> bool:
        """Fences the user off; True when none of its calls is still inside."""
        with self._fence:
            self._revoked = True
            return self._inside == 0

    def start(self) -> None:
        raise SandboxError("a pooled sandbox is already started")

    def close(self) -> None:
        """The user closed it early: it is removed, as a fresh one would be."""
        self.closed = True
        self.revoke()
        self._driver.close()

    def kill(self) -> None:
        with contextlib.suppress(SandboxError), self._call() as driver:
            driver.kill()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | bytes | None,
        timeout: float,
        cwd: str,
        env: Mapping[str, str] | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> ExecResult:
        with self._call() as driver:
            return driver.run(
                argv,
                stdin=stdin,
                timeout=timeout,
                cwd=cwd,
                env=env,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )

    def write_file(self, path: str, content: str | bytes) -> None:
        with self._call() as driver:
            driver.write_file(path, content)

    def read_file(self, path: str) -> bytes:
        with self._call() as driver:
            return driver.read_file(path)

    def archive(self) -> bytes:
        with self._call() as driver:
            return driver.archive()

    def extract(self, archive: bytes) -> None:
        with self._call() as driver:
            driver.extract(archive)


class _Pooled:
    """A sandbox the pool made: its own handle on it, and the driver when it is recyclable."""

    __slots__ = ("sandbox", "driver", "uses")

    def __init__(self, sandbox: Sandbox, driver: BwrapDriver | None):
        self.sandbox = sandbox
        self.driver = driver
        self.uses = 0

    @property
    def name(self) -> str:
        return self.sandbox.name


class SandboxPool:
    def __init__(
        self,
        max_active: int | None = None,
        prewarm: int = 0,
        prewarm_spec: SandboxSpec | Mapping[str, Any] | None = None,
        *,
        recycle: bool = False,
        max_uses: int = DEFAULT_MAX_USES,
    ):
        if max_active is None:
            max_active = default_max_active()
        if not isinstance(max_active, int) or max_active < 1:
            raise SandboxError("max_active must be an integer >= 1")
        if not isinstance(prewarm, int) or prewarm < 0:
            raise SandboxError("prewarm must be an integer >= 0")
        if not isinstance(max_uses, int) or max_uses < 1:
            raise SandboxError("max_uses must be an integer >= 1")
        self.max_active = max_active
        self.prewarm = prewarm
        self.recycle = bool(recycle)
        self.max_uses = max_uses
        if prewarm_spec is None:
            prewarm_spec = SandboxSpec()
        elif not isinstance(prewarm_spec, SandboxSpec):
            prewarm_spec = SandboxSpec.from_dict(prewarm_spec)
        self.prewarm_spec = prewarm_spec
        self._lock = threading.Lock()
        self._active = 0
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._warm: collections.deque[_Pooled] = collections.deque()
        self._idle: collections.deque[_Pooled] = collections.deque()  # reset, for reuse
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
    def _new(self, spec: SandboxSpec) -> _Pooled:
        if not self.recycle or spec.driver != "bwrap" or spec.network != "none":
            return _Pooled(Sandbox(spec).open(), None)
        from sandboxes.bwrap import BwrapDriver

        sandbox = Sandbox(spec, supervise="always").open()
        driver = sandbox._driver
        if not isinstance(driver, BwrapDriver) or driver.cannot_recycle() is not None:
            return _Pooled(sandbox, None)
        try:
            driver.make_recyclable()
        except BaseException:
            sandbox.close()
            raise
        return _Pooled(sandbox, driver)

    def _take(self, spec: SandboxSpec) -> _Pooled:
        if self.recycle:
            with self._lock:
                for entry in self._idle:
                    if entry.sandbox.spec == spec:
                        self._idle.remove(entry)
                        return entry
        if self.prewarm and spec == self.prewarm_spec:
            with self._lock:
                warm = self._warm.popleft() if self._warm else None
                self._warm_wanted.notify()
            if warm is not None:
                return warm
        return self._new(spec)

    def _keep_warm(self) -> None:
        while True:
            with self._lock:
                while not self._closed and len(self._warm) >= self.prewarm:
                    self._warm_wanted.wait()
                if self._closed:
                    return
            try:
                entry = self._new(self.prewarm_spec)
            except SandboxError:
                with self._lock:
                    self._warm_wanted.wait(1.0)
                continue
            with self._lock:
                if self._closed:
                    entry.sandbox.close()
                    return
                self._warm.append(entry)

    @staticmethod
    def _hand_out(entry: _Pooled) -> tuple[Sandbox, _Lease | None]:
        if entry.driver is None:
            return entry.sandbox, None
        lease = _Lease(entry.driver)
        return Sandbox._around(entry.sandbox.spec, entry.sandbox.name, lease), lease

    def _give_back(self, entry: _Pooled, handle: Sandbox, lease: _Lease | None) -> None:
        """Closes the sandbox, or (recycling) resets it for the next user; any doubt closes."""
        if lease is None:
            handle.close()
            return
        to_close: _Pooled | None = entry
        try:
            handle._disown()
            quiet = lease.revoke()
            if quiet and not lease.closed and self._reset(entry):
                with self._lock:
                    if not self._closed:
                        self._idle.append(entry)
                        to_close = None
                        if len(self._idle) > self.max_active:
                            to_close = self._idle.popleft()
        except BaseException:
            entry.sandbox.close()
            raise
        if to_close is not None:
            to_close.sandbox.close()

    def _reset(self, entry: _Pooled) -> bool:
        entry.uses += 1
        if entry.driver is None or entry.uses >= self.max_uses:
            return False
        try:
            entry.driver.recycle()
            for path, content in entry.sandbox.spec.files.items():
                entry.driver.write_file(path, content)
        except Exception:  # noqa: BLE001 - any doubt: the sandbox is closed, not reused
            return False
        return True

    @contextlib.contextmanager
    def acquire(self, spec: SandboxSpec | Mapping[str, Any] | None = None) -> Iterator[Sandbox]:
        """Waits for a slot (FIFO), yields an open sandbox, and always closes it (or, when
        recycling, resets it for the next user) after."""
        spec = _as_spec(spec)
        self._wait_slot()
        try:
            entry = self._take(spec)
            handle, lease = self._hand_out(entry)
            try:
                yield handle
            finally:
                self._give_back(entry, handle, lease)
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
        """One command in a fresh (or reset) sandbox: acquire, write ``files``, run, release."""
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
            entry = await asyncio.to_thread(self._take, spec)
            handle, lease = self._hand_out(entry)
            try:
                yield handle
            finally:
                # Close even when cancelled: shielded, so the slot is never returned while
                # the sandbox still has processes.
                await asyncio.shield(asyncio.to_thread(self._give_back, entry, handle, lease))
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
        """Stops pre-warming and removes idle sandboxes (busy ones close with their caller;
        recycled ones then too)."""
        with self._lock:
            self._closed = True
            idle = [*self._warm, *self._idle]
            self._warm.clear()
            self._idle.clear()
            self._warm_wanted.notify_all()
        if self._warmer is not None:
            self._warmer.join(timeout=30)
        for entry in idle:
            entry.sandbox.close()

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
