"""PythonZygote: Python evaluations without a fresh interpreter each time.

    from sandboxes import PythonZygote, SandboxSpec

    with PythonZygote(SandboxSpec(memory_mb=256, timeout_s=5)) as zygote:
        result = zygote.evaluate(
            "harness.py",
            files={"solution.py": candidate_code, "harness.py": call_side_harness},
        )
        result.stdout, result.exit_code  # an ExecResult, as from Sandbox.run

A zygote is one sandbox (bwrap namespaces, its own cgroup, tmpfs, seccomp, unprivileged uid)
whose pid 1 is a Python interpreter that imported ``preload`` once. Each ``evaluate`` empties
/work, /tmp and /dev/shm, writes ``files`` (paths relative to /work), and has the interpreter
fork a child that runs ``script`` as ``python3 -I script *args`` would (``sys.argv``,
``__main__``, exit status and traceback alike; the environment is the spec's), in a cgroup of
its own with the spec's memory limit, timeout, output cap and CPU/peak-memory figures. So an
evaluation costs its own work plus a fork instead of a new sandbox and a new interpreter.

Isolation between evaluations: one at a time per zygote; when one ends (exit, timeout, OOM)
every process it started is killed through its cgroup before the next begins; its files are
removed; SysV IPC objects it left are removed and POSIX message queues are refused; each child
is a forked copy, so an evaluation that corrupts its interpreter's memory or modules cannot
affect the next one. What they do share: the preloaded modules as they were imported, the
interpreter's string-hash seed (set iteration order repeats across evaluations; ``random``
is reseeded in each child), the namespaces themselves (so pid numbers go on counting: an
evaluation can tell how many processes the ones before it started, a narrow channel that a
fresh sandbox per sample does not have) and the machine's timing. Nothing secret belongs in
the zygote itself (its preload or spec files): it is shared by every evaluation. A judge may
be the evaluation, as long as its secrets reach it only at run time and after it has
separated from the untrusted code: `rewards` runs its judge as the forked child, which makes
itself non-dumpable, forks the candidate's process and only then reads its key and tests
from stdin; its closing ``kill(-1)`` spares the zygote (the pid namespace's init, pid 1).
Otherwise hand a zygote the candidate and a call-side harness only, and compare what it
prints on the host.
Run several zygotes for several cores (each evaluation is single-file, one core).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandboxes.errors import SandboxError
from sandboxes.result import ExecResult
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec

#: Modules most short programs and test harnesses import (typing alone costs milliseconds).
DEFAULT_PRELOAD = (
    "bisect",
    "collections",
    "copy",
    "dataclasses",
    "fractions",
    "functools",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "string",
    "typing",
)


class PythonZygote:
    """A pre-imported Python inside one sandbox that forks a child per :meth:`evaluate`."""

    def __init__(
        self,
        spec: SandboxSpec | Mapping[str, Any] | None = None,
        *,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        python: str = "/usr/bin/python3",
        zygote_memory_mb: int = 64,
    ):
        """``python``: the interpreter inside the sandbox (an image's, say ``/image/venv/bin/
        python``); it must be Python 3.9 or newer. ``preload``: modules imported once, up front.
        ``zygote_memory_mb``: the zygote's own memory limit (the interpreter and its preloaded
        modules), beside each evaluation's ``memory_mb``.
        """
        if isinstance(preload, str) or not all(
            isinstance(name, str) and name.replace(".", "").replace("_", "").isalnum()
            for name in preload
        ):
            raise SandboxError("preload must be a list of module names")
        self.preload = tuple(preload)
        if not isinstance(python, str) or not python.startswith("/"):
            raise SandboxError("python must be an absolute path inside the sandbox")
        self.python = python
        if not isinstance(zygote_memory_mb, int) or zygote_memory_mb < 16:
            raise SandboxError("zygote_memory_mb must be an integer >= 16")
        self.zygote_memory_mb = zygote_memory_mb
        self._sandbox = Sandbox(spec)
        self.spec = self._sandbox.spec
        if self.spec.driver != "bwrap":
            raise SandboxError("a zygote needs the bwrap driver")

    @property
    def name(self) -> str:
        return self._sandbox.name

    def open(self) -> PythonZygote:
        from sandboxes.bwrap import BwrapDriver

        def configure(driver: object) -> None:
            # Before the driver starts: its first run is the supervisor, so it takes storage
            # made ahead without a bwrap started ahead (that would be given up at once), and
            # the spares it leaves for the next zygote of its spec are made the same way.
            assert isinstance(driver, BwrapDriver)
            driver.supervisor_mode = "python"
            driver.supervisor_preload = self.preload
            driver.supervisor_python = self.python
            driver.supervisor_memory_mb = self.zygote_memory_mb

        self._sandbox._configure_driver = configure
        self._sandbox.open()
        try:
            driver = self._sandbox._require()
            assert isinstance(driver, BwrapDriver)
            driver.start_supervisor_now()
        except BaseException:
            self._sandbox.close()
            raise
        return self

    def close(self) -> None:
        self._sandbox.close()

    def __enter__(self) -> PythonZygote:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def kill(self) -> None:
        """Kills the evaluation in progress (from any thread); the zygote stays usable."""
        self._sandbox.kill()

    def evaluate(
        self,
        script: str,
        *args: str,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Runs ``python3 -I script *args`` in a fresh /work holding the spec's and ``files``."""
        from sandboxes.bwrap import BwrapDriver

        argv = [script, *args]
        if not all(isinstance(a, str) and a and "\x00" not in a for a in argv):
            raise SandboxError("script and args must be non-empty strings without NUL")
        limit = self.spec.timeout_s if timeout is None else timeout
        if not 0 < limit <= 86400:
            raise SandboxError("timeout must be > 0 and <= 86400 seconds")
        if env is not None:
            SandboxSpec(env=env)  # validates names and values
        every_file: dict[str, str | bytes] = {}
        for path, content in {**self.spec.files, **(files or {})}.items():
            if not isinstance(content, str | bytes):
                raise SandboxError(f"{path!r}: content must be str or bytes")
            every_file[self._sandbox._absolute(path)] = content
        driver = self._sandbox._require()
        assert isinstance(driver, BwrapDriver)
        return driver.evaluate(argv, files=every_file, stdin=stdin, timeout=float(limit), env=env)
