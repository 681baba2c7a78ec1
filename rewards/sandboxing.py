"""How code criteria get sandboxes: one pool per rubric, one sandbox per scored sample.

All code criteria of a rubric that score the same sample share that sample's sandbox (so a
sample pays for one sandbox, not one per criterion); each criterion works in its own fresh,
randomly named directory and runs Python with ``-I`` (no current directory or environment on
``sys.path``), and the sandbox kills every process at the end of each run, so what one
criterion's run leaves behind cannot steer the next. Samples never share such a sandbox.

Python-only runs (the judge of ``unit_tests``/``coverage``/``runtime_efficiency``, ``io_tests``
programs, ``compiles``, ``sandboxed_function``) go by default through a `PythonZygote`
(``sandbox.python_evaluations: "zygote"``): a few sandboxes per rubric, each holding a Python
that imported the common modules once and forks one child per run, which then runs the
script as ``python3 -I`` would. A run costs a fork instead of a new sandbox and a new
interpreter (several times the throughput). What one run can leave for the next is what it
could leave for a later run of the same sample on the fresh path, and less: the zygote
empties /work, /tmp and /dev/shm before each run, kills every process the run started
(through the run's own cgroup), removes its SysV IPC objects, and each run is a fresh fork of
a zygote that never ran sample code or saw a request (so a run that corrupts its interpreter
corrupts only its own copy). The judge is that forked child: it forks the candidate server
before reading its request (the record key comes from the host's ``secrets``, on stdin, after
the fork), and its end-of-run ``kill(-1)`` spares the zygote, which is the sandbox's pid 1.
What runs do share is documented on `PythonZygote`: the string-hash seed (set order; the
judge keys nothing on it), the pid counter (a run can tell how many processes earlier runs
started: a narrow channel that carries no test, expected value or key) and timing. Runs
there do not get ``-X utf8`` (the locale is C.UTF-8, so files and pipes are UTF-8 anyway).
Zygotes do serve many samples, one run at a time. ``"fresh_sandbox"`` keeps the former path:
a sandbox per sample, a new interpreter per run.
Tools that are not Python (ruff) always run in the sample's own sandbox. On the zygote path
that sandbox comes from a recycling pool (``SandboxPool(recycle=True)``): a released sandbox
is reset, proven empty and handed to a later sample instead of paying a new set of
namespaces (most of a short run's CPU). What a recycled sandbox shares between its users is
what a zygote already shares between samples (the pid counter, tmpfs inode numbers, pid 1's
own counters, timing), and nothing else: files, processes, IPC, limits and the supervisor's
state are reset and checked, and any doubt closes it (``sandboxes.pool``). On the
``"fresh_sandbox"`` path, which a rubric picks for a sandbox nobody used, the pool stays a
fresh one.

The tools the criteria run inside (coverage.py, ruff) come from a sandbox image built from
this environment's own installed copies: coverage's package directory is copied to
``/image/site`` and the ruff binary to ``/image/bin/ruff``. A rubric that names its own
``sandbox.image`` must provide both at those paths to use the coverage and static-analysis
criteria.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewards.types import CriterionError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandboxes import ExecResult, PythonZygote, Sandbox, SandboxPool, SandboxSpec

IMAGE_RUFF = "/image/bin/ruff"
TOOLS_IMAGE_NAME = "rewards-code-tools"
PYTHON_EVALUATIONS = ("zygote", "fresh_sandbox")


def _zygote_preload() -> tuple[str, ...]:
    """The sandbox's default preload plus what the judge and the criteria import."""
    from sandboxes.zygote import DEFAULT_PRELOAD

    judge = ("_blake2", "_ctypes", "_json", "inspect", "time", "traceback", "types", "unittest")
    return tuple(sorted(set(DEFAULT_PRELOAD) | set(judge)))


#: What the judge, the candidate server and short programs import, loaded once per zygote.
ZYGOTE_PRELOAD = _zygote_preload()


@functools.lru_cache(maxsize=1)
def tools_image() -> Any:
    """The image holding coverage.py and ruff, built (once, cached) from the host's copies."""
    import coverage
    from ruff.__main__ import find_ruff_bin

    from sandboxes import ImageSpec

    files: dict[str, str | bytes] = {}
    package = Path(coverage.__file__).resolve().parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[f"site/coverage/{path.relative_to(package)}"] = path.read_bytes()
    files["bin/ruff"] = Path(find_ruff_bin()).read_bytes()

    class _Image(ImageSpec):
        # The digest hashes every file (ruff is ~25 MB); the image never changes in-process,
        # so it is computed once instead of at every sandbox start.
        def digest(self) -> str:
            cached = self.__dict__.get("_digest")
            if cached is None:
                cached = super().digest()
                self.__dict__["_digest"] = cached
            return cached

    return _Image(
        name=TOOLS_IMAGE_NAME,
        # Compiled here, once: /image is read-only later, and compiling coverage's modules at
        # every run would cost half a second.
        setup="chmod 0755 bin/ruff && bin/ruff --version >/dev/null "
        "&& python3 -m compileall -q site",
        files=files,
        env={"PATH": "/image/bin:/usr/local/bin:/usr/bin:/bin"},
    )


