"""The bubblewrap driver: namespaces from bwrap, limits from a cgroup, storage from a tmpfs.

A sandbox's first ``run`` is one bwrap invocation in the sandbox's long-lived cgroup and
workspace: when the command exits, the sandbox's pid-1 init (``INIT_SCRIPT``) exits and the
kernel kills the rest of the pid namespace; the cgroup is then checked empty (and killed
through the freezer/cgroup.kill if not). On timeout the whole cgroup is killed.

From the second run on (an episode's later tool steps), one bwrap holding a supervisor
(``sandboxes.supervisor``) stays up and each command is a posix_spawn inside its namespaces,
in a cgroup of the run's own; when the command's first process exits, or at the timeout,
everything left in that cgroup is killed, so no process outlives its run either way. Files
in /work, /tmp and /dev/shm persist across the runs of an episode on both paths.
``SANDBOXES_SUPERVISE`` = ``after-first`` (default), ``always`` or ``never`` picks the path.

A sandbox opened from a spare (``sandboxes.spares``) usually finds that first bwrap already
started, in its first run's cgroup, waiting for the command (``Prestarted``).
"""

from __future__ import annotations

import array
import contextlib
import functools
import hashlib
import json
import os
import resource
import selectors
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from sandboxes import seccomp, spares
from sandboxes.cgroups import CgroupGroup, CgroupManager, RunMark, manager
from sandboxes.errors import SandboxError, SandboxPathError, WeakerIsolationError
from sandboxes.result import ExecResult, OutputCallback, StreamCapture
from sandboxes.spec import TMP_DIR, WORK_DIR, SandboxSpec
from sandboxes.supervisor import (
    SUPERVISOR_MEMORY_MB,
    SUPERVISOR_PYTHON,
    Supervisor,
    SupervisorGone,
    supervisor_argv,
)
from sandboxes.workspace import Workspace, ensure_root, sandboxes_root

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
IMAGE_DIR = "/image"
#: /etc entries a program may need (dynamic loader, TLS roots, time zone, Python's config).
ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "python3",
    "python3.11",
)
BASE_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: The sandbox's pid 1 (bwrap runs with --as-pid-1). bwrap's own init reports the exit code and
#: lets bwrap exit before the init is reaped, leaving it a zombie for the host's pid 1 — which
#: may reap late or never, and meanwhile it still counts against the sandbox's pids limit.
#: This init (``launch.c --init`` where a C compiler built it, else this shell script, which
#: behaves the same) is waited for by bwrap and runs the command as a foreground subshell (one
#: fork; the subshell execs the program, never in pid 1; the shell could also run one of its
#: builtins, which the supervisor path never could). While it
#: waits it reaps every orphan (dash waits for any child), and it exits with the command's
#: status (128 + signal when killed). SIGINT and SIGQUIT are ignored, as for a non-interactive
#: shell's background job. A foreground job that dies of a signal always gets its note
#: ("Terminated", "Segmentation fault": not for SIGINT or SIGPIPE), as on the supervisor path;
#: a background job and ``wait`` got one only if it died while the shell was already waiting.
#: When the init exits, the kernel kills whatever is left in the pid namespace.
INIT_SCRIPT = "trap '' INT QUIT; (\"$@\")"
INIT_SHELL = "/bin/sh"
#: Where the sandbox sees ``sandbox-launch`` (``launch.c``), which is its init when built.
INIT_PATH = "/sandbox-init"
_CHUNK = 65536
SUPERVISE_MODES = ("after-first", "always", "never")
#: A request to the supervisor is one datagram; larger commands (a long ``python3 -c``, say)
#: take the bwrap path, whose limit is the kernel's for execve.
MAX_SUPERVISED_REQUEST = 96 * 1024


def _request_size(argv: Sequence[str], env: Mapping[str, str] | None) -> int:
    extra = sum(len(k) + len(v) + 2 for k, v in (env or {}).items())
    return sum(len(a.encode(errors="surrogateescape")) + 1 for a in argv) + extra + 4096


def supervise_mode() -> str:
    mode = os.environ.get("SANDBOXES_SUPERVISE", "after-first")
    if mode not in SUPERVISE_MODES:
        raise SandboxError(f"SANDBOXES_SUPERVISE must be one of {', '.join(SUPERVISE_MODES)}")
    return mode


def sandbox_ids() -> tuple[int | None, int | None]:
    """The uid/gid sandboxes run as: ``SANDBOXES_UID`` (default nobody) when we are root."""
    if os.geteuid() != 0:
        return None, None
    try:
        uid = int(os.environ.get("SANDBOXES_UID", "65534"))
        gid = int(os.environ.get("SANDBOXES_GID", str(uid)))
    except ValueError as exc:
        raise SandboxError(f"SANDBOXES_UID/SANDBOXES_GID must be numbers: {exc}") from exc
    return uid, gid


@lru_cache(maxsize=1)
def bwrap_path() -> str:
    path = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else "")
    if not path:
        raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    return path


@lru_cache(maxsize=1)
def bwrap_features() -> frozenset[str]:
    helptext = subprocess.run(
        [bwrap_path(), "--help"], capture_output=True, text=True, check=False
    ).stdout
    return frozenset(
        flag for flag in ("--disable-userns", "--size", "--json-status-fd") if flag in helptext
    )


