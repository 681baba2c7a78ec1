"""Sandbox: one isolated environment for a multi-step episode (see the package docstring)."""

from __future__ import annotations

import atexit
import contextlib
import os
import posixpath
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sandboxes.errors import SandboxError, SandboxPathError
from sandboxes.result import ExecResult, OutputCallback
from sandboxes.snapshot import Snapshot
from sandboxes.spec import TMP_DIR, WORK_DIR, SandboxSpec


class Driver(Protocol):
    weakened: dict[str, str]
    image_digest: str | None

    def start(self) -> None: ...
    def close(self) -> None: ...
    def kill(self) -> None: ...
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
    ) -> ExecResult: ...
    def write_file(self, path: str, content: str | bytes) -> None: ...
    def read_file(self, path: str) -> bytes: ...
    def archive(self) -> bytes: ...
    def extract(self, archive: bytes) -> None: ...


_counter = 0
_counter_lock = threading.Lock()
_open_sandboxes: weakref.WeakSet[Sandbox] = weakref.WeakSet()


@atexit.register
def _close_forgotten_sandboxes() -> None:
    """A sandbox its caller never closed is still removed when the interpreter exits."""
    for sandbox in list(_open_sandboxes):
        with contextlib.suppress(Exception):
            sandbox.close()
    from sandboxes import reaper

    reaper.drain()  # what closing handed to the reaper thread, before the interpreter ends


def new_sandbox_name() -> str:
    """``sb-<owner pid>-<n>-<random>``: the pid lets a janitor reap a dead owner's leftovers."""
    global _counter
    with _counter_lock:
        _counter += 1
        n = _counter
    return f"sb-{os.getpid()}-{n}-{uuid.uuid4().hex[:8]}"


def make_driver(spec: SandboxSpec, name: str) -> Driver:
    if spec.driver == "bwrap":
        from sandboxes.bwrap import BwrapDriver
        from sandboxes.images import resolve_image

        built = resolve_image(spec.image) if spec.image is not None else None
        return BwrapDriver(
            spec,
            name,
            image_path=built.path if built else None,
            image_env=built.env if built else None,
            image_digest=built.digest if built else None,
        )
    from sandboxes.oci import OciDriver

    return OciDriver(spec, name)