class CodeSandboxes:
    """The sandbox spec and the bounded pool of one rubric's code criteria."""

    def __init__(self, settings: dict[str, Any], needs_tools: bool) -> None:
        self.settings = dict(settings)
        self.needs_tools = needs_tools
        self.max_active = int(settings.get("max_concurrency", os.cpu_count() or 1))
        self.python_evaluations = str(settings.get("python_evaluations", "zygote"))
        if self.python_evaluations not in PYTHON_EVALUATIONS:
            raise CriterionError(f"python_evaluations must be one of {PYTHON_EVALUATIONS}")
        self._pool: SandboxPool | None = None
        self._zygotes: ZygotePool | None = None
        self._spec: SandboxSpec | None = None
        self._lock = threading.Lock()

    @property
    def recycles(self) -> bool:
        """Whether samples' sandboxes are reset and reused (see the module's docstring)."""
        return self.python_evaluations == "zygote"

    def spec(self) -> SandboxSpec:
        with self._lock:
            if self._spec is None:
                self._spec = self._build_spec()
            return self._spec

    def _build_spec(self) -> SandboxSpec:
        from sandboxes import LIMITS as SANDBOX_LIMITS
        from sandboxes import SandboxSpec, SandboxSpecError

        # Every limit the rubric leaves out keeps SandboxSpec's default (sandboxes.spec.LIMITS).
        values: dict[str, Any] = {}
        for name, bounds in SANDBOX_LIMITS.items():
            if name in self.settings:
                value = self.settings[name]
                # JSON Schema counts 4.0 as an integer, so the rubric schema let it through.
                if bounds.whole and isinstance(value, float) and value.is_integer():
                    value = int(value)
                values[name] = value
        values["network"] = self.settings.get("network", "none")
        if "driver" in self.settings:
            values["driver"] = self.settings["driver"]
        if "allow_weaker" in self.settings:
            values["allow_weaker"] = self.settings["allow_weaker"]
        if "image" in self.settings:
            values["image"] = self.settings["image"]
        elif self.needs_tools:
            values["image"] = tools_image()
        try:
            return SandboxSpec(**values)
        except SandboxSpecError as exc:
            raise CriterionError(f"bad sandbox settings: {exc}") from exc

    def pool(self) -> SandboxPool:
        from sandboxes import SandboxPool

        prewarm = int(self.settings.get("prewarm", 0))
        spec = self.spec() if prewarm else None
        with self._lock:
            if self._pool is None:
                # Pre-warmed sandboxes (created ahead, in the background) only serve
                # acquires of the same spec, which is what every sample here asks for.
                self._pool = SandboxPool(
                    max_active=self.max_active,
                    prewarm=prewarm,
                    prewarm_spec=spec,
                    recycle=self.recycles,
                )
            return self._pool

    def zygotes(self) -> ZygotePool | None:
        """The rubric's zygotes, or None where Python runs take the fresh-sandbox path."""
        if self.python_evaluations != "zygote":
            return None
        spec = self.spec()
        if spec.driver != "bwrap":
            return None
        with self._lock:
            if self._zygotes is None:
                self._zygotes = ZygotePool(spec, self.max_active)
            return None if self._zygotes.unavailable else self._zygotes

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            zygotes, self._zygotes = self._zygotes, None
        if zygotes is not None:
            zygotes.close()
        if pool is not None:
            pool.close()


class ZygoteUnavailable(Exception):
    """No zygote could be opened: the run takes the fresh-sandbox path."""


class ZygotePool:
    """At most ``max_active`` zygotes of one spec, each lent to one run at a time.

    Opened when first needed and kept until `close`. One whose run failed in the sandbox
    layer (its supervisor gone, say) is closed rather than lent again. When a zygote cannot
    be opened at all (no delegated cgroup, which a zygote needs to tell runs apart and a
    fresh sandbox can do without), ``unavailable`` says why and the rubric's Python runs take
    the fresh-sandbox path from then on: slower, equally isolated.
    """

    def __init__(self, spec: SandboxSpec, max_active: int) -> None:
        self.spec = spec
        self.opened = 0
        self.unavailable: str | None = None
        self._slots = threading.BoundedSemaphore(max_active)
        self._idle: list[PythonZygote] = []
        self._lock = threading.Lock()
        self._closed = False
        # A rubric nobody closed (a script, a notebook, a test) must not keep live sandboxes
        # until the interpreter exits: the idle zygotes close when the pool is collected.
        weakref.finalize(self, _close_zygotes, self._idle)

    @contextlib.contextmanager
    def lend(self) -> Iterator[PythonZygote]:
        from sandboxes import PythonZygote, SandboxError

        with self._slots:
            with self._lock:
                if self._closed:
                    raise SandboxError("the rubric is closed")
                zygote = self._idle.pop() if self._idle else None
            if zygote is None:
                try:
                    zygote = PythonZygote(self.spec, preload=ZYGOTE_PRELOAD).open()
                except SandboxError as exc:
                    self.unavailable = str(exc)
                    raise ZygoteUnavailable(str(exc)) from exc
                with self._lock:
                    self.opened += 1
            usable = False
            try:
                yield zygote
                usable = True
            finally:
                with self._lock:
                    usable = usable and not self._closed
                    if usable:
                        self._idle.append(zygote)
                if not usable:
                    zygote.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()  # in place: the finalizer holds this list
        for zygote in idle:
            zygote.close()


