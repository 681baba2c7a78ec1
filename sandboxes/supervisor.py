"""The host side of a sandbox's supervisor (``sandboxes.inside``): start it, send runs, read exits.

One bwrap per open sandbox runs the supervisor as the sandbox's pid 1; each later command is a
fork (and, for ``exec`` mode, an exec) of it, inside the namespaces that already exist, instead
of a new bwrap with a new set of namespaces and mounts. The run's processes join the run's own
cgroup before anything else (the host opens that group's join file, v1 ``tasks`` or v2
``cgroup.procs``, and passes the descriptor; the kernel checks the opener's credentials), so
limits, counters and the kill of the whole process tree work as for a bwrap run. See
``sandboxes.inside`` for why the supervisor can sit next to hostile code.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from sandboxes.errors import SandboxError
from sandboxes.result import StreamCapture

#: Memory for the supervisor itself (its own cgroup, added to the sandbox's total), so neither
#: the run's limit nor the files' share pays for it. A zygote's preloaded modules live here too.
SUPERVISOR_MEMORY_MB = 64
SUPERVISOR_PYTHON = "/usr/bin/python3"
_READY_TIMEOUT_S = 30.0
_CHUNK = 65536


class SupervisorGone(SandboxError):
    """The supervisor was not there to take a request (nothing of the run started)."""


@lru_cache(maxsize=1)
def supervisor_source() -> str:
    return (Path(__file__).resolve().parent / "inside.py").read_text()


def supervisor_argv(
    mode: str, control_fd: int, preload: Sequence[str], python: str = SUPERVISOR_PYTHON
) -> list[str]:
    # -S (no site) only for exec mode: a zygote's programs expect what ``python3 -I`` gives.
    flags = ["-I", "-S"] if mode == "exec" else ["-I"]
    return [python, *flags, "-c", supervisor_source(), mode, str(control_fd), *preload]


class Supervisor:
    """A started supervisor: the bwrap process that holds it and the host's control socket."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket):
        self.proc = proc
        self.control = control
        self.alive = True

    def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        said = b""  # what bwrap or Python printed (a warning at import is no failure)
        with selectors.DefaultSelector() as selector:
            selector.register(self.control, selectors.EVENT_READ)
            selector.register(self.proc.stderr, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                    if key.fileobj is self.control:
                        if self.control.recv(64) == b"ready":
                            return
                        deadline = 0.0  # it closed the socket: it is gone
                    else:
                        chunk = os.read(key.fd, _CHUNK)
                        said = (said + chunk)[-4000:]
                        if not chunk:
                            selector.unregister(key.fileobj)
        self.alive = False
        self.proc.kill()
        self.proc.wait()
        detail = said.decode(errors="replace").strip()[-2000:]
        raise SandboxError(f"the sandbox supervisor did not start: {detail or 'no answer'}")

    def quiet(self) -> None:
        """Tells the supervisor that the host kills the run (it reports no signal on stderr)."""
        try:
            self.control.send(b"quiet")
        except OSError:
            self.alive = False

    def reset(self, timeout: float = 5.0) -> None:
        """Has the supervisor clear and check its namespaces (see ``inside.reset``).

        Raises SandboxError unless it answers ``clean`` in time; it is not trusted after that.
        """
        try:
            self.control.send(b"reset")
            readable, _, _ = select.select([self.control], [], [], timeout)
            answer = self.control.recv(4096) if readable else b""
        except OSError as exc:
            answer = str(exc).encode()
        if answer != b"clean":
            self.alive = False
            detail = answer.decode(errors="replace") or "no answer"
            raise SandboxError(f"the sandbox supervisor's reset failed: {detail}")

    def stop(self) -> None:
        """Closes the control socket (the supervisor exits, and the kernel ends its namespace)."""
        self.alive = False
        self.control.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        data: bytes | None,
        cgroup_procs: Sequence[bytes],
        own_cgroup_procs: Sequence[bytes],
        out: StreamCapture,
        err: StreamCapture,
        deadline: float,
        kill_run: Callable[[], None],
    ) -> tuple[int | None, bool]:
        """Runs one command to its end: (wait status or None if the supervisor died, timed out)."""
        payload = b"\0".join(
            [
                os.fsencode(cwd),
                str(len(cgroup_procs)).encode(),
                str(len(argv)).encode(),
                *(os.fsencode(a) for a in argv),
                *(os.fsencode(f"{k}={v}") for k, v in env.items()),
            ]
        )
        ours: list[int] = []
        theirs: list[int] = []
        try:
            theirs += [
                os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                for path in [*cgroup_procs, *own_cgroup_procs]
            ]
            if data:
                stdin_read, stdin_write = os.pipe()
                ours.append(stdin_write)
            else:
                stdin_read, stdin_write = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
            out_read, out_write = os.pipe()
            err_read, err_write = os.pipe()
            ours += [out_read, err_read]
            theirs = [stdin_read, out_write, err_write, *theirs]
            try:
                socket.send_fds(self.control, [payload], theirs)
            except OSError as exc:
                self.alive = False
                raise SupervisorGone(f"the sandbox supervisor is gone: {exc}") from exc
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return self._pump(stdin_write, out_read, err_read, data, out, err, deadline, kill_run)

    def _pump(
        self,
        stdin_write: int,
        out_read: int,
        err_read: int,
        data: bytes | None,
        out: StreamCapture,
        err: StreamCapture,
        deadline: float,
        kill_run: Callable[[], None],
    ) -> tuple[int | None, bool]:
        """Feeds stdin, drains both outputs, and ends the run when its first process exits."""
        status: int | None = None
        ended = False  # the supervisor reported the exit (or vanished)
        timed_out = False
        captures = {out_read: out, err_read: err}
        pending = memoryview(data) if data else None
        selector = selectors.DefaultSelector()
        try:
            selector.register(out_read, selectors.EVENT_READ)
            selector.register(err_read, selectors.EVENT_READ)
            selector.register(self.control, selectors.EVENT_READ)
            if pending is not None:
                os.set_blocking(stdin_write, False)
                selector.register(stdin_write, selectors.EVENT_WRITE)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if timed_out:
                        break  # killed 2 s ago and still not over: give up on it
                    timed_out = True
                    self.quiet()
                    kill_run()
                    deadline = time.monotonic() + 2.0
                    continue
                for key, _ in selector.select(remaining):
                    fd = key.fd
                    if key.fileobj is self.control:
                        message = self.control.recv(64)
                        selector.unregister(self.control)
                        ended = True
                        if message.startswith(b"exit "):
                            status = int(message[5:])
                        else:
                            self.alive = False
                        # Its first process is done: nothing else of the run may go on (a
                        # daemon holding stdout would otherwise keep the run open).
                        kill_run()
                    elif fd == stdin_write:
                        assert pending is not None
                        try:
                            written = os.write(stdin_write, pending[:_CHUNK])
                            pending = pending[written:]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(stdin_write)
                            os.close(stdin_write)
                            stdin_write = -1
                    else:
                        chunk = os.read(fd, _CHUNK)
                        if chunk:
                            captures[fd].feed(chunk)
                        else:
                            selector.unregister(fd)
        finally:
            selector.close()
            for fd in (stdin_write, out_read, err_read):
                if fd >= 0:
                    os.close(fd)
        if not ended:
            self.alive = False  # it never reported: do not trust it with another run
        return status, timed_out
