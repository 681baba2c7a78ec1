"""The podman/docker driver: the same spec and ExecResult, for registered OCI images.

Each run is ``<engine> run --rm``-like: a fresh container with ``--network none``, the
spec's memory (swap included), pids and CPU limits, a read-only root filesystem, no
capabilities, ``no-new-privileges``, the unprivileged user 65534, rlimits for core, open
files and file size, and the sandbox's host workspace bind-mounted at /work and /tmp so
files persist across runs just as with bwrap. The container is kept until its state (OOM,
exit code) is read, then removed; on timeout it is killed with ``<engine> kill``.
``SANDBOXES_OCI_ENGINE`` picks the engine (default: podman if it answers, else docker).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache

from sandboxes.errors import EngineUnavailableError, SandboxError, WeakerIsolationError
from sandboxes.result import ExecResult, OutputCallback, StreamCapture
from sandboxes.spec import TMP_DIR, WORK_DIR, SandboxSpec
from sandboxes.workspace import Workspace, sandboxes_root

CONTAINER_USER = "65534:65534"


@lru_cache(maxsize=4)
def engine_for(driver: str) -> str:
    """The engine binary for ``driver`` if its daemon/service answers; raises otherwise."""
    preferred = os.environ.get("SANDBOXES_OCI_ENGINE")
    candidates = [preferred] if preferred else [driver]
    reasons = []
    for name in candidates:
        path = shutil.which(name)
        if path is None:
            reasons.append(f"{name}: not installed")
            continue
        try:
            probe = subprocess.run(
                [path, "info", "--format", "{{json .}}"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{name}: {exc}")
            continue
        if probe.returncode == 0:
            return path
        reasons.append(f"{name}: {(probe.stderr or probe.stdout).strip()[-300:]}")
    raise EngineUnavailableError("no container engine answers: " + "; ".join(reasons))


def container_args(
    engine: str,
    spec: SandboxSpec,
    name: str,
    image: str,
    workspace: Workspace,
    cwd: str,
    env: Mapping[str, str],
    argv: Sequence[str],
    interactive: bool,
) -> list[str]:
    memory = f"{spec.memory_mb}m"
    args = [
        engine,
        "run",
        "--name",
        name,
        "--network",
        "none",
        "--memory",
        memory,
        "--memory-swap",
        memory,
        "--pids-limit",
        str(spec.pids),
        "--cpus",
        f"{spec.cpu:g}",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        CONTAINER_USER,
        "--ulimit",
        "core=0:0",
        "--ulimit",
        f"nofile={spec.open_files}:{spec.open_files}",
        "--ulimit",
        f"fsize={spec.disk_mb * 1024 * 1024}:{spec.disk_mb * 1024 * 1024}",
        "--volume",
        f"{workspace.work}:{WORK_DIR}:rw",
        "--volume",
        f"{workspace.tmp}:{TMP_DIR}:rw",
        "--workdir",
        cwd,
        "--hostname",
        "sandbox",
    ]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    if interactive:
        args.append("--interactive")
    args += ["--", image, *argv]
    return args


class OciDriver:
    def __init__(self, spec: SandboxSpec, name: str):
        if not isinstance(spec.image, str):
            raise SandboxError(
                f"the {spec.driver} driver runs an OCI image reference (a string), "
                f"not {type(spec.image).__name__}"
            )
        self.spec = spec
        self.name = name
        self.image: str = spec.image
        self.engine = ""
        self.image_digest: str | None = None
        self.weakened: dict[str, str] = {}
        uid = gid = 65534 if os.geteuid() == 0 else None
        self.workspace = Workspace(sandboxes_root(), name, spec.disk_mb, uid, gid)
        self._runs = 0
        self._current: str | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self.engine = engine_for(self.spec.driver)
        inspect = self._engine("image", "inspect", "--format", "{{.Id}}", self.image)
        if inspect.returncode != 0:
            raise SandboxError(f"image {self.image!r} is not available: {inspect.stderr.strip()}")
        self.image_digest = inspect.stdout.strip()
        missing = self.workspace.create()
        if missing is not None:
            if not self.spec.allows_weaker("disk_limit"):
                self.workspace.remove()
                raise WeakerIsolationError({"disk_limit": missing})
            self.weakened["disk_limit"] = missing
        if self.spec.network == "loopback":
            # --network none still has a private lo, which is exactly "loopback".
            pass

    def _engine(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.engine, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def close(self) -> None:
        self.kill()
        with self._lock:  # a run in another thread removes its container before returning
            self.workspace.remove()

    def kill(self) -> None:
        """Kills the running container (its state, OOM included, is read before removal)."""
        current = self._current
        if current is not None:
            self._engine("kill", current)

    def write_file(self, path: str, content: str | bytes) -> None:
        self.workspace.write_file(path, content)

    def read_file(self, path: str) -> bytes:
        return self.workspace.read_file(path, limit=self.spec.disk_mb * 1024 * 1024)

    def archive(self) -> bytes:
        with self._lock:  # between runs only (see BwrapDriver.archive)
            return self.workspace.archive()

    def extract(self, archive: bytes) -> None:
        self.workspace.extract(archive)

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
        with self._lock:
            self._runs += 1
            container = f"{self.name}-{self._runs}"
            merged = {"HOME": WORK_DIR, "TMPDIR": TMP_DIR, "LANG": "C.UTF-8", **self.spec.env}
            merged.update(env or {})
            data = stdin.encode() if isinstance(stdin, str) else stdin
            args = container_args(
                self.engine,
                self.spec,
                container,
                self.image,
                self.workspace,
                cwd,
                merged,
                argv,
                interactive=data is not None,
            )
            limit = self.spec.output_limit_bytes
            out, err = StreamCapture(limit, on_stdout), StreamCapture(limit, on_stderr)
            started = time.monotonic()
            self._current = container
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            timed_out = False
            try:
                from sandboxes.bwrap import pump_streams

                timed_out = pump_streams(proc, data, out, err, started + timeout, self.kill)
                proc.wait()
                state = self._state(container)
            finally:
                self._engine("rm", "--force", container)
                self._current = None
            out.finish()
            err.finish()
            raw_code = state.get("ExitCode", proc.returncode)
            code = raw_code if isinstance(raw_code, int) else proc.returncode
            oom = bool(state.get("OOMKilled"))
            sig = code - 128 if isinstance(code, int) and 128 < code <= 192 else None
            return ExecResult(
                stdout=out.text,
                stderr=err.text,
                exit_code=code,
                signal=sig,
                wall_s=time.monotonic() - started,
                cpu_s=None,
                peak_memory_mb=None,
                timed_out=timed_out,
                oom_killed=oom,
                truncated=out.truncated or err.truncated,
                image_digest=self.image_digest,
            )

    def _state(self, container: str) -> dict[str, object]:
        inspect = self._engine("inspect", "--format", "{{json .State}}", container)
        if inspect.returncode != 0:
            return {}
        try:
            state = json.loads(inspect.stdout)
        except ValueError:
            return {}
        return state if isinstance(state, dict) else {}