def _etc_files(root: Path, uid: int, gid: int) -> Path:
    """Writes the sandbox's own passwd/group/hosts once (no host accounts leak in)."""
    etc = root / f"etc-{uid}-{gid}"
    if (etc / "hosts").exists():
        return etc
    staging = root / f".etc-{os.getpid()}-{threading.get_ident()}"
    staging.mkdir(mode=0o755, exist_ok=True)
    (staging / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:sandbox:{WORK_DIR}:/bin/sh\n"
    )
    (staging / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\n")
    (staging / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
    for child in staging.iterdir():
        os.chmod(child, 0o644)
    try:
        os.rename(staging, etc)
    except OSError:  # another process won the race: theirs is identical
        shutil.rmtree(staging, ignore_errors=True)
    return etc


def _etc_key() -> str:
    """Changes whenever an /etc entry the sandbox sees changes (mtimes, sizes, modes)."""
    digest = hashlib.sha256()
    for name in ETC_ENTRIES:
        top = f"/etc/{name}"
        try:
            info = os.lstat(top)
        except FileNotFoundError:
            digest.update(f"{name}:absent;".encode())
            continue
        digest.update(f"{name}:{info.st_mtime_ns}:{info.st_size}:{info.st_mode};".encode())
        if stat.S_ISDIR(info.st_mode):
            for dirpath, dirnames, filenames in os.walk(top):
                for entry in sorted(dirnames + filenames):
                    child = os.lstat(os.path.join(dirpath, entry))
                    digest.update(
                        f"{dirpath}/{entry}:{child.st_mtime_ns}:{child.st_size};".encode()
                    )
    return digest.hexdigest()[:16]


def _etc_tree(root: Path, uid: int, gid: int) -> Path:
    """One directory to bind as /etc: the entries programs need, copied, plus our own files.

    A single bind instead of one per entry saves bwrap about 1.5 ms of CPU per run. Private
    key directories (``ssl/private``) are never copied. The copy is keyed by the entries'
    mtimes, so an ``ldconfig`` or a CA update on the host shows up in the next sandbox.
    """
    etc_files = _etc_files(root, uid, gid)
    tree = root / f"etc-{uid}-{gid}-{_etc_key()}"
    if (tree / "passwd").exists():
        return tree
    staging = root / f".etc-tree-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    try:
        for name in ETC_ENTRIES:
            source = Path("/etc") / name
            target = staging / name
            if source.is_symlink():
                os.symlink(os.readlink(source), target)
            elif source.is_dir():
                shutil.copytree(
                    source, target, symlinks=True, ignore=shutil.ignore_patterns("private")
                )
            elif source.is_file():
                shutil.copy2(source, target)
        for name in ("passwd", "group", "hosts"):
            shutil.copy2(etc_files / name, staging / name)
        os.chmod(staging, 0o755)  # noqa: S103 - the sandbox uid reads its /etc
        try:
            os.rename(staging, tree)
        except OSError:  # another process made the same tree first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tree


_etc_cache: dict[tuple[Path, int, int], tuple[float, Path]] = {}
_ETC_RECHECK_S = 10.0


def _etc_bind_source(root: Path, uid: int, gid: int) -> Path | None:
    """The /etc tree to bind (rechecked against the host every 10 s); None if unbuildable."""
    key = (root, uid, gid)
    cached = _etc_cache.get(key)
    now = time.monotonic()
    if cached is not None and now - cached[0] < _ETC_RECHECK_S and cached[1].is_dir():
        return cached[1]
    try:
        tree = _etc_tree(root, uid, gid)
    except OSError:
        return None
    _etc_cache[key] = (now, tree)
    return tree


_base_cache: dict[tuple[Path, int, int], tuple[float, Path | None, list[str]]] = {}


def base_system_args(root: Path, uid: int, gid: int) -> list[str]:
    """Read-only /usr, the usual top-level links into it, and a minimal /etc.

    Rechecked against the host every ``_ETC_RECHECK_S`` like the /etc tree: the lstat of each
    top-level name (a negative lookup on the container's overlay root for the ones that do
    not exist) was ~0.1 ms of every sandbox's start.
    """
    key = (root, uid, gid)
    cached = _base_cache.get(key)
    now = time.monotonic()
    if (
        cached is not None
        and now - cached[0] < _ETC_RECHECK_S
        and (cached[1] is None or cached[1].is_dir())
    ):
        return list(cached[2])
    args = _base_system_args(root, uid, gid)
    tree = _etc_cache.get(key)
    _base_cache[key] = (now, tree[1] if tree is not None else None, args)
    return list(args)


def _base_system_args(root: Path, uid: int, gid: int) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in BASE_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    tree = _etc_bind_source(root, uid, gid)
    if tree is not None:
        return [*args, "--ro-bind", str(tree), "/etc"]
    # Fallback: bind each entry from the host's /etc.
    args += ["--dir", "/etc"]
    for name in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    etc = _etc_files(root, uid, gid)
    for name in ("passwd", "group", "hosts"):
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    return args


#: ``ulimit`` flags of dash (the init shell) and their units in bytes (``-c``, ``-f``: blocks).
_ULIMIT_FLAGS = {
    resource.RLIMIT_CORE: ("-c", 512),
    resource.RLIMIT_NOFILE: ("-n", 1),
    resource.RLIMIT_FSIZE: ("-f", 512),
}


@lru_cache(maxsize=1)
def setpriv_path() -> str | None:
    return shutil.which("setpriv")


LAUNCH_SOURCE = Path(__file__).with_name("launch.c")


def _trusted_binary(path: Path) -> bool:
    """Ours to exec as root: a regular file we own that nobody else can write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


#: A launcher built from another version of ``launch.c`` that no process has started using
#: for this long is removed (see ``remove_stale_launchers``).
STALE_LAUNCHER_S = 3600.0
LAUNCHER_PREFIX = "sandbox-launch-"
_STAGING_PREFIX = ".sandbox-launch-"


LAUNCHER_MODES = ("bwrap", "native", "shell")


def launcher_mode() -> str:
    """``SANDBOXES_LAUNCHER``: who sets a sandbox up.

    ``bwrap`` (default): ``sandbox-launch`` (cgroup join, limits, ids) execs bwrap, which makes
    the namespaces and mounts. ``native``: ``sandbox-launch --native`` carries out the same
    bwrap arguments itself (``launch.c``: same namespaces, mounts, flags, id maps, capability
    drop and seccomp filter, in bwrap's order), one static exec instead of bwrap's dynamically
    linked one; where the launcher cannot be built or executed (no C compiler, a ``noexec``
    root), the shell launch and bwrap, as for the default. ``shell``: ``/bin/sh`` and setpriv
    in place of the compiled launcher, then bwrap.
    """
    mode = os.environ.get("SANDBOXES_LAUNCHER", "bwrap") or "bwrap"
    if mode not in LAUNCHER_MODES:
        raise SandboxError(f"SANDBOXES_LAUNCHER must be one of {', '.join(LAUNCHER_MODES)}")
    return mode


def launch_binary(root: Path) -> str | None:
    """``sandbox-launch`` for this root (see ``_launch_binary``), or None for the shell launch."""
    if launcher_mode() == "shell":
        return None
    binary = _launch_binary(root)
    if binary is not None and not os.path.exists(binary):
        # Removed under us (by another version's clean-up, or by hand): build it again.
        _launch_binary.cache_clear()
        binary = _launch_binary(root)
    return binary


def _launcher_name(source: bytes) -> str:
    return f"{LAUNCHER_PREFIX}{hashlib.sha256(source).hexdigest()[:16]}"


def remove_stale_launchers(root: Path, keep: str | None = None) -> list[str]:
    """Removes what old launchers left in ``root``; returns the names removed.

    The binary's name is the hash of ``launch.c``, so one source gives one file that every
    process and session reuses; each change of the source adds one. A process touches its
    binary's mtime when it starts using it, so a binary of another version whose mtime is
    older than ``STALE_LAUNCHER_S`` has no user that started within that time; it goes, as do
    build staging files of dead builders. A process that still uses a removed binary builds it
    again (``launch_binary``), and a running launch or init keeps its open file.
    """
    from sandboxes.janitor import pid_alive

    if keep is None:
        with contextlib.suppress(OSError):
            keep = _launcher_name(LAUNCH_SOURCE.read_bytes())
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if name.startswith(_STAGING_PREFIX):
            owner = name[len(_STAGING_PREFIX) :].split("-")[0]
            stale = owner.isdigit() and not pid_alive(int(owner))
        elif name.startswith(LAUNCHER_PREFIX) and name != keep:
            try:
                stale = now - entry.stat(follow_symlinks=False).st_mtime > STALE_LAUNCHER_S
            except OSError:
                continue
        else:
            continue
        if stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(name)
    return removed


@lru_cache(maxsize=4)
def _launch_binary(root: Path) -> str | None:
    """``sandbox-launch`` (``launch.c``), compiled once per machine into the sandboxes root.

    The root is private to us (``ensure_root``: ours, mode 0711), so nobody else can swap the
    binary we exec as root. Keyed by the source's hash: a changed launcher builds anew, and
    old versions nobody started using for an hour are removed (``remove_stale_launchers``).
    None without a C compiler (or with ``SANDBOXES_LAUNCHER=shell``): the shell launch is used.
    """
    try:
        source = LAUNCH_SOURCE.read_bytes()
    except OSError:
        return None
    target = root / _launcher_name(source)
    if _trusted_binary(target):
        if not _runs(target):
            return None
        # Marks it as in use (see remove_stale_launchers); once per process, not per launch.
        with contextlib.suppress(OSError):
            os.utime(target)
        return str(target)
    remove_stale_launchers(root, keep=target.name)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    ensure_root(root)
    staging = root / f".sandbox-launch-{os.getpid()}-{threading.get_ident()}"
    try:
        # Static where the C library allows it: no dynamic loader at each launch.
        for flags in (["-static"], []):
            built = subprocess.run(
                [compiler, "-O2", *flags, "-o", str(staging), "-x", "c", "-"],
                input=source,
                capture_output=True,
                env=LAUNCH_ENV,
                check=False,
            )
            if built.returncode == 0:
                break
        else:
            return None
        os.chmod(staging, 0o755)  # noqa: S103 - the sandbox uid runs it as its init
        os.rename(staging, target)  # atomic: a racing build's identical file wins or loses
    except OSError:
        return None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
    return str(target) if _trusted_binary(target) and _runs(target) else None


def _runs(binary: Path) -> bool:
    """Whether the binary can be executed from where it lies (a ``noexec`` root cannot), which
    holds inside the sandbox too: its init is a bind of the same file, with the same flags."""
    try:
        probe = subprocess.run(
            [str(binary), "--", "/bin/true"], env=LAUNCH_ENV, capture_output=True, check=False
        )
    except OSError:
        return False
    return probe.returncode == 0


def launcher(
    procs_paths: list[bytes],
    rlimits: list[tuple[int, int]],
    uid: int | None,
    gid: int | None,
    native: bool = False,
) -> list[str] | None:
    """The argv prefix that starts bwrap inside the run's cgroup, limits and ids, or None.

    ``sandbox-launch --join tasks... --rlimit ... --ids UID GID -- bwrap ...`` (``launch.c``):
    it joins every group (as root, before any drop), sets the limits (soft = hard), drops to
    the sandbox's uid/gid with no supplementary groups and execs bwrap. Nothing of bwrap, and
    so nothing of the sandbox, runs outside the cgroup or with our ids or limits, exactly as
    with a ``preexec_fn``; but a Python ``preexec_fn`` makes subprocess fork the whole host
    process (page tables and copy-on-write faults in proportion to its size, and the child then
    runs Python), where without one it uses vfork and the cost is one small static exec. Any
    step that fails stops the launch before bwrap starts (its error goes to the run's stderr).

    Without a C compiler the same steps run as ``/bin/sh -c 'echo 0 >tasks ...; ulimit ...;
    exec "$@"' sh [setpriv ...] bwrap ...``: two dynamically linked execs, ~0.6 ms more per
    launch here. None when a limit has no ``ulimit`` form or setpriv is missing (the caller
    falls back to a ``preexec_fn``).

    With ``native`` (``SANDBOXES_LAUNCHER=native``) the launcher, after the same steps, carries
    out bwrap's arguments itself instead of executing bwrap (``launch.c``'s ``--native``); where
    there is no launcher binary, bwrap is launched as above.
    """
    binary = launch_binary(sandboxes_root())
    if binary is not None:
        prefix = [binary]
        for path in procs_paths:
            prefix += ["--join", os.fsdecode(path)]
        for limit, value in rlimits:
            prefix += ["--rlimit", str(limit), str(value)]
        if uid is not None and gid is not None:
            prefix += ["--ids", str(uid), str(gid)]
        if native:
            prefix.append("--native")  # bwrap's arguments, carried out by the launcher itself
        return [*prefix, "--"]
    steps = [f"echo 0 >{shlex.quote(os.fsdecode(path))}" for path in procs_paths]
    for limit, value in rlimits:
        flag, unit = _ULIMIT_FLAGS.get(limit, ("", 0))
        if not flag or value % unit:
            return None
        steps.append(f"ulimit {flag} {value // unit}")
    prefix = [INIT_SHELL, "-c", " && ".join([*steps, 'exec "$@"']), "sandbox-launch"]
    if uid is None or gid is None:
        return prefix
    setpriv = setpriv_path()
    if setpriv is None:
        return None
    return [*prefix, setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _make_preexec(
    procs_paths: list[bytes], rlimits: list[tuple[int, int]], uid: int | None, gid: int | None
) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the forked child before exec: join the cgroup first, so bwrap and everything
        # it starts are counted and killable from their first instruction.
        for path in procs_paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for limit, value in rlimits:
            resource.setrlimit(limit, (value, value))
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)

    return preexec


#: The whole environment of the launch chain and of bwrap itself. The sandbox's variables
#: reach only the sandbox (bwrap ``--clearenv --setenv``): the launch shell runs as root, and a
#: spec's ``LD_PRELOAD`` or ``LD_LIBRARY_PATH`` must never load anything into it (nor into
#: bwrap, on the host).
LAUNCH_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def spawn_bwrap(
    args: list[str],
    env: Mapping[str, str],
    procs_paths: list[bytes],
    rlimits: list[tuple[int, int]],
    uid: int | None,
    gid: int | None,
    native: bool = False,
    **popen: object,
) -> subprocess.Popen[bytes]:
    """Starts ``args`` (bwrap's argv, ending in ``-- command...``) in the run's cgroups with
    the limits and ids (see ``launcher``), the command with exactly ``env``; a ``preexec_fn``
    only where the launcher cannot be used."""
    separator = args.index("--")
    setenv = [item for name, value in env.items() for item in ("--setenv", name, value)]
    args = [*args[:separator], "--clearenv", *setenv, *args[separator:]]
    prefix = launcher(procs_paths, rlimits, uid, gid, native)
    if prefix is not None:
        return subprocess.Popen([*prefix, *args], env=LAUNCH_ENV, **popen)  # type: ignore[call-overload, no-any-return]
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        args,
        env=LAUNCH_ENV,
        preexec_fn=_make_preexec(procs_paths, rlimits, uid, gid),  # noqa: PLW1509
        **popen,
    )


def prestart_enabled() -> bool:
    """``SANDBOXES_PRESTART=0`` turns off starting a spare's bwrap ahead (``Prestarted``)."""
    return os.environ.get("SANDBOXES_PRESTART", "1") != "0"


class Prestarted:
    """A spare sandbox's bwrap, started ahead of its first command (see ``sandboxes.spares``).

    The same launch as a first run's (launcher, cgroup join of the run's own group, limits,
    ids, bwrap with every flag, seccomp), except that pid 1 (``launch.c --init-wait``) waits
    on a unix socket for the command instead of getting it on its command line: the working
    directory, the environment, the argv and, when the run has stdin data, the read end of a
    pipe made for the run (else /dev/null, as ``subprocess.DEVNULL``). Nothing runs in the
    sandbox until then but bwrap and that init. Namespaces, mounts, the seccomp load and three
    execs (~2.5 ms of wall time here, most of a first run's overhead) then happen on the
    reaper's thread between sandboxes, not on the caller's path; the CPU is the same.

    The message has a length and the stdin pipe is made at the run, so a process the host
    forks meanwhile (holding copies of what the host holds) cannot leave the command waiting
    for an EOF.
    """

    def __init__(self, proc: subprocess.Popen[bytes], channel: socket.socket, status_read: int):
        self.proc = proc
        self.channel: socket.socket | None = channel
        self.status_read = status_read

    @staticmethod
    def message(cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> bytes:
        fields = [cwd, str(len(env))]
        fields += [f"{name}={value}" for name, value in env.items()]
        fields += list(argv)
        encoded = [os.fsencode(field) for field in fields]
        if any(b"\0" in field for field in encoded):
            raise ValueError("embedded null byte")
        return b"".join(field + b"\0" for field in encoded)

    def send(self, message: bytes, stdin_fd: int | None) -> None:
        """Hands the command to the waiting init (a bwrap that failed or died takes nothing:
        its status then tells, as for a bwrap started on the spot)."""
        channel, self.channel = self.channel, None
        assert channel is not None
        rights = (
            []
            if stdin_fd is None
            else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(array.array("i", [stdin_fd])))]
        )
        try:
            channel.sendmsg([struct.pack("Q", len(message))], rights)
            channel.sendall(message)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            channel.close()

    def end(self) -> None:
        """Gives the sandbox up: its init gets no command and exits."""
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()

    def reap(self) -> None:
        """After its cgroup was killed or emptied: waits for bwrap, closes what we hold."""
        self.end()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        with contextlib.suppress(OSError):
            os.close(self.status_read)


class BwrapDriver:
    def __init__(
        self,
        spec: SandboxSpec,
        name: str,
        *,
        image_path: Path | None = None,
        image_env: Mapping[str, str] | None = None,
        image_digest: str | None = None,
        writable_image: bool = False,
    ):
        self.spec = spec
        self.name = name
        self.image_path = image_path
        self.image_env = dict(image_env or {})
        self.image_digest = image_digest
        self.writable_image = writable_image
        self.uid, self.gid = sandbox_ids()
        self.root = sandboxes_root()
        self.workspace = Workspace(self.root, name, spec.disk_mb, self.uid, self.gid)
        self.cgroup: CgroupGroup | None = None
        self.weakened: dict[str, str] = {}
        self._args: list[str] = []
        #: The argv prefix of a bwrap run's pid 1 (the shell, or our init where it is built).
        self._init = [INIT_SHELL, "-c", INIT_SCRIPT, "sandbox-init"]
        self._seccomp: bytes | None = None
        self._kill_requested = False
        self._runs = 0
        self._lock = threading.Lock()
        self._running: subprocess.Popen[bytes] | None = None
        self.supervise = supervise_mode()
        #: ``SANDBOXES_LAUNCHER=native``: launch.c sets the namespaces up, not bwrap (fixed
        #: here, so a spare made later on the reaper's thread is set up as its shape says).
        self.native = launcher_mode() == "native"
        #: ``exec`` (commands) or ``python`` (a zygote, see sandboxes.zygote), and its imports.
        self.supervisor_mode = "exec"
        self.supervisor_preload: tuple[str, ...] = ()
        #: The interpreter of a ``python`` supervisor (an exec supervisor is always the base's).
        self.supervisor_python = SUPERVISOR_PYTHON
        self.supervisor_memory_mb = SUPERVISOR_MEMORY_MB
        self._supervisor: Supervisor | None = None
        self._supervisor_mark: RunMark | None = None
        self._run_mark: RunMark | None = None  # the supervised run in progress
        #: The first run's memory group, made ahead with a spare (see ``_begin_run``), and
        #: the spare's bwrap waiting in it for the first command.
        self._premade_run: RunMark | None = None
        self._prestarted: Prestarted | None = None
        #: Makes spares of this sandbox's shape, at close: made while it runs, a spare's bwrap
        #: would take CPU from its run (two cores here), so the one it took is replaced after.
        self._make_spares: Callable[[], None] | None = None
        #: Set by a recycling pool (``make_recyclable``): why this sandbox may not be handed
        #: to another user (None while it may), and its cgroup's limit counters when fresh.
        self.recyclable = False
        self.tainted: str | None = None
        self._fresh_events: dict[str, int] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        bwrap_path()
        cgroups = manager()
        missing = dict(cgroups.missing)
        seccomp_missing = seccomp.supported()
        if seccomp_missing is not None:
            missing["seccomp"] = seccomp_missing
        if self.uid == 0 or (self.uid is None and os.geteuid() == 0):
            missing["privilege_drop"] = "SANDBOXES_UID is 0: the sandbox would run as root"
        refused = {d: why for d, why in missing.items() if not self.spec.allows_weaker(d)}
        if refused:
            raise WeakerIsolationError(refused)
        shape = self._storage_shape(cgroups)
        spare = spares.take(shape)
        try:
            if spare is not None:  # made ahead for this shape, never used (sandboxes.spares)
                self.name, self.cgroup, self.workspace = spare.name, spare.cgroup, spare.workspace
                disk_missing = spare.disk_missing
                self._premade_run = spare.first_run
                self._prestarted = spare.prestarted  # type: ignore[assignment]
            else:
                self.cgroup, disk_missing = self._make_storage(cgroups, self.name, self.workspace)
            self._make_spares = functools.partial(
                spares.prepare,
                shape,
                functools.partial(self._make_spare, cgroups, self._will_prestart()),
            )
            if spare is None:
                self._make_spares()  # this shape's first: have some ready for the next
            if disk_missing is not None:
                if not self.spec.allows_weaker("disk_limit"):
                    raise WeakerIsolationError({"disk_limit": disk_missing})
                missing["disk_limit"] = disk_missing
            self.weakened = missing
            if seccomp_missing is None:
                self._seccomp = seccomp.build_filter(block_ip_sockets=self.spec.network == "none")
            self._args = self._build_args()
        except BaseException:
            self.close()
            raise

    def _storage_shape(self, cgroups: CgroupManager) -> tuple[object, ...]:
        """What a spare must match to serve this sandbox: where and how its storage is made."""
        parents = tuple(sorted(str(p) for p in cgroups._v1_parents.values()))
        return (
            cgroups.version,
            parents,
            str(cgroups._v2_parent),
            str(self.root),
            self.uid,
            self.gid,
            self.spec.memory_mb,
            self.spec.disk_mb,
            self.spec.pids,
            self.spec.cpu,
            self._will_prestart(),
            # What a started-ahead bwrap fixes too (see Prestarted).
            self.spec.network,
            self.spec.open_files,
            None if self.image_path is None else str(self.image_path),
            self.writable_image,
            launch_binary(self.root),  # the init that waits, and the launch of it
            self.native,  # who set a started-ahead sandbox up
        )

    def _first_run_is_bwrap(self) -> bool:
        return self.supervise != "always" and self.supervisor_mode == "exec"

    def _will_prestart(self) -> bool:
        """Whether this sandbox's spares get their bwrap started ahead (see ``Prestarted``):
        the first run goes through bwrap, with the built init (the one that can wait)."""
        return (
            self._first_run_is_bwrap()
            and prestart_enabled()
            and self.image_path is None
            and launch_binary(self.root) is not None
        )

    def _make_storage(
        self, cgroups: CgroupManager, name: str, workspace: Workspace
    ) -> tuple[CgroupGroup | None, str | None]:
        """The sandbox's cgroup with its limits, and its workspace (why it has no size limit)."""
        group = cgroups.create(name)
        try:
            if group is not None:
                # Files on the work tmpfs are memory charged to the sandbox: the total is
                # processes + files; each run's processes alone get memory_mb (see RunMark).
                group.set_limits(
                    memory_mb=self.spec.memory_mb + self.spec.disk_mb + SUPERVISOR_MEMORY_MB,
                    pids=self.spec.pids,
                    cpu=self.spec.cpu,
                )
            return group, workspace.create()
        except BaseException:
            if group is not None:
                group.remove()
            workspace.remove()
            raise

    def _make_spare(self, cgroups: CgroupManager, prestart: bool) -> spares.Spare:
        from sandboxes.sandbox import new_sandbox_name

        name = new_sandbox_name()
        workspace = Workspace(self.root, name, self.spec.disk_mb, self.uid, self.gid)
        group, disk_missing = self._make_storage(cgroups, name, workspace)
        first_run = prestarted = None
        if group is not None and prestart:
            try:
                first_run = group.begin_run("run-1", self.spec.memory_mb)
                prestarted = self._prestart(workspace, first_run)
            except BaseException:
                group.remove()
                workspace.remove()
                raise
        return spares.Spare(name, group, workspace, disk_missing, first_run, prestarted)

    def _prestart(self, workspace: Workspace, mark: RunMark) -> Prestarted:
        """Starts a spare's bwrap ahead, waiting for its first command (see ``Prestarted``)."""
        args = self._build_args(workspace)
        status_read, status_write = os.pipe()
        channel, inside_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours = [status_write]  # closed here once bwrap has them
        args += ["--chdir", "/", "--json-status-fd", str(status_write)]
        if seccomp.supported() is None:
            filter_fd = seccomp.filter_fd(
                seccomp.build_filter(block_ip_sockets=self.spec.network == "none")
            )
            ours.append(filter_fd)
            args += ["--seccomp", str(filter_fd)]
        args += ["--", INIT_PATH, "--init-wait", str(inside_end.fileno())]
        try:
            proc = spawn_bwrap(
                args,
                {},
                mark.procs_paths,
                self._rlimits(),
                self.uid,
                self.gid,
                native=self.native,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(*ours, inside_end.fileno()),
            )
        except BaseException:
            os.close(status_read)
            channel.close()
            raise
        finally:
            inside_end.close()
            for fd in ours:
                os.close(fd)
        return Prestarted(proc, channel, status_read)

    def _take_prestarted(self) -> Prestarted | None:
        """The spare's waiting bwrap for this first run, unless it died meanwhile (killed)."""
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None and prestarted.proc.poll() is not None:
            self._discard(prestarted)
            return None
        return prestarted

    def _discard(self, prestarted: Prestarted | None) -> None:
        if prestarted is None:
            return
        prestarted.end()
        if self.cgroup is not None:
            self.cgroup.kill_all()
        prestarted.reap()

    def _begin_run(self, name: str, memory_mb: int) -> RunMark:
        """``cgroup.begin_run``, or the run group a spare made ahead when it is this one."""
        assert self.cgroup is not None
        premade, self._premade_run = self._premade_run, None
        if premade is not None:
            if (
                premade.child is not None
                and premade.child.name == name
                and (memory_mb == self.spec.memory_mb)
            ):
                return premade
            # Not what this run needs (nothing ran in it): its waiting bwrap goes, then it.
            prestarted, self._prestarted = self._prestarted, None
            self._discard(prestarted)
            self.cgroup.end_run(premade)
        return self.cgroup.begin_run(name, memory_mb)

    def close(self) -> None:
        """Kills everything, waits for a run in another thread to return, removes all state.

        Where the cgroup kills atomically, every process gets its SIGKILL before this returns
        and the rest (waiting for them to be gone, removing the cgroup and the workspace) is
        left to ``sandboxes.reaper``, off the caller's path; elsewhere it is done here.
        """
        make_spares, self._make_spares = self._make_spares, None
        try:
            self._close()
        finally:
            if make_spares is not None:
                make_spares()  # after the removal handed to the reaper: it comes first

    def _close(self) -> None:
        errors = []
        cgroup = self.cgroup
        try:
            # A run in another thread is ended first (it holds the lock until it returns).
            if self._lock.locked() or cgroup is None or not cgroup.can_kill_atomically:
                self.kill()
        except SandboxError as exc:
            errors.append(str(exc))
        with self._lock:
            self._args = []  # no run can start any more
            cgroup = self.cgroup
            if cgroup is not None and not errors:
                try:
                    if cgroup.kill_now():  # the supervisor and all, in one step
                        self._hand_to_reaper(cgroup)
                        return
                except (SandboxError, OSError) as exc:
                    errors.append(f"cannot kill the sandbox's processes: {exc}")
            self._stop_supervisor()
            prestarted, self._prestarted = self._prestarted, None
            try:
                self._discard(prestarted)
            except SandboxError as exc:
                errors.append(str(exc))
            self._remove(errors)
        if errors:
            raise SandboxError("; ".join(errors))

    def _hand_to_reaper(self, cgroup: CgroupGroup) -> None:
        """Detaches what is left of a sandbox whose processes are all killed, for the reaper."""
        from sandboxes import reaper

        supervisor, self._supervisor = self._supervisor, None
        prestarted, self._prestarted = self._prestarted, None
        self._supervisor_mark = None
        self.cgroup = None
        workspace = self.workspace
        if supervisor is not None:
            supervisor.alive = False

        def remove() -> None:
            if supervisor is not None:
                supervisor.stop()  # reaps bwrap (killed with the rest)
            if prestarted is not None:
                prestarted.reap()  # killed with the rest before it ran anything
            errors: list[str] = []
            try:
                cgroup.remove()  # waits until the killed processes are gone (re-kills if not)
            except SandboxError as exc:
                errors.append(str(exc))
            try:
                workspace.remove()
            except (SandboxError, OSError) as exc:
                errors.append(str(exc))
            if errors:
                raise SandboxError("; ".join(errors))

        reaper.submit(remove)

    def _remove(self, errors: list[str]) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
                self.cgroup = None
            except SandboxError as exc:
                errors.append(str(exc))
        try:
            self.workspace.remove()
        except (SandboxError, OSError) as exc:
            errors.append(str(exc))

    def kill(self) -> None:
        """Kills every process of the running command now (safe from any thread)."""
        self._kill_requested = True
        if self.recyclable:
            self.tainted = self.tainted or "it was killed"
        mark, supervisor = self._run_mark, self._supervisor
        if self.cgroup is not None and mark is not None:
            if supervisor is not None:
                supervisor.quiet()
            self.cgroup.kill_run(mark)  # the supervisor stays for the next run
        elif self.cgroup is not None:
            self.cgroup.kill_all()
        running = self._running
        if running is not None and running.poll() is None:
            running.kill()

    # -- files --------------------------------------------------------------------------------
    def write_file(self, path: str, content: str | bytes) -> None:
        self.workspace.write_file(path, content)

    def read_file(self, path: str) -> bytes:
        return self.workspace.read_file(path, limit=self.spec.disk_mb * 1024 * 1024)

    def archive(self) -> bytes:
        # Only between runs: tarfile opens members by path, and a live sandbox process could
        # swap a file for a symlink to a host file between its lstat and its open.
        with self._lock:
            return self.workspace.archive()

    def extract(self, archive: bytes) -> None:
        self.workspace.extract(archive)

    # -- running ------------------------------------------------------------------------------
    def _build_args(self, workspace: Workspace | None = None) -> list[str]:
        workspace = workspace or self.workspace
        uid = self.uid if self.uid is not None else os.getuid()
        gid = self.gid if self.gid is not None else os.getgid()
        features = bwrap_features()
        args = [
            bwrap_path(),
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
        ]
        if "--disable-userns" in features:
            args.append("--disable-userns")
        args += base_system_args(self.root, uid, gid)
        args += ["--proc", "/proc", "--dev", "/dev"]
        # The sandbox's /dev/shm is on its own tmpfs (bounded by disk_mb), not the host's.
        args += ["--bind", str(workspace.shm), "/dev/shm"]  # noqa: S108
        args += ["--bind", str(workspace.work), WORK_DIR]
        args += ["--bind", str(workspace.tmp), TMP_DIR]
        if self.image_path is not None:
            mode = "--bind" if self.writable_image else "--ro-bind"
            args += [mode, str(self.image_path), IMAGE_DIR]
        launch = launch_binary(self.root)
        if launch is not None:
            # The sandbox's pid 1 (``launch.c``'s init): a static exec where the shell was one
            # that loads libc; a read-only bind of our own file, nothing of the host's.
            args += ["--ro-bind", launch, INIT_PATH]
            self._init = [INIT_PATH, "--init", "--"]
        # bwrap's root and /dev are tmpfs it made: freeze both, so only /work, /tmp and /dev/shm
        # take writes. (A writable /dev would outlive runs: files a zygote's evaluation left
        # there would reach the next, which the clearing of /work, /tmp and /dev/shm misses.)
        # Device nodes stay writable: they are bind mounts of their own.
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        return args

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": WORK_DIR,
            "TMPDIR": TMP_DIR,
            "LANG": "C.UTF-8",
            "USER": "sandbox",
        }
        env.update(self.image_env)
        env.update(self.spec.env)
        if extra:
            env.update(extra)
        return env

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
        with self._lock:  # one command at a time: they share the cgroup's counters
            if not self._args:
                raise SandboxError("the sandbox is not open (use it as a context manager)")
            supervised = (
                self._supervised_next() and _request_size(argv, env) <= MAX_SUPERVISED_REQUEST
            )
            if self.recyclable:
                # Until it has returned a plain result, it is not fit for another user.
                self.tainted = self.tainted or "a run did not finish normally"
            if supervised:
                result = self._run_supervised(argv, stdin, timeout, cwd, env, on_stdout, on_stderr)
            else:
                result = self._run_locked(argv, stdin, timeout, cwd, env, on_stdout, on_stderr)
            if self.recyclable and self.tainted == "a run did not finish normally":
                self.tainted = _why_not_recyclable(result, supervised, self._kill_requested)
            return result

    def evaluate(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes],
        stdin: str | bytes | None,
        timeout: float,
        env: Mapping[str, str] | None,
    ) -> ExecResult:
        """One zygote evaluation: empty the sandbox's files, write ``files``, run ``argv``."""
        with self._lock:
            if not self._args:
                raise SandboxError("the zygote is closed")
            if self.cgroup is None:
                raise SandboxError("a zygote needs a cgroup to tell evaluations apart")
            # The previous evaluation's processes are all dead (killed when it ended), so
            # nothing can write while the files are removed.
            self.workspace.clear()
            for path, content in files.items():
                self.workspace.write_file(path, content)
            return self._run_supervised(argv, stdin, timeout, WORK_DIR, env, None, None)

    def start_supervisor_now(self) -> None:
        """Starts the supervisor ahead of the first run (a zygote pays its imports up front)."""
        with self._lock:
            if self.cgroup is None:
                raise SandboxError("a supervisor needs the sandbox's cgroup")
            if self.supervisor_memory_mb != SUPERVISOR_MEMORY_MB:
                total = self.spec.memory_mb + self.spec.disk_mb + self.supervisor_memory_mb
                self.cgroup.set_limits(memory_mb=total, pids=None, cpu=None)
            if self._supervisor is None:
                try:
                    self._start_supervisor()
                except BaseException:
                    self._stop_supervisor()
                    raise

    # -- recycling (sandboxes.pool with recycle=True) ----------------------------------------
    def cannot_recycle(self) -> str | None:
        """Why this sandbox cannot be reset for another user (None: it can)."""
        if self.weakened:
            return f"it runs without {', '.join(sorted(self.weakened))}"
        if self.cgroup is None or not self.workspace.limited:
            return "it has no cgroup or tmpfs of its own"
        if self.spec.network != "none":
            return "a network namespace keeps state (sockets in TIME_WAIT, say)"
        if self.writable_image:
            return "its image is writable"
        return None

    def make_recyclable(self) -> None:
        """Readies a fresh sandbox for reuse: every run through the supervisor, which starts
        now (before any user's code) and whose seccomp filter refuses POSIX message queues
        (they outlive their processes in the ipc namespace and cannot be listed from inside)."""
        why = self.cannot_recycle()
        if why is not None:
            raise SandboxError(f"this sandbox cannot be recycled: {why}")
        assert self.cgroup is not None
        with self._lock:
            if self._runs or self._supervisor is not None:
                raise SandboxError("only a sandbox that has run nothing can be made recyclable")
            self.recyclable = True
            self.supervise = "always"
            self._fresh_events = self.cgroup.limit_events()
        self.start_supervisor_now()

    def recycle(self) -> None:
        """Resets the sandbox for its next user, or raises SandboxError (then close it).

        Each step defends one thing a user could leave for the next; any doubt fails it:
        1. no run may be in progress, and no run may have timed out, been killed, hit its
           memory limit or output cap, or gone through a bwrap of its own (``tainted``);
        2. processes: the cgroup holds exactly bwrap and the supervisor, and no child group
           but the supervisor's (every run's group is killed and removed when it ends);
        3. the supervisor (see ``inside.reset``): reaps, removes SysV IPC, and checks that the
           ipc and pid namespaces are empty and its own inherited state is unchanged;
        4. files: /work, /tmp, /dev/shm emptied and reset, the tmpfs proven empty
           (``Workspace.reset``);
        5. limits: no pid, memory or OOM counter of the cgroup moved since it was fresh; its
           limits are written again.
        Each run has its own cgroup (peak memory, CPU), environment and working directory
        already, and the hostname cannot change (no capability inside).
        """
        if not self._lock.acquire(blocking=False):
            raise SandboxError("a run is still in progress")
        try:
            if not self.recyclable or not self._args:
                raise SandboxError("the sandbox is closed or not recyclable")
            if self.tainted is not None:
                raise SandboxError(f"not recycled: {self.tainted}")
            supervisor, mark = self._supervisor, self._supervisor_mark
            if supervisor is None or mark is None or not supervisor.alive:
                raise SandboxError("its supervisor is gone")
            assert self.cgroup is not None and mark.child is not None
            theirs = self.cgroup._pids_in([mark.child])
            if (
                supervisor.proc.poll() is not None
                or len(theirs) != 2
                or supervisor.proc.pid not in theirs
                or self.cgroup.pids() != theirs
                or self.cgroup.children() != [mark.child]
            ):
                raise SandboxError("processes or cgroups other than the supervisor's are left")
            supervisor.reset()
            self.workspace.reset()
            events = self.cgroup.limit_events()
            if events != self._fresh_events:
                fresh = self._fresh_events
                raise SandboxError(f"the sandbox hit a limit ({events}; when fresh: {fresh})")
            self.cgroup.set_limits(
                memory_mb=self.spec.memory_mb + self.spec.disk_mb + self.supervisor_memory_mb,
                pids=self.spec.pids,
                cpu=self.spec.cpu,
            )
            self._kill_requested = False
        except BaseException:
            self.tainted = self.tainted or "its reset failed"
            raise
        finally:
            self._lock.release()

    def _supervised_next(self) -> bool:
        # Without a cgroup a run's processes cannot be told apart from the supervisor's.
        if self.cgroup is None or self.supervise == "never":
            return False
        return self.supervise == "always" or self._runs > 0 or self.supervisor_mode != "exec"

    # -- the supervisor -----------------------------------------------------------------------
    def _start_supervisor(self) -> Supervisor:
        assert self.cgroup is not None
        self._runs += 1
        mark = self._begin_run(f"supervisor-{self._runs}", self.supervisor_memory_mb)
        host_end, inside_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        passed = [inside_end.fileno()]
        # Not --die-with-parent: that follows the host *thread* that started bwrap, and an
        # episode's steps may come from other threads. The supervisor leaves (and its whole
        # pid namespace with it) when the host's end of the control socket closes instead,
        # which the kernel does when the host process dies.
        args = [a for a in self._args if a != "--die-with-parent"]
        args += ["--chdir", WORK_DIR]
        if self._seccomp is not None:
            program = seccomp.build_filter(
                block_ip_sockets=self.spec.network == "none",
                deny_message_queues=self.supervisor_mode == "python" or self.recyclable,
            )
            filter_fd = seccomp.filter_fd(program)
            passed.append(filter_fd)
            args += ["--seccomp", str(filter_fd)]
        args += [
            "--",
            *supervisor_argv(
                self.supervisor_mode,
                inside_end.fileno(),
                self.supervisor_preload,
                self.supervisor_python if self.supervisor_mode == "python" else SUPERVISOR_PYTHON,
            ),
        ]
        try:
            proc = spawn_bwrap(
                args,
                self.environment(),
                mark.procs_paths,
                self._rlimits(),
                self.uid,
                self.gid,
                native=self.native,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=tuple(passed),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            host_end.close()
            self.cgroup.end_run(mark)
            raise SandboxError(f"cannot start bwrap: {exc}") from exc
        finally:
            inside_end.close()
            for fd in passed[1:]:
                os.close(fd)
        supervisor = Supervisor(proc, host_end)
        self._supervisor, self._supervisor_mark = supervisor, mark
        supervisor.wait_ready()
        return supervisor

    def _stop_supervisor(self) -> None:
        supervisor, self._supervisor = self._supervisor, None
        mark, self._supervisor_mark = self._supervisor_mark, None
        if self.cgroup is not None and mark is not None:
            # Killed, not asked to exit: nothing in the sandbox needs a graceful end, and a
            # supervisor's own exit (Python's finalisation, then bwrap's) kept close() waiting
            # 1.9 ms here (p50; p90 5 ms) against a few writes to the freezer.
            if supervisor is not None:
                supervisor.alive = False
            self.cgroup.kill_run(mark)
        if supervisor is not None:
            supervisor.stop()
        if self.cgroup is not None and mark is not None:
            self.cgroup.end_run(mark)

    def _captured_result(
        self,
        out: StreamCapture,
        err: StreamCapture,
        code: int,
        sig: int | None,
        wall: float,
        cpu_s: float | None,
        peak: float | None,
        timed_out: bool,
        oom: bool,
    ) -> ExecResult:
        """One run's result from its captured streams (the same on both launch paths)."""
        return ExecResult(
            stdout=out.text,
            stderr=err.text,
            exit_code=code,
            signal=sig,
            wall_s=wall,
            cpu_s=cpu_s,
            peak_memory_mb=peak,
            timed_out=timed_out,
            oom_killed=oom,
            truncated=out.truncated or err.truncated,
            image_digest=self.image_digest,
        )

    def _killed_result(self, wall: float) -> ExecResult:
        return ExecResult(
            stdout="",
            stderr="",
            exit_code=128 + signal.SIGKILL,
            signal=signal.SIGKILL,
            wall_s=wall,
            cpu_s=None,
            peak_memory_mb=None,
            timed_out=False,
            oom_killed=False,
            truncated=False,
            image_digest=self.image_digest,
        )

    def _rlimits(self) -> list[tuple[int, int]]:
        return [
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, self.spec.open_files),
            (resource.RLIMIT_FSIZE, self.spec.disk_mb * 1024 * 1024),
        ]

    def _run_supervised(
        self,
        argv: Sequence[str],
        stdin: str | bytes | None,
        timeout: float,
        cwd: str,
        env: Mapping[str, str] | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> ExecResult:
        assert self.cgroup is not None
        if cwd != IMAGE_DIR and not self.workspace.is_dir(cwd):
            raise SandboxPathError(f"working directory {cwd!r} is not a directory in the sandbox")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        limit = self.spec.output_limit_bytes
        out, err = StreamCapture(limit, on_stdout), StreamCapture(limit, on_stderr)
        self._kill_requested = False
        for attempt in (1, 2):
            supervisor = self._supervisor
            if supervisor is None or not supervisor.alive:
                if self.recyclable:
                    self.tainted = "its supervisor had to be restarted"
                self._stop_supervisor()
                started = time.monotonic()
                try:
                    supervisor = self._start_supervisor()
                except SandboxError:
                    self._stop_supervisor()
                    if not self._kill_requested:
                        raise
                    # Killed (closed from another thread) while its supervisor was starting.
                    return self._killed_result(time.monotonic() - started)
                except BaseException:
                    self._stop_supervisor()
                    raise
            own_mark = self._supervisor_mark
            assert own_mark is not None
            self._runs += 1
            mark = self._begin_run(f"run-{self._runs}", self.spec.memory_mb)
            started = time.monotonic()
            self._run_mark = mark
            try:
                status, timed_out = supervisor.run(
                    argv,
                    cwd=cwd,
                    env=self.environment(env),
                    data=data,
                    cgroup_procs=mark.child_procs_paths,
                    own_cgroup_procs=own_mark.child_procs_paths,
                    out=out,
                    err=err,
                    deadline=started + timeout,
                    kill_run=functools.partial(self.cgroup.kill_run, mark),
                )
            except SupervisorGone:
                self.cgroup.end_run(mark)
                if self._kill_requested:
                    return self._killed_result(time.monotonic() - started)
                if attempt == 2:
                    raise
                continue  # it died between runs (nothing of this run started): start anew
            finally:
                self._run_mark = None
                self.cgroup.kill_run(mark)
            break
        wall = time.monotonic() - started
        out.finish()
        err.finish()
        cpu_s, peak, oom = self.cgroup.end_run(mark)
        if supervisor is not None and not supervisor.alive:
            self._stop_supervisor()
        sig: int | None = None
        if status is None:  # the supervisor died with the run (or never answered): killed
            sig, code = signal.SIGKILL, 128 + signal.SIGKILL
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            code = 128 + sig
        else:
            code = os.WEXITSTATUS(status)
            if 128 < code <= 128 + 64:  # as a shell reports a killed command (and bwrap runs)
                sig = code - 128
        return self._captured_result(out, err, code, sig, wall, cpu_s, peak, timed_out, oom)

    def _run_locked(
        self,
        argv: Sequence[str],
        stdin: str | bytes | None,
        timeout: float,
        cwd: str,
        env: Mapping[str, str] | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> ExecResult:
        if cwd != IMAGE_DIR and not self.workspace.is_dir(cwd):
            raise SandboxPathError(f"working directory {cwd!r} is not a directory in the sandbox")
        self._kill_requested = False
        self._runs += 1
        mark = None
        if self.cgroup is not None:
            mark = self._begin_run(f"run-{self._runs}", self.spec.memory_mb)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        limit = self.spec.output_limit_bytes
        out, err = StreamCapture(limit, on_stdout), StreamCapture(limit, on_stderr)
        prestarted = self._take_prestarted()
        message = b""
        if prestarted is not None:
            try:
                message = Prestarted.message(cwd, self.environment(env), argv)
            except ValueError:  # the launch on the spot raises it for the caller, as before
                self._discard(prestarted)
                prestarted = None
        if prestarted is not None:
            # Its bwrap is up, in this run's groups, with its limits: only the command is left.
            status_read, proc = prestarted.status_read, prestarted.proc
            started = time.monotonic()
            stdin_read = stdin_write = None
            try:
                if data:
                    stdin_read, stdin_write = os.pipe()
                prestarted.send(message, stdin_read)
            except BaseException as exc:
                for fd in (stdin_read, stdin_write):
                    if fd is not None:
                        os.close(fd)
                self._discard(prestarted)
                if self.cgroup is not None and mark is not None:
                    self.cgroup.end_run(mark)
                if not isinstance(exc, OSError):
                    raise
                raise SandboxError(f"cannot start the command: {exc}") from exc
            if stdin_read is not None and stdin_write is not None:
                os.close(stdin_read)  # the command's now
                proc.stdin = open(stdin_write, "wb", buffering=0)  # noqa: SIM115 - pump closes it
        else:
            status_read, status_write = os.pipe()
            passed = [status_write]
            args = [*self._args, "--chdir", cwd, "--json-status-fd", str(status_write)]
            if self._seccomp is not None:
                filter_fd = seccomp.filter_fd(self._seccomp)
                passed.append(filter_fd)
                args += ["--seccomp", str(filter_fd)]
            args += ["--", *self._init, *argv]
            procs_paths = mark.procs_paths if mark is not None else []
            started = time.monotonic()
            try:
                proc = spawn_bwrap(
                    args,
                    self.environment(env),
                    procs_paths,
                    self._rlimits(),
                    self.uid,
                    self.gid,
                    native=self.native,
                    stdin=subprocess.PIPE if data else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=tuple(passed),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                os.close(status_read)
                for fd in passed:
                    os.close(fd)
                if self.cgroup is not None and mark is not None:
                    self.cgroup.end_run(mark)  # releases what begin_run holds
                raise SandboxError(f"cannot start bwrap: {exc}") from exc
            for fd in passed:
                os.close(fd)
        self._running = proc
        timed_out = False
        try:
            timed_out = pump_streams(proc, data, out, err, started + timeout, self.kill)
            proc.wait()
        finally:
            self._running = None
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if self.cgroup is not None:
                self.cgroup.kill_all()
            status = _read_status(status_read)
        wall = time.monotonic() - started
        out.finish()
        err.finish()
        cpu_s = peak = None
        oom = False
        if self.cgroup is not None and mark is not None:
            cpu_s, peak, oom = self.cgroup.end_run(mark)
        if "child-pid" not in status and not timed_out and not self._kill_requested:
            raise SandboxError(
                f"bwrap could not set up the sandbox (exit {proc.returncode}): "
                f"{err.text.strip()[-2000:]}"
            )
        code = proc.returncode
        sig: int | None = None
        if code < 0:  # bwrap itself was killed (timeout): report it as a shell would
            sig, code = -code, 128 - code
        elif 128 < code <= 128 + 64:
            sig = code - 128
        if "exit-code" not in status and sig is None and timed_out:
            sig, code = signal.SIGKILL, 128 + signal.SIGKILL
        return self._captured_result(out, err, code, sig, wall, cpu_s, peak, timed_out, oom)


def _why_not_recyclable(result: ExecResult, supervised: bool, killed: bool) -> str | None:
    if not supervised:
        return "a command ran in a bwrap of its own"
    if killed:
        return "a run was killed"
    if result.timed_out:
        return "a run timed out"
    if result.oom_killed:
        return "a run was OOM-killed"
    if result.truncated:
        return "a run's output was cut at its limit"
    return None


def pump_streams(
    proc: subprocess.Popen[bytes],
    data: bytes | None,
    out: StreamCapture,
    err: StreamCapture,
    deadline: float,
    kill: Callable[[], None],
) -> bool:
    """Feeds stdin and drains both outputs until EOF; kills everything at the deadline."""
    assert proc.stdout is not None and proc.stderr is not None
    timed_out = False
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    pending = memoryview(data) if data else None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        if pending is not None and proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not timed_out:
                    timed_out = True
                    kill()
                # Everything is dead now; give the pipes a moment to report EOF.
                deadline = time.monotonic() + 2.0
                remaining = 2.0
            for key, _ in selector.select(remaining):
                fileobj = key.fileobj
                if fileobj is proc.stdin:
                    assert pending is not None and proc.stdin is not None
                    try:
                        written = os.write(proc.stdin.fileno(), pending[:_CHUNK])
                        pending = pending[written:]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                fd = key.fd
                chunk = os.read(fd, _CHUNK)
                if chunk:
                    captures[fd].feed(chunk)
                else:
                    selector.unregister(fileobj)
            if timed_out and time.monotonic() >= deadline:
                break
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    return timed_out


def _read_status(fd: int) -> dict[str, int]:
    """bwrap's --json-status-fd lines: {"child-pid": N} once running, {"exit-code": N} at end."""
    try:
        os.set_blocking(fd, False)
        raw = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(fd)
    status: dict[str, int] = {}
    for line in raw.decode(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            status.update({k: v for k, v in item.items() if isinstance(v, int)})
    return status
