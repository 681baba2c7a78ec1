"""One cgroup per sandbox, on cgroup v1 (a hierarchy per controller) or v2 (unified).

The cgroup is what makes the limits hold and what lets teardown find every process the
sandbox ever started, however it forked: memory (limit, peak, OOM count), pids (process
count), cpu (CFS quota), cpuacct/cpu.stat (CPU seconds) and the freezer or ``cgroup.kill`` (a
race-free kill of the whole group, fork bombs included).

The sandbox's processes join the cgroup *before* bwrap executes (the launcher that execs bwrap,
``sandboxes.bwrap.launcher``, writes ``0``, meaning itself, into each group's join file), so
nothing runs outside it even for an instant.
On v1 the join file is ``tasks``, not ``cgroup.procs``: a ``cgroup.procs`` write moves a whole
thread group and takes the kernel's threadgroup rwsem for writing, which may wait for an RCU
grace period (here: p50 0.04 ms, but up to 11.5 ms in 30 writes from a fresh fork, against
0.06 ms at most through ``tasks``); a ``tasks`` write moves one thread and skips that lock.
Every process that joins is single-threaded (the launcher, the supervisor), so its one
thread is the whole process. v2 has no ``tasks``.
Groups live under a ``sandboxes`` parent: ``<controller mount>/sandboxes/<name>`` (v1) or
``<cgroup2 mount>/sandboxes/<name>`` (v2, root) or, for a non-root user with a delegated
cgroup, ``<own cgroup>/sandboxes/<name>`` (the caller moves itself into ``<own>/supervisor``
first, because v2 forbids processes in a cgroup that distributes controllers).
``SANDBOXES_CGROUP_PARENT`` overrides the parent's name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandboxes.errors import SandboxError

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
_PERIOD_US = 100_000


def sandboxes_cpu_weight() -> float:
    """How many busy tasks all sandboxes together weigh against the host's other processes.

    The kernel schedules a cgroup as one entity: left at the default weight, every sandbox of
    the machine together would get the CPU share of a single process (measured here: under a
    load of 5 on 2 cores, a command took 1.7x its bare time in a sandbox, 0.9x at 8 tasks'
    weight). Default: one task per core. Each sandbox's own ``cpu`` quota still caps it.
    ``SANDBOXES_CPU_WEIGHT`` overrides (a number of tasks).
    """
    raw = os.environ.get("SANDBOXES_CPU_WEIGHT")
    if raw is None:
        return float(os.cpu_count() or 1)
    try:
        value = float(raw)
    except ValueError as exc:
        raise SandboxError(f"SANDBOXES_CPU_WEIGHT must be a number of tasks: {exc}") from exc
    if not 0 < value <= 10_000:
        raise SandboxError("SANDBOXES_CPU_WEIGHT must be > 0 and <= 10000")
    return value


def _weigh_parent(path: Path, one_task: int) -> None:
    low, high = (2, 262_144) if one_task == 1024 else (1, 10_000)
    weight = min(high, max(low, round(one_task * sandboxes_cpu_weight())))
    with contextlib.suppress(OSError):  # best effort: a delegated parent may not allow it
        _write(path, str(weight))


def _parent_name() -> str:
    return os.environ.get("SANDBOXES_CGROUP_PARENT", "sandboxes").strip("/") or "sandboxes"


def _read(path: Path) -> str:
    # Plain descriptors: Python's buffered text files cost ~4 us more per control file, and a
    # sandbox's life reads or writes some twenty of them.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _unescape_mount_path(path: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as octal.
    return (path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")).replace(
        "\\134", "\\"
    )


def cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    """Returns ({v1 controller: mount point}, cgroup2 mount point or None)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 4:
                continue
            mount_point, fstype, options = _unescape_mount_path(parts[1]), parts[2], parts[3]
            if fstype == "cgroup":
                for option in options.split(","):
                    if option in V1_CONTROLLERS and option not in v1:
                        v1[option] = Path(mount_point)
            elif fstype == "cgroup2" and v2 is None:
                v2 = Path(mount_point)
    return v1, v2


