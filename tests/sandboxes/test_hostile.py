"""Hostile programs: each must end safely, and the host must be exactly as before.

Every case runs in its own sandbox with short limits, asserts the safe outcome, then checks
the host: no cgroup, workspace, mount or process left, and the canary secret that sits in
this process's environment never appears in anything the sandbox produced.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import textwrap
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandboxes import ExecResult, PythonZygote, Sandbox, SandboxPathError, SandboxSpec
from tests.sandboxes.conftest import assert_nothing_left, open_started_ahead


@dataclass
class Hostile:
    code: str
    check: Callable[[ExecResult], None]
    spec: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    stdin: bytes | None = None


HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE = [Path("/usr/evil"), Path("/etc/evil"), Path("/evil")]


def _run_hostile(
    case: Hostile, canary: str, open_sandbox: Callable[[SandboxSpec], Sandbox] = Sandbox
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    spec = SandboxSpec(**{"timeout_s": 5, "memory_mb": 128, "pids": 32, **case.spec})
    sandbox = open_sandbox(spec)
    with sandbox:
        result = sandbox.run(
            ["python3", "-c", textwrap.dedent(case.code), marker],
            stdin=case.stdin,
            timeout=case.timeout,
        )
        case.check(result)
    assert canary not in result.stdout and canary not in result.stderr
    assert_nothing_left(sandbox.name, marker)
    assert not any(p.exists() for p in HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE)


def _expect(*fragments: str, exit_code: int | None = 0) -> Callable[[ExecResult], None]:
    def check(result: ExecResult) -> None:
        for fragment in fragments:
            assert fragment in result.stdout, (fragment, result)
        if exit_code is not None:
            assert result.exit_code == exit_code, result
            assert not result.timed_out

    return check


def _timed_out(result: ExecResult) -> None:
    assert result.timed_out, result
    assert result.signal == 9 and result.exit_code == 137


def _fork_bomb_stopped(result: ExecResult) -> None:
    assert result.timed_out, result
    assert "fork refused" in result.stdout


def _oom(result: ExecResult) -> None:
    assert result.oom_killed, result
    assert result.signal == 9
    assert "allocated everything" not in result.stdout
    assert result.peak_memory_mb is not None and result.peak_memory_mb <= 64 + 1


def _endless_output(result: ExecResult) -> None:
    assert result.timed_out and result.truncated
    assert len(result.stdout) == 1024 * 1024


def _busy_loop(result: ExecResult) -> None:
    assert result.timed_out
    assert result.cpu_s is not None
    # The CFS quota allows 0.25 of a core; one period (0.1 s) of slack for the boundaries.
    assert result.cpu_s <= 0.25 * result.wall_s + 0.1, result


def _non_utf8(result: ExecResult) -> None:
    assert result.exit_code == 0
    assert "\ufffd" in result.stdout and "still readable" in result.stdout
    assert "\ufffd" in result.stderr


HOSTILE: dict[str, Hostile] = {
    "fork bomb": Hostile(
        """
        import os, sys, time
        said = False
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(1000)
            except OSError:
                if not said:
                    print("fork refused", flush=True)
                    said = True
        """,
        _fork_bomb_stopped,
        spec={"pids": 16},
        timeout=1.5,
    ),
    "memory bomb": Hostile(
        """
        chunks = []
        for _ in range(1024):
            chunks.append(bytearray(1024 * 1024))
        print("allocated everything")
        """,
        _oom,
        spec={"memory_mb": 64},
    ),
    "large untouched mmap works": Hostile(
        """
        import mmap
        region = mmap.mmap(-1, 4 * 1024**3)
        region[0] = 1
        region[-1] = 2
        print("mapped", len(region))
        """,
        _expect("mapped 4294967296"),
        spec={"memory_mb": 64},
    ),
    "filling the disk": Hostile(
        """
        import os
        written = 0
        try:
            for i in range(1000):
                with open(f"/work/fill{i}", "wb") as f:
                    for _ in range(4):
                        f.write(b"x" * 1024 * 1024)
                        written += 1
        except OSError as exc:
            print("stopped:", exc.strerror, "after MB:", written)
        st = os.statvfs("/work")
        print("size MB:", st.f_blocks * st.f_frsize // 2**20)
        """,
        _expect("stopped: No space left on device", "size MB: 8"),
        spec={"disk_mb": 8},
    ),
    "a million small files": Hostile(
        """
        import os
        try:
            for i in range(1_000_000):
                open(f"/work/f{i}", "w").close()
        except OSError as exc:
            print("stopped:", exc.strerror, "at", i < 5000)
        """,
        _expect("stopped: No space left on device at True"),
        spec={"disk_mb": 4},
    ),
    "endless output": Hostile(
        """
        import sys
        while True:
            sys.stdout.write("y" * 65536)
        """,
        _endless_output,
        timeout=1.0,
    ),
    "busy loop": Hostile("while True: pass", _busy_loop, spec={"cpu": 0.25}, timeout=1.0),
    "long sleep": Hostile("import time; time.sleep(1000)", _timed_out, timeout=0.5),
    "ignoring SIGTERM": Hostile(
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(1000)
        """,
        _timed_out,
        timeout=0.5,
    ),
    "double-fork daemon": Hostile(
        """
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c",
                         "import time; time.sleep(1000)", sys.argv[1]])
            os._exit(0)
        os.wait()
        print("daemon started")
        """,
        _expect("daemon started"),
    ),
    "writing outside the work directory": Hostile(
        """
        import os
        for path in ["/usr/evil", "/etc/evil", "/evil", "/proc/sys/kernel/hostname",
                     "/proc/1/mem", "/sys/evil", "/usr/bin/python3"]:
            try:
                with open(path, "ab") as f:
                    f.write(b"x")
                print("WROTE", path)
            except OSError as exc:
                print("refused", path, exc.strerror)
        with open("/work/fine", "w") as f:
            f.write("ok")
        print("work is writable")
        """,
        lambda r: (
            _expect("work is writable")(r),
            None if "WROTE" not in r.stdout else pytest.fail(r.stdout),
        ),
    ),
    "reading the host environment and /proc/1/environ": Hostile(
        """
        import os
        seen = repr(dict(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    seen += open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
                except OSError as exc:
                    seen += str(exc)
        print(seen)
        print("processes visible:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        """,
        _expect("processes visible: [1, 2]"),
    ),
    "TCP egress without network": Hostile(
        """
        import socket
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=2)
            print("CONNECTED")
        except OSError as exc:
            print("refused:", exc)
        """,
        _expect("refused: [Errno 13] Permission denied"),
    ),
    "TCP egress with loopback only": Hostile(
        """
        import socket
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=2)
            print("CONNECTED")
        except OSError as exc:
            print("refused:", exc)
        """,
        _expect("refused: [Errno 101] Network is unreachable"),
        spec={"network": "loopback"},
    ),
    "UDP egress": Hostile(
        """
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", ("8.8.8.8", 53))
            print("SENT")
        except OSError as exc:
            print("refused:", exc.strerror)
        """,
        _expect("refused: Network is unreachable"),
        spec={"network": "loopback"},
    ),
    "DNS lookup": Hostile(
        """
        import socket
        try:
            print("RESOLVED", socket.getaddrinfo("example.com", 443))
        except OSError as exc:
            print("no dns:", type(exc).__name__)
        """,
        _expect("no dns: gaierror"),
        spec={"network": "loopback"},
    ),
    "ptrace, mount and unshare": Hostile(
        """
        import ctypes, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())       # PTRACE_ATTACH
        print("mount", libc.mount(b"none", b"/work", b"tmpfs", 0, None), ctypes.get_errno())
        print("unshare", libc.unshare(0x10000000), ctypes.get_errno())      # CLONE_NEWUSER
        print("unshare-mnt", libc.unshare(0x00020000), ctypes.get_errno())  # CLONE_NEWNS
        print("chroot", libc.chroot(b"/tmp"), ctypes.get_errno())
        print("io_uring", libc.syscall(425, 1, 0), ctypes.get_errno())      # io_uring_setup
        print("bpf", libc.syscall(321 if os.uname().machine == "x86_64" else 280, 0, 0, 0),
              ctypes.get_errno())
        r = subprocess.run(["unshare", "-r", "true"], capture_output=True)
        print("unshare-cmd", r.returncode != 0)
        """,
        _expect(
            "ptrace -1 1",
            "mount -1 1",
            "unshare -1 1",
            "unshare-mnt -1 1",
            "chroot -1 1",
            "io_uring -1 1",
            "bpf -1 1",
            "unshare-cmd True",
        ),
    ),
    "huge stdin that is never read": Hostile(
        "print('ignored stdin')",
        _expect("ignored stdin"),
        stdin=b"z" * (64 * 1024 * 1024),
    ),
    "huge stdin read to the end": Hostile(
        "import sys; print('read', len(sys.stdin.buffer.read()))",
        _expect(f"read {24 * 1024 * 1024}"),
        stdin=b"z" * (24 * 1024 * 1024),
    ),
    "non-UTF-8 output": Hostile(
        """
        import sys
        sys.stdout.buffer.write(b"\\xff\\xfe\\xc3 still readable \\x80")
        sys.stderr.buffer.write(b"\\xc0\\xaf")
        """,
        _non_utf8,
    ),
    "setuid binaries give nothing": Hostile(
        """
        import subprocess
        for cmd in (["su", "-c", "id"], ["mount", "-t", "tmpfs", "x", "/work"]):
            try:
                r = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=5)
                print(cmd[0], "failed" if r.returncode else "SUCCEEDED")
            except FileNotFoundError:
                print(cmd[0], "failed")
        import os
        print("uid", os.getuid(), os.geteuid())
        """,
        _expect("su failed", "mount failed", "uid 65534 65534"),
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_ends_safely_and_leaves_nothing(name, canary):
    _run_hostile(HOSTILE[name], canary)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_in_a_sandbox_started_ahead_ends_safely_and_leaves_nothing(name, canary):
    """The same, as the first command of a spare whose bwrap was started before it was taken
    (``test_hostile_program_ends_safely_and_leaves_nothing`` takes a spare when one is ready)."""
    _run_hostile(HOSTILE[name], canary, open_started_ahead)


def test_daemon_does_not_survive_into_the_next_run():
    with Sandbox(SandboxSpec(timeout_s=5)) as sandbox:
        sandbox.run(["sh", "-c", "(setsid sleep 1000 &) ; echo started"])
        after = sandbox.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
    # Only the new run's own processes: bwrap's init, sh, ls and grep at most.
    assert int(after.stdout) <= 4
    assert_nothing_left(sandbox.name)


def test_kill_minus_one_cannot_reach_host_processes_of_the_same_uid():
    uid = 65534 if os.geteuid() == 0 else os.getuid()
    host = subprocess.Popen(["sleep", "60"], user=uid if os.geteuid() == 0 else None)
    try:
        with Sandbox(SandboxSpec(timeout_s=5)) as sandbox:
            result = sandbox.run(
                [
                    "python3",
                    "-c",
                    "import os, signal\n"
                    "try:\n    os.kill(-1, signal.SIGKILL)\n"
                    "except ProcessLookupError:\n    pass  # nothing else to kill in here\n"
                    "print('sent')",
                ]
            )
        assert "sent" in result.stdout
        assert host.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        host.kill()
        host.wait()
    assert_nothing_left(sandbox.name)


def test_host_loopback_service_is_unreachable():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    listener = threading.Thread(target=accept)
    listener.start()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    try:
        with Sandbox(SandboxSpec(network="loopback")) as sandbox:
            result = sandbox.run(["python3", "-c", code])
    finally:
        listener.join()
        server.close()
    assert "refused 111" in result.stdout  # ECONNREFUSED: its own empty loopback
    assert not accepted
    assert_nothing_left(sandbox.name)


def test_symlink_escape_through_read_file_and_write_files_is_refused(tmp_path, canary):
    secret = Path("/tmp") / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text(canary)
    try:
        with Sandbox(SandboxSpec()) as sandbox:
            sandbox.run(
                [
                    "sh",
                    "-c",
                    f"ln -s {secret} /work/leak && ln -s /tmp/.. /work/up && "
                    f"ln -s /etc /work/etcdir && mkfifo /work/pipe",
                ]
            )
            for path in ("leak", "etcdir/passwd", f"up/tmp/{secret.name}"):
                with pytest.raises(SandboxPathError):
                    sandbox.read_file(path)
            with pytest.raises(SandboxPathError):
                sandbox.read_file("pipe")  # a FIFO would block the host forever
            with pytest.raises(SandboxPathError):
                sandbox.write_files({"leak": "overwritten"})
            with pytest.raises(SandboxPathError):
                sandbox.read_file("../../etc/passwd")
            snapshot = sandbox.snapshot()
        assert secret.read_text() == canary
        with Sandbox.restore(snapshot) as restored:
            listing = restored.run(["ls", "-l", "/work"]).stdout
            assert "leak ->" in listing
            with pytest.raises(SandboxPathError):
                restored.read_file("leak")
        assert_nothing_left(sandbox.name)
        assert_nothing_left(restored.name)
    finally:
        secret.unlink()


def test_nothing_of_a_previous_sandbox_is_visible_in_the_next():
    with Sandbox(SandboxSpec()) as first:
        first.run(
            ["sh", "-c", "echo a > /work/secret; echo b > /tmp/secret; echo c > /dev/shm/secret"]
        )
    with Sandbox(SandboxSpec()) as second:
        result = second.run(["sh", "-c", "ls -A /work /tmp /dev/shm; cat /work/secret"])
    assert "secret" not in result.stdout
    assert result.exit_code != 0  # cat: no such file
    assert_nothing_left(first.name)
    assert_nothing_left(second.name)


# -- the same hostile programs through the supervisor and the zygote ------------------------------
#: What differs on these paths and why: the supervisor stays pid 1 across runs, so the program
#: of a second run is pid 3 (pid 2 was the warm-up run's command or evaluation).
_SECOND_RUN_CHECKS: dict[str, Callable[[ExecResult], None]] = {
    "reading the host environment and /proc/1/environ": _expect("processes visible: [1, 3]"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_in_a_supervised_run_ends_safely_and_leaves_nothing(
    name, canary, monkeypatch
):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    case = HOSTILE[name]
    marker = f"hostile-{uuid.uuid4().hex}"
    spec = SandboxSpec(**{"timeout_s": 5, "memory_mb": 128, "pids": 32, **case.spec})
    sandbox = Sandbox(spec)
    with sandbox:
        assert sandbox.run(["true"]).exit_code == 0  # the supervisor is up and has run once
        result = sandbox.run(
            ["python3", "-c", textwrap.dedent(case.code), marker],
            stdin=case.stdin,
            timeout=case.timeout,
        )
        _SECOND_RUN_CHECKS.get(name, case.check)(result)
        after = sandbox.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
        assert after.exit_code == 0 and int(after.stdout) <= 4, after  # nothing of it is left
    assert canary not in result.stdout and canary not in result.stderr
    assert_nothing_left(sandbox.name, marker)
    assert not any(p.exists() for p in HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_as_a_zygote_evaluation_ends_safely_and_leaves_nothing(name, canary):
    case = HOSTILE[name]
    marker = f"hostile-{uuid.uuid4().hex}"
    spec = SandboxSpec(**{"timeout_s": 5, "memory_mb": 128, "pids": 32, **case.spec})
    zygote = PythonZygote(spec)
    with zygote:
        assert zygote.evaluate("warm.py", files={"warm.py": "pass"}).exit_code == 0
        result = zygote.evaluate(
            "hostile.py",
            marker,
            files={"hostile.py": textwrap.dedent(case.code)},
            stdin=case.stdin,
            timeout=case.timeout,
        )
        _SECOND_RUN_CHECKS.get(name, case.check)(result)
        after = zygote.evaluate(
            "after.py",
            files={"after.py": "import os; print(sorted(os.listdir('/work')), os.getpid())"},
        )
        assert after.exit_code == 0, after
        # The next evaluation sees only its own file and runs right after pid 1's last child.
        assert after.stdout.startswith("['after.py']"), after
    assert canary not in result.stdout and canary not in result.stderr
    assert_nothing_left(zygote.name, marker)
    assert not any(p.exists() for p in HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE)