def _close_zygotes(zygotes: list[PythonZygote]) -> None:
    idle = list(zygotes)
    zygotes.clear()
    for zygote in idle:
        with contextlib.suppress(Exception):
            zygote.close()


class ScoringState:
    """What the criteria of one rubric share while scoring one sample."""

    def __init__(self, sandboxes: CodeSandboxes | None) -> None:
        self.earlier: dict[str, float] = {}
        self._sandboxes = sandboxes
        self._stack: contextlib.ExitStack | None = None
        self._sandbox: Sandbox | None = None
        self._zygote: PythonZygote | None = None  # the one running this sample's code now
        # Only rubrics with sandboxed criteria need a lock (their criteria may overrun on
        # another thread); the others score on the hot path, where every microsecond counts.
        self._lock = threading.Lock() if sandboxes is not None else contextlib.nullcontext()

    def sandbox(self) -> Sandbox:
        """This sample's sandbox, created on first use (waits for a pool slot)."""
        with self._lock:
            if self._sandbox is None:
                if self._sandboxes is None:
                    raise CriterionError("this rubric has no sandbox settings")
                from sandboxes import SandboxError

                try:
                    pool = self._sandboxes.pool()
                    self._stack = contextlib.ExitStack()
                    self._sandbox = self._stack.enter_context(pool.acquire(self._sandboxes.spec()))
                except SandboxError as exc:
                    raise CriterionError(f"cannot start a sandbox: {exc}") from exc
            return self._sandbox

    def kill_running(self) -> None:
        """Stops whatever the sandbox runs now (a criterion overran its deadline)."""
        sandbox, zygote = self._sandbox, self._zygote
        for running in (sandbox, zygote):
            if running is not None:
                with contextlib.suppress(Exception):
                    running.kill()

    def run_python(
        self,
        script: str,
        args: list[str],
        files: dict[str, str | bytes],
        *,
        stdin: str | None = None,
        timeout: float,
        prefix: str,
        utf8_mode: bool = True,
    ) -> ExecResult:
        """Runs ``python3 -I script *args`` with ``files`` beside it, in a zygote's fresh
        fork or (``python_evaluations: "fresh_sandbox"``) a new interpreter in this sample's
        sandbox, in a fresh directory named after ``prefix`` (there with ``-X utf8`` unless
        ``utf8_mode`` is false)."""
        zygotes = self._sandboxes.zygotes() if self._sandboxes is not None else None
        if zygotes is not None:
            from sandboxes import SandboxError

            try:
                with zygotes.lend() as zygote:
                    self._zygote = zygote
                    try:
                        return zygote.evaluate(
                            script, *args, files=files, stdin=stdin, timeout=timeout
                        )
                    finally:
                        self._zygote = None
            except ZygoteUnavailable:
                pass  # nothing ran: the fresh-sandbox path below
            except SandboxError as exc:
                raise CriterionError(f"sandbox failure: {exc}") from exc
        flags = ["-X", "utf8"] if utf8_mode else []
        argv = ["python3", "-I", *flags, script, *args]
        return run_in(self.sandbox(), fresh_dir(prefix), files, argv, stdin=stdin,
                      timeout=timeout)  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._sandbox = None
            stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def fresh_dir(prefix: str) -> str:
    """A directory name under /work nobody can guess (earlier runs cannot plant files in it)."""
    return f"/work/{prefix}-{secrets.token_hex(8)}"


def run_in(
    sandbox: Sandbox,
    directory: str,
    files: dict[str, str] | dict[str, str | bytes],
    argv: list[str],
    *,
    stdin: str | None = None,
    timeout: float,
) -> ExecResult:
    """Writes ``files`` into ``directory`` and runs ``argv`` there."""
    from sandboxes import SandboxError

    try:
        sandbox.write_files({f"{directory}/{name}": text for name, text in files.items()})
        return sandbox.run(argv, stdin=stdin, timeout=timeout, cwd=directory)
    except SandboxError as exc:
        raise CriterionError(f"sandbox failure: {exc}") from exc


def tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]