@dataclass
class RunMark:
    """One run's own memory cgroup and the sandbox counters read when it started.

    Each run gets a child memory cgroup limited to ``memory_mb``; the sandbox's group is
    limited to ``memory_mb + disk_mb``. Files in /work and /tmp live on a tmpfs whose pages
    are charged to the cgroup of the process that wrote them, so without the child a sandbox
    whose files filled ``memory_mb`` could never run anything again. With it, a run's
    processes (and what that run writes) stay within ``memory_mb``, files kept from earlier
    runs count only against the sandbox's total, and peak/OOM figures are the run's alone.
    """

    #: The files a single-threaded process writes ``0`` to, to join the run's groups (v1:
    #: ``tasks``, see the module's docstring; v2: ``cgroup.procs``).
    procs_paths: list[bytes]
    child: Path | None
    cpu_ns: int | None
    sandbox_oom_kills: int | None

    @property
    def child_procs_paths(self) -> list[bytes]:
        """Only the run's own group: for a process already in the sandbox's other groups (a
        supervisor's fork). Every write is a migration, so the ones that would change nothing
        are left out."""
        if self.child is None:
            return self.procs_paths
        own = os.fsencode(self.child)
        return [path for path in self.procs_paths if os.path.dirname(path) == own]


def _stat_value(path: Path, key: str) -> int | None:
    try:
        text = _read(path)
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def _subdirs(path: Path) -> list[Path]:
    """Child groups (directory entries; d_type, so no stat per control file)."""
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _rmdir_patiently(path: Path, deadline: float) -> None:
    delay = 0.0005
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise SandboxError(f"cannot remove cgroup {path}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.02)


class CgroupGroup:
    """A sandbox's cgroup (one directory per v1 hierarchy, or one v2 directory)."""

    version: int
    dirs: dict[str, Path]
    can_kill_atomically: bool

    def pids(self) -> set[int]:
        """Every process in the group, runs' child groups included."""
        # Processes join all hierarchies at once (before exec), so one hierarchy is enough.
        # Only the memory hierarchy (v1) and the unified one (v2) have per-run children.
        for controller in ("pids", "freezer", "memory", "unified"):
            if controller in self.dirs:
                path = self.dirs[controller]
                nested = controller in ("memory", "unified")
                return self._pids_in([path, *_subdirs(path)] if nested else [path])
        return set()

    @staticmethod
    def _pids_in(directories: list[Path]) -> set[int]:
        found: set[int] = set()
        for directory in directories:
            try:
                found.update(int(x) for x in _read(directory / "cgroup.procs").split())
            except FileNotFoundError:
                continue
        return found

    def set_limits(self, *, memory_mb: int | None, pids: int | None, cpu: float | None) -> None:
        raise NotImplementedError

    def begin_run(self, name: str, memory_mb: int) -> RunMark:
        raise NotImplementedError

    def limit_events(self) -> dict[str, int]:
        """Counters that move when the group hits a limit (pids, memory, OOM kills)."""
        raise NotImplementedError

    def children(self) -> list[Path]:
        """The group's child groups (runs' and a supervisor's; v1: in the memory hierarchy)."""
        for controller in ("memory", "unified"):
            if controller in self.dirs:
                return _subdirs(self.dirs[controller])
        return []

    def end_run(self, mark: RunMark) -> tuple[float | None, float | None, bool]:
        """After the run's processes are gone: (CPU s, peak MB, OOM-killed); removes its child."""
        raise NotImplementedError

    def _kill_atomically(self) -> None:
        raise NotImplementedError

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILLs every process in the group and waits until the group is empty."""
        if not self.pids():
            return
        deadline = time.monotonic() + timeout
        if self.can_kill_atomically:
            self._kill_atomically()
        delay = 0.0005
        while True:
            remaining = self.pids()
            if not remaining:
                return
            for pid in remaining:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise SandboxError(f"processes {sorted(remaining)} survived SIGKILL")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def kill_now(self) -> bool:
        """SIGKILLs every process in the group in one atomic step (frozen first, or through
        ``cgroup.kill``: none can fork meanwhile), without waiting for them to be gone.

        False, having done nothing, where the group cannot be killed atomically.
        """
        if not self.can_kill_atomically:
            return False
        if self.pids():
            self._kill_atomically()
        return True

    def kill_run(self, mark: RunMark, timeout: float = 10.0) -> None:
        """SIGKILLs every process of one run (its child group) and waits until none is left.

        The sandbox's other processes (its supervisor) live on. Without a child group of its
        own, the run cannot be told apart from them, and the whole group is killed.
        """
        if mark.child is None:
            self.kill_all(timeout)
            return
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            remaining = self._pids_in([mark.child])
            if not remaining:
                return
            if self.can_kill_atomically:
                self._kill_run_atomically(mark.child)
            else:
                for pid in remaining:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise SandboxError(f"processes {sorted(remaining)} survived SIGKILL")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _kill_run_atomically(self, child: Path) -> None:
        raise NotImplementedError

    def remove(self, timeout: float = 10.0) -> None:
        """Kills what is left, then removes the group's directories (children first)."""
        self.kill_all(timeout)
        deadline = time.monotonic() + timeout
        for path in self.dirs.values():
            for child in _subdirs(path):
                _rmdir_patiently(child, deadline)
            _rmdir_patiently(path, deadline)


class CgroupV1Group(CgroupGroup):
    version = 1

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs
        self.can_kill_atomically = "freezer" in dirs

    @staticmethod
    def _limit_memory(directory: Path, memory_mb: int) -> None:
        limit = str(memory_mb * 1024 * 1024)
        swap_limit = directory / "memory.memsw.limit_in_bytes"
        try:
            _write(directory / "memory.limit_in_bytes", limit)
        except OSError:
            if not swap_limit.exists():
                raise
            # Raising: memory may never exceed memory+swap, so that one goes up first.
            _write(swap_limit, limit)
            _write(directory / "memory.limit_in_bytes", limit)
        if swap_limit.exists():  # memory+swap equal to memory: no swapping out of the limit
            _write(swap_limit, limit)

    def set_limits(self, *, memory_mb: int | None, pids: int | None, cpu: float | None) -> None:
        if memory_mb is not None and "memory" in self.dirs:
            self._limit_memory(self.dirs["memory"], memory_mb)
        if pids is not None and "pids" in self.dirs:
            _write(self.dirs["pids"] / "pids.max", str(pids))
        if cpu is not None and "cpu" in self.dirs:
            _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(_PERIOD_US))
            _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpu * _PERIOD_US))))

    def _cpu_ns(self) -> int | None:
        if "cpuacct" not in self.dirs:
            return None
        return int(_read(self.dirs["cpuacct"] / "cpuacct.usage"))

    def begin_run(self, name: str, memory_mb: int) -> RunMark:
        child = None
        paths = []
        for controller, directory in self.dirs.items():
            if controller == "memory":
                child = directory / name
                child.mkdir()
                self._limit_memory(child, memory_mb)
                directory = child
            paths.append(os.fsencode(directory / "tasks"))
        sandbox_oom = None
        if "memory" in self.dirs:
            sandbox_oom = _stat_value(self.dirs["memory"] / "memory.oom_control", "oom_kill")
        return RunMark(paths, child, self._cpu_ns(), sandbox_oom)

    def limit_events(self) -> dict[str, int]:
        events: dict[str, int] = {}
        if "pids" in self.dirs:
            events["pids max"] = _stat_value(self.dirs["pids"] / "pids.events", "max") or 0
        if "memory" in self.dirs:
            memory = self.dirs["memory"]
            for name in ("memory.failcnt", "memory.memsw.failcnt"):
                with contextlib.suppress(FileNotFoundError, ValueError):
                    events[name] = int(_read(memory / name))
            events["oom_kill"] = _stat_value(memory / "memory.oom_control", "oom_kill") or 0
        return events

    def end_run(self, mark: RunMark) -> tuple[float | None, float | None, bool]:
        cpu_ns = self._cpu_ns()
        cpu_s = None if cpu_ns is None or mark.cpu_ns is None else (cpu_ns - mark.cpu_ns) / 1e9
        peak = None
        oom_killed = False
        if mark.child is not None:
            peak = int(_read(mark.child / "memory.max_usage_in_bytes")) / 2**20
            oom_killed = bool(_stat_value(mark.child / "memory.oom_control", "oom_kill"))
            _rmdir_patiently(mark.child, time.monotonic() + 10)
        if "memory" in self.dirs and mark.sandbox_oom_kills is not None:
            now = _stat_value(self.dirs["memory"] / "memory.oom_control", "oom_kill")
            oom_killed = oom_killed or (now is not None and now > mark.sandbox_oom_kills)
        return cpu_s, peak, oom_killed

    def _kill_atomically(self) -> None:
        self._kill_frozen(self.pids)

    def _kill_run_atomically(self, child: Path) -> None:
        # The freezer is the sandbox's (v1 has per-run groups only for memory): the supervisor
        # freezes too, for a moment, and only the run's processes are killed.
        self._kill_frozen(lambda: self._pids_in([child]))

    def _kill_frozen(self, victims: Callable[[], set[int]]) -> None:
        state = self.dirs["freezer"] / "freezer.state"
        _write(state, "FROZEN")
        deadline = time.monotonic() + 2.0
        # Frozen processes cannot fork; killing them all then thawing leaves nothing running.
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.0005)
        for pid in victims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _write(state, "THAWED")