class Sandbox:
    """``with Sandbox(spec) as sb: sb.run([...])`` — files and cwd persist across runs.

    Leaving the block (or ``close()``) kills every process of the sandbox and removes its
    cgroup and work directory (the removal on ``sandboxes.reaper``'s thread, once every process
    has its SIGKILL; ``reaper.drain()`` waits for it). ``weakened`` names the defences this
    sandbox runs without (only ever non-empty when the spec's ``allow_weaker`` permitted it).
    """

    def __init__(
        self, spec: SandboxSpec | Mapping[str, Any] | None = None, *, supervise: str | None = None
    ):
        """``supervise`` (bwrap only): when runs go through the sandbox's supervisor instead of
        a bwrap each: ``"after-first"`` (the default), ``"always"`` or ``"never"`` (quicker
        for a sandbox used for one or two runs on a busy machine; see the package docstring).
        ``SANDBOXES_SUPERVISE`` sets the default.
        """
        if supervise is not None and supervise not in ("after-first", "always", "never"):
            raise SandboxError("supervise must be 'after-first', 'always' or 'never'")
        self.supervise = supervise
        if spec is None:
            spec = SandboxSpec()
        elif not isinstance(spec, SandboxSpec):
            spec = SandboxSpec.from_dict(spec)
        self.spec = spec
        self.name = new_sandbox_name()
        self._cwd = WORK_DIR
        self._driver: Driver | None = None
        self._restore_archive: bytes | None = None
        self._restore_image_digest: str | None = None
        self._closed = False
        #: Applied to the driver before it starts (``PythonZygote``: a supervisor in python
        #: mode from the start, so no spare's bwrap is started ahead only to be given up).
        self._configure_driver: Callable[[Driver], None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> Sandbox:
        if self._closed:
            raise SandboxError("this sandbox was closed; create a new one")
        if self._driver is not None:
            return self
        from sandboxes.janitor import reap_once

        reap_once()
        driver = make_driver(self.spec, self.name)
        if self.supervise is not None and hasattr(driver, "supervise"):
            driver.supervise = self.supervise
        if self._configure_driver is not None:
            self._configure_driver(driver)
        driver.start()
        # A sandbox that took a spare's storage goes by the spare's name (sandboxes.spares).
        self.name = getattr(driver, "name", self.name)
        self._driver = driver
        _open_sandboxes.add(self)
        try:
            expected = self._restore_image_digest
            if expected is not None and driver.image_digest != expected:
                raise SandboxError(
                    f"the snapshot ran in image {expected}, this machine builds "
                    f"{driver.image_digest} from the same spec; restore with "
                    "Sandbox.restore(snapshot, allow_image_change=True) to resume anyway"
                )
            if self._restore_archive is not None:
                driver.extract(self._restore_archive)
            for path, content in self.spec.files.items():
                driver.write_file(path, content)
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def _around(cls, spec: SandboxSpec, name: str, driver: Driver) -> Sandbox:
        """A handle on a driver that is already started (a pool's recycled sandbox)."""
        sandbox = cls(spec)
        sandbox.name = name
        sandbox._driver = driver
        _open_sandboxes.add(sandbox)
        return sandbox

    def _disown(self) -> Driver | None:
        """Detaches the driver without closing it; this handle is closed from now on."""
        self._closed = True
        _open_sandboxes.discard(self)
        driver, self._driver = self._driver, None
        return driver

    def close(self) -> None:
        self._closed = True
        _open_sandboxes.discard(self)
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()

    def __enter__(self) -> Sandbox:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def kill(self) -> None:
        """Kills whatever the sandbox is running now (from any thread); it stays usable."""
        if self._driver is not None:
            self._driver.kill()

    @property
    def weakened(self) -> dict[str, str]:
        return dict(self._require().weakened)

    @property
    def image_digest(self) -> str | None:
        return self._require().image_digest

    def _require(self) -> Driver:
        if self._driver is None:
            raise SandboxError(
                "the sandbox is closed" if self._closed else "the sandbox is not open"
            )
        return self._driver

    # -- commands -----------------------------------------------------------------------------
    @property
    def cwd(self) -> str:
        """The working directory of the next run (persists; set it to move)."""
        return self._cwd

    @cwd.setter
    def cwd(self, path: str) -> None:
        self._cwd = _sandbox_dir(path, self._cwd)

    def run(
        self,
        argv: Sequence[str],
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Runs ``argv`` (a list; use ``["sh", "-c", ...]`` for a shell line) to completion.

        ``timeout`` defaults to the spec's ``timeout_s``; callbacks receive decoded text as
        it arrives. A non-zero exit, a timeout or an OOM kill are results, not exceptions.
        """
        if isinstance(argv, str | bytes) or not argv or not all(isinstance(a, str) for a in argv):
            raise SandboxError("argv must be a non-empty list of strings")
        if any("\x00" in a for a in argv):
            raise SandboxError("argv must not contain NUL bytes")
        limit = self.spec.timeout_s if timeout is None else timeout
        if not 0 < limit <= 86400:
            raise SandboxError("timeout must be > 0 and <= 86400 seconds")
        if env is not None:
            SandboxSpec(env=env)  # validates names and values
        return self._require().run(
            list(argv),
            stdin=stdin,
            timeout=float(limit),
            cwd=self._cwd if cwd is None else _sandbox_dir(cwd, self._cwd),
            env=env,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )

    # -- files --------------------------------------------------------------------------------
    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Writes files relative to /work (or absolute under /work, /tmp); dirs are created."""
        driver = self._require()
        for path, content in files.items():
            if not isinstance(content, str | bytes):
                raise SandboxError(f"{path!r}: content must be str or bytes")
            driver.write_file(self._absolute(path), content)

    def read_file(self, path: str) -> bytes:
        """Reads a regular file; symlinks are never followed (SandboxPathError)."""
        return self._require().read_file(self._absolute(path))

    def _absolute(self, path: str) -> str:
        if not isinstance(path, str):
            raise SandboxPathError(f"{path!r}: must be a string")
        return path if path.startswith("/") else posixpath.join(self._cwd, path)

    # -- snapshots ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Captures /work, the working directory and the spec (processes are not captured).

        Waits for a command running in another thread to finish first.
        """
        driver = self._require()
        return Snapshot(
            spec=self.spec.to_dict(),
            cwd=self._cwd,
            work_archive=driver.archive(),
            image_digest=driver.image_digest,
        )

    @classmethod
    def restore(
        cls, snapshot: Snapshot | str | os.PathLike[str], *, allow_image_change: bool = False
    ) -> Sandbox:
        """A new sandbox (open it with ``with``) whose /work and cwd are the snapshot's.

        Opening it refuses to resume in an image whose digest differs from the snapshot's
        (another machine's base system, say) unless ``allow_image_change``.
        """
        if not isinstance(snapshot, Snapshot):
            snapshot = Snapshot.load(os.fspath(snapshot))
        spec = SandboxSpec.from_dict({**snapshot.spec, "files": {}})
        sandbox = cls(spec)
        sandbox._restore_archive = snapshot.work_archive
        if not allow_image_change:
            sandbox._restore_image_digest = snapshot.image_digest
        sandbox._cwd = _sandbox_dir(snapshot.cwd, WORK_DIR)
        return sandbox


def _sandbox_dir(path: str, current: str) -> str:
    if not isinstance(path, str) or "\x00" in path:
        raise SandboxPathError(f"{path!r}: not a path")
    absolute = posixpath.normpath(posixpath.join(current, path))
    for top in (WORK_DIR, TMP_DIR):
        if absolute == top or absolute.startswith(top + "/"):
            return absolute
    raise SandboxPathError(
        f"{path!r}: the working directory must lie under {WORK_DIR} or {TMP_DIR}"
    )