class CgroupV2Group(CgroupGroup):
    version = 2

    def __init__(self, path: Path):
        self.path = path
        self.dirs = {"unified": path}
        self.can_kill_atomically = (path / "cgroup.kill").exists() or (
            path / "cgroup.freeze"
        ).exists()

    @staticmethod
    def _limit_memory(directory: Path, memory_mb: int) -> None:
        # A controller the manager found missing has no files here (and allow_weaker said so).
        if (directory / "memory.max").exists():
            _write(directory / "memory.max", str(memory_mb * 1024 * 1024))
            if (directory / "memory.swap.max").exists():
                _write(directory / "memory.swap.max", "0")

    def set_limits(self, *, memory_mb: int | None, pids: int | None, cpu: float | None) -> None:
        if memory_mb is not None:
            self._limit_memory(self.path, memory_mb)
        if pids is not None and (self.path / "pids.max").exists():
            _write(self.path / "pids.max", str(pids))
        if cpu is not None and (self.path / "cpu.max").exists():
            _write(self.path / "cpu.max", f"{max(1000, int(cpu * _PERIOD_US))} {_PERIOD_US}")
        if "memory" in _read(self.path / "cgroup.controllers").split():
            _write(self.path / "cgroup.subtree_control", "+memory")  # each run's own limit

    def begin_run(self, name: str, memory_mb: int) -> RunMark:
        child = self.path / name
        child.mkdir()
        self._limit_memory(child, memory_mb)
        sandbox_oom = _stat_value(self.path / "memory.events", "oom_kill")
        # A fresh child: its cpu.stat and memory.peak count this run only.
        return RunMark([os.fsencode(child / "cgroup.procs")], child, 0, sandbox_oom)

    def limit_events(self) -> dict[str, int]:
        events: dict[str, int] = {}
        pids = _stat_value(self.path / "pids.events", "max")
        if pids is not None:
            events["pids max"] = pids
        for key in ("max", "oom", "oom_kill"):
            value = _stat_value(self.path / "memory.events", key)
            if value is not None:
                events[f"memory {key}"] = value
        return events

    def end_run(self, mark: RunMark) -> tuple[float | None, float | None, bool]:
        assert mark.child is not None
        usage = _stat_value(mark.child / "cpu.stat", "usage_usec")
        cpu_s = None if usage is None else usage / 1e6
        peak = None
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            peak = int(_read(mark.child / "memory.peak").split()[0]) / 2**20
        oom_killed = bool(_stat_value(mark.child / "memory.events", "oom_kill"))
        now = _stat_value(self.path / "memory.events", "oom_kill")
        if now is not None and mark.sandbox_oom_kills is not None:
            oom_killed = oom_killed or now > mark.sandbox_oom_kills
        _rmdir_patiently(mark.child, time.monotonic() + 10)
        return cpu_s, peak, oom_killed

    def _kill_run_atomically(self, child: Path) -> None:
        if (child / "cgroup.kill").exists():
            _write(child / "cgroup.kill", "1")
            return
        _write(child / "cgroup.freeze", "1")
        deadline = time.monotonic() + 2.0
        while "frozen 1" not in _read(child / "cgroup.events") and time.monotonic() < deadline:
            time.sleep(0.0005)
        for pid in self._pids_in([child]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _write(child / "cgroup.freeze", "0")

    def _kill_atomically(self) -> None:
        if (self.path / "cgroup.kill").exists():
            _write(self.path / "cgroup.kill", "1")  # kills the whole subtree
            return
        _write(self.path / "cgroup.freeze", "1")
        deadline = time.monotonic() + 2.0
        while "frozen 1" not in _read(self.path / "cgroup.events") and (
            time.monotonic() < deadline
        ):
            time.sleep(0.0005)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _write(self.path / "cgroup.freeze", "0")


class CgroupManager:
    """Finds the cgroup hierarchy once and creates per-sandbox groups under ``sandboxes``.

    ``missing`` maps each defence this machine cannot give (see ``sandboxes.spec.DEFENCES``)
    to the reason, so a sandbox can refuse to start or run weaker when its spec allows it.
    """

    def __init__(self, version: int | None = None) -> None:
        """``version`` (or ``SANDBOXES_CGROUP_VERSION``) forces 1 or 2; default: v1 if mounted."""
        if version is None and os.environ.get("SANDBOXES_CGROUP_VERSION", "") in ("1", "2"):
            version = int(os.environ["SANDBOXES_CGROUP_VERSION"])
        self.version: int | None = None
        self.missing: dict[str, str] = {}
        self._v1_parents: dict[str, Path] = {}
        self._v2_parent: Path | None = None
        try:
            v1, v2 = cgroup_mounts()
        except OSError as exc:
            v1, v2 = {}, None
            self.missing.update(dict.fromkeys(_CGROUP_DEFENCES, f"cannot read mounts: {exc}"))
            return
        use_v1 = ("memory" in v1 or "pids" in v1) and version != 2
        if use_v1:
            self._setup_v1(v1)
        elif v2 is not None and (v2 / "cgroup.controllers").exists() and version != 1:
            self._setup_v2(v2)
        else:
            self.missing.update(dict.fromkeys(_CGROUP_DEFENCES, "no cgroup hierarchy mounted"))

    # -- v1 -----------------------------------------------------------------------------------
    def _setup_v1(self, mounts: dict[str, Path]) -> None:
        self.version = 1
        for controller in V1_CONTROLLERS:
            if controller not in mounts:
                continue
            parent = mounts[controller] / _parent_name()
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                self._v1_missing(controller, f"cannot create {parent}: {exc.strerror}")
                continue
            self._v1_parents[controller] = parent
            if controller == "cpu":
                _weigh_parent(parent / "cpu.shares", 1024)
        for controller in V1_CONTROLLERS:
            if controller not in mounts:
                self._v1_missing(controller, f"cgroup v1 controller {controller!r} not mounted")

    def _v1_missing(self, controller: str, why: str) -> None:
        defence = {
            "memory": "cgroup_memory",
            "pids": "cgroup_pids",
            "cpu": "cgroup_cpu",
            "freezer": "cgroup_kill",
        }.get(controller)
        if defence is not None:
            self.missing.setdefault(defence, why)

    # -- v2 -----------------------------------------------------------------------------------
    def _setup_v2(self, mount: Path) -> None:
        self.version = 2
        available = set(_read(mount / "cgroup.controllers").split())
        absent = [c for c in V2_CONTROLLERS if c not in available]
        for controller in absent:
            self.missing[f"cgroup_{controller}"] = (
                f"cgroup v2 controller {controller!r} is not available (bound to a v1 hierarchy?)"
            )
        wanted = " ".join(f"+{c}" for c in V2_CONTROLLERS if c in available)
        try:
            parent = self._v2_parent_under_root(mount, wanted)
        except OSError:
            try:
                parent = self._v2_parent_delegated(mount, wanted)
            except OSError as exc:
                self.missing.update(
                    dict.fromkeys(
                        _CGROUP_DEFENCES, f"no writable cgroup v2 subtree: {exc.strerror or exc}"
                    )
                )
                return
        self._v2_parent = parent
        if (parent / "cpu.weight").exists():
            _weigh_parent(parent / "cpu.weight", 100)
        if not (parent / "cgroup.kill").exists() and not (parent / "cgroup.freeze").exists():
            self.missing["cgroup_kill"] = "cgroup v2 without cgroup.kill or cgroup.freeze"

    @staticmethod
    def _v2_parent_under_root(mount: Path, wanted: str) -> Path:
        if wanted:
            _write(mount / "cgroup.subtree_control", wanted)
        parent = mount / _parent_name()
        parent.mkdir(exist_ok=True)
        if wanted:
            _write(parent / "cgroup.subtree_control", wanted)
        return parent

    @staticmethod
    def _v2_parent_delegated(mount: Path, wanted: str) -> Path:
        own = ""
        for line in _read(Path("/proc/self/cgroup")).splitlines():
            if line.startswith("0::"):
                own = line[3:].lstrip("/")
        base = mount / own
        supervisor = base / "supervisor"
        supervisor.mkdir(exist_ok=True)
        _write(supervisor / "cgroup.procs", str(os.getpid()))
        if wanted:
            _write(base / "cgroup.subtree_control", wanted)
        parent = base / _parent_name()
        parent.mkdir(exist_ok=True)
        if wanted:
            _write(parent / "cgroup.subtree_control", wanted)
        return parent

    # -- groups -------------------------------------------------------------------------------
    def create(self, name: str) -> CgroupGroup | None:
        """Creates the group ``name``; None when this machine has no usable cgroup at all."""
        if self.version == 1 and self._v1_parents:
            dirs: dict[str, Path] = {}
            try:
                for controller, parent in self._v1_parents.items():
                    path = parent / name
                    path.mkdir()
                    dirs[controller] = path
            except OSError as exc:
                CgroupV1Group(dirs).remove()
                raise SandboxError(f"cannot create cgroup {name}: {exc}") from exc
            return CgroupV1Group(dirs)
        if self.version == 2 and self._v2_parent is not None:
            path = self._v2_parent / name
            try:
                path.mkdir()
            except OSError as exc:
                raise SandboxError(f"cannot create cgroup {path}: {exc}") from exc
            return CgroupV2Group(path)
        return None

    def existing_groups(self) -> dict[str, CgroupGroup]:
        """Every group under the parent, by name (for reaping groups of dead owners)."""
        found: dict[str, CgroupGroup] = {}
        if self.version == 1:
            names: set[str] = set()
            for parent in self._v1_parents.values():
                names.update(p.name for p in parent.iterdir() if p.is_dir())
            for name in names:
                found[name] = CgroupV1Group(
                    {c: p / name for c, p in self._v1_parents.items() if (p / name).is_dir()}
                )
        elif self.version == 2 and self._v2_parent is not None:
            for path in self._v2_parent.iterdir():
                if path.is_dir():
                    found[path.name] = CgroupV2Group(path)
        return found


_CGROUP_DEFENCES = ("cgroup_memory", "cgroup_pids", "cgroup_cpu", "cgroup_kill")

_manager: CgroupManager | None = None


def manager() -> CgroupManager:
    """The process-wide manager (the hierarchy is probed once)."""
    global _manager
    if _manager is None:
        _manager = CgroupManager()
    return _manager
