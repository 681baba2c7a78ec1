"""An open sandbox's supervisor: later runs are forks inside it, with the same ExecResult."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandboxes import ExecResult, Sandbox, SandboxSpec
from sandboxes.bwrap import launch_binary
from sandboxes.workspace import sandboxes_root
from tests.sandboxes.conftest import (
    assert_nothing_left,
    leftovers,
    open_started_ahead,
    skip_unless_sandboxes_start_ahead,
)

SLEEPER = ["sh", "-c", "sleep 5"]
# (argv, stdin) pairs whose results must not depend on the path that ran them. The shells that
# kill themselves do it at once: both paths print the signal note ("Terminated") however soon
# the command dies.
SAME_ON_BOTH_PATHS = [
    (["sh", "-c", "echo out; echo err >&2; exit 3"], None),
    (["sh", "-c", "kill -TERM $$"], None),
    (["sh", "-c", "exit 137"], None),
    (["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], "abc"),
    (["sh", "-c", "printf '0123456789abcdef'"], None),
    (["sh", "-c", "pwd; echo $HOME $TMPDIR $USER; id -u"], None),
    (SLEEPER, None),
    (["sh", "-c", "kill -INT $$; kill -SEGV $$"], None),
    (["sh", "-c", "echo a; kill -TERM $$"], None),
    (["/no/such/program"], None),
    (["no-such-program-on-the-path"], None),
    (["/etc"], None),
    (["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"], None),
    (["python3", "-c", "import os; os.abort()"], None),
    (["sh", "-c", "printf 'echo from a script without a shebang' > s; chmod +x s; ./s"], None),
]


def _comparable(result: ExecResult) -> tuple[object, ...]:
    return (
        result.stdout,
        result.stderr,
        result.exit_code,
        result.signal,
        result.timed_out,
        result.oom_killed,
        result.truncated,
    )


def _results(mode: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    monkeypatch.setenv("SANDBOXES_SUPERVISE", mode)
    # Only the sleeper is meant to time out; the rest get a limit no loaded machine reaches (a
    # Python start took over 0.5 s here under load, and its "timed out" differed by path).
    with Sandbox(SandboxSpec(output_limit_bytes=64, timeout_s=30)) as sandbox:
        return [
            _comparable(sandbox.run(argv, stdin=stdin, timeout=0.5 if argv == SLEEPER else None))
            for argv, stdin in SAME_ON_BOTH_PATHS
        ]


@pytest.mark.parametrize("launcher", ["built", "shell"])
def test_a_supervised_run_reports_exactly_what_a_bwrap_run_reports(launcher, monkeypatch):
    """On the bwrap path the init is ``launch.c``'s where a compiler built it, else the shell."""
    if launcher == "shell":
        monkeypatch.setenv("SANDBOXES_LAUNCHER", "shell")
    elif launch_binary(sandboxes_root()) is None:
        pytest.skip("no C compiler here: the shell launch is the only one")
    assert _results("always", monkeypatch) == _results("never", monkeypatch)


def _first_runs(started_ahead: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """Each command as the first run of a sandbox of its own: in a spare started ahead, or
    with ``SANDBOXES_PRESTART=0`` in a bwrap started for it. Beyond the shared list: stdin
    /dev/null (as ``subprocess.DEVNULL`` opens it), an environment and a working directory."""
    monkeypatch.setenv("SANDBOXES_PRESTART", "1" if started_ahead else "0")
    spec = SandboxSpec(output_limit_bytes=64, timeout_s=30, env={"FROM_SPEC": "s"})
    cases: list[tuple[list[str], str | None, dict[str, str] | None, str]] = [
        (argv, stdin, None, "/work") for argv, stdin in SAME_ON_BOTH_PATHS
    ]
    cases += [
        (
            ["sh", "-c", "ls -l /proc/self/fd/0 | cut -c1-10; readlink /proc/self/fd/0"],
            None,
            None,
            "/work",
        ),
        (["sh", "-c", "pwd; env | sort"], None, {"FROM_RUN": "r", "PATH": "/bin"}, "/work/sub"),
        (["sh", "-c", "wc -c"], "x" * 200_000, None, "/tmp"),
    ]
    results = []
    for argv, stdin, env, cwd in cases:
        if started_ahead:
            sandbox = open_started_ahead(spec)
        else:
            sandbox = Sandbox(spec).open()
            assert sandbox._require()._prestarted is None  # type: ignore[attr-defined]
        with sandbox:
            sandbox.write_files({"sub/f": ""})
            timeout = 0.5 if argv == SLEEPER else None
            result = sandbox.run(argv, stdin=stdin, timeout=timeout, env=env, cwd=cwd)
        results.append(_comparable(result))
        assert_nothing_left(sandbox.name)
    return results


def test_a_sandbox_started_ahead_reports_exactly_what_a_bwrap_started_for_the_run_reports(
    monkeypatch,
):
    skip_unless_sandboxes_start_ahead()
    assert _first_runs(True, monkeypatch) == _first_runs(False, monkeypatch)


@pytest.mark.parametrize("stdin", [None, "fed\n"])
def test_a_process_forked_by_the_host_does_not_hold_up_a_sandbox_started_ahead(stdin):
    """A forked child holds copies of every descriptor the host had when it forked (a
    DataLoader worker, a prefork pool): the first command must still get its whole message and
    its stdin's end, not wait for an EOF that the copies hold back."""
    skip_unless_sandboxes_start_ahead()
    sandbox = open_started_ahead(SandboxSpec(timeout_s=20))
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        with sandbox:
            result = sandbox.run(["cat"], stdin=stdin, timeout=10)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert not result.timed_out and result.exit_code == 0, result
    assert result.stdout == (stdin or "")
    assert_nothing_left(sandbox.name)


def test_a_sandbox_started_ahead_and_killed_before_its_first_run_still_runs_it():
    skip_unless_sandboxes_start_ahead()
    sandbox = open_started_ahead(SandboxSpec())
    with sandbox:
        sandbox.kill()
        assert sandbox.run(["echo", "ran"]).stdout == "ran\n"
    assert_nothing_left(sandbox.name)


def test_a_sandbox_started_ahead_but_first_run_through_a_supervisor_leaves_nothing(monkeypatch):
    """A zygote, or a sandbox told to supervise after it opened, gives its waiting bwrap up."""
    skip_unless_sandboxes_start_ahead()
    sandbox = open_started_ahead(SandboxSpec())
    with sandbox:
        sandbox._require().supervise = "always"  # type: ignore[attr-defined]
        first = sandbox.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
        assert first.exit_code == 0 and int(first.stdout) <= 4  # supervisor, sh, ls, grep
    assert_nothing_left(sandbox.name)
    sandbox = open_started_ahead(SandboxSpec())
    sandbox.close()  # never ran anything
    assert_nothing_left(sandbox.name)


def test_a_command_that_dies_at_once_gets_its_signal_note_on_every_path(monkeypatch):
    # The bwrap path's init used to wait for a background job: a job dead before the shell's
    # `wait` began got no note, one dying later did. Both paths now give it every time.
    for mode in ("never", "always"):
        monkeypatch.setenv("SANDBOXES_SUPERVISE", mode)
        with Sandbox(SandboxSpec(timeout_s=30)) as sandbox:
            results = [sandbox.run(["sh", "-c", "kill -TERM $$"]) for _ in range(12)]
        assert {(r.stderr, r.exit_code, r.signal) for r in results} == {("Terminated\n", 143, 15)}
        assert_nothing_left(sandbox.name)


def test_later_runs_of_an_episode_share_one_supervisor_that_stays_pid_1(monkeypatch):
    monkeypatch.delenv("SANDBOXES_SUPERVISE", raising=False)
    with Sandbox(SandboxSpec()) as sandbox:
        first = sandbox.run(["sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"])
        driver = sandbox._require()
        assert driver._supervisor is None  # type: ignore[attr-defined]  # one bwrap for run 1
        pids = [sandbox.run(["sh", "-c", "echo $$"]).stdout for _ in range(4)]
        supervisor = driver._supervisor  # type: ignore[attr-defined]
        assert supervisor is not None and supervisor.alive
        sandbox.run(["true"])
        assert driver._supervisor is supervisor  # type: ignore[attr-defined]
    # Run 1's pid 1 is the bwrap path's init: ours where a compiler built it (given the command
    # on its command line, or on a pipe in a sandbox started ahead), else the shell.
    assert first.stdout.startswith(
        ("/sandbox-init --init -- sh -c", "/sandbox-init --init-wait ", "/bin/sh -c")
    )
    assert pids == ["2\n", "3\n", "4\n", "5\n"]  # forks of one pid 1, not new namespaces
    assert_nothing_left(sandbox.name)


def test_a_daemon_of_a_supervised_run_is_killed_when_its_command_ends(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    with Sandbox(SandboxSpec(timeout_s=5)) as sandbox:
        started = sandbox.run(["sh", "-c", "(setsid sleep 1000 &); (sleep 1000 &); echo started"])
        after = sandbox.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
    assert started.stdout == "started\n" and not started.timed_out
    assert int(after.stdout) <= 4  # the supervisor, sh, ls and grep
    assert_nothing_left(sandbox.name)


def test_nothing_inside_can_kill_or_read_the_supervisor(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    code = (
        "import os, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
        "    os.kill(1, sig)\n"
        "for name in ('mem', 'environ', 'fd'):\n"
        "    try:\n"
        "        os.listdir('/proc/1/fd') if name == 'fd' else open(f'/proc/1/{name}', 'rb')\n"
        "        print('OPENED', name)\n"
        "    except OSError as exc:\n"
        "        print('refused', name, exc.errno)\n"
    )
    with Sandbox(SandboxSpec()) as sandbox:
        sandbox.run(["true"])
        supervisor = sandbox._require()._supervisor  # type: ignore[attr-defined]
        result = sandbox.run(["python3", "-c", code])
        again = sandbox.run(["echo", "still here"])
        assert sandbox._require()._supervisor is supervisor  # type: ignore[attr-defined]
    assert "OPENED" not in result.stdout, result
    assert result.stdout.count("refused") == 3
    assert again.stdout == "still here\n"


def test_a_supervisor_killed_from_outside_is_replaced_at_the_next_run(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    with Sandbox(SandboxSpec()) as sandbox:
        sandbox.run(["sh", "-c", "echo kept > f"])
        driver = sandbox._require()
        old = driver._supervisor  # type: ignore[attr-defined]
        driver.cgroup.kill_all()  # type: ignore[attr-defined]  # e.g. the OOM killer chose it
        result = sandbox.run(["cat", "f"])
        assert driver._supervisor is not old  # type: ignore[attr-defined]
    assert result.stdout == "kept\n"
    assert_nothing_left(sandbox.name)


def test_each_supervised_run_has_its_own_memory_limit_and_counters(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    with Sandbox(SandboxSpec(memory_mb=48)) as sandbox:
        big = sandbox.run(["python3", "-c", "x = bytearray(100 * 2**20); print('no')"])
        small = sandbox.run(["python3", "-c", "x = bytearray(16 * 2**20); print('fits')"])
    assert big.oom_killed and big.signal == 9 and big.stdout == ""
    assert big.peak_memory_mb is not None and big.peak_memory_mb <= 48 + 1
    assert small.stdout == "fits\n" and not small.oom_killed
    assert small.peak_memory_mb is not None and 16 <= small.peak_memory_mb <= 48
    assert small.cpu_s is not None and small.cpu_s > 0


def test_sysv_shared_memory_of_one_run_is_gone_in_the_next(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    make = (
        "import ctypes; libc = ctypes.CDLL(None)\n"
        "print(libc.shmget(0x5EED, 1 << 20, 0o1600) >= 0)\n"  # IPC_CREAT | 0600
    )
    with Sandbox(SandboxSpec()) as sandbox:
        made = sandbox.run(["python3", "-c", make])
        listing = sandbox.run(["sh", "-c", "tail -n +2 /proc/sysvipc/shm | wc -l"])
    assert made.stdout == "True\n"
    assert listing.stdout == "0\n"


def test_an_owner_killed_during_a_supervised_run_leaves_no_process(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        "from sandboxes import Sandbox, SandboxSpec\n"
        "sandbox = Sandbox(SandboxSpec(timeout_s=60)).open()\n"
        "sandbox.run(['true'])\n"
        "sandbox.run(['sh', '-c', 'echo running; sleep 60'],\n"
        "            on_stdout=lambda text: print(sandbox.name, flush=True))\n"
    )
    root = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "SANDBOXES_SUPERVISE": "always"},
    )
    assert owner.stdout is not None
    name = owner.stdout.readline().strip()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    # The supervisor sees its control socket close and leaves; its pid namespace goes with it.
    while any(item.startswith("process") for item in leftovers(name)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not any(item.startswith("process") for item in leftovers(name))
    from sandboxes.janitor import reap_stale

    assert name in reap_stale()
    assert_nothing_left(name)


def test_a_command_too_long_for_one_request_still_runs(monkeypatch):
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    code = "x = 1\n" * 18_000  # 108 kB of program text in one argument (execve allows 128)
    with Sandbox(SandboxSpec()) as sandbox:
        sandbox.run(["true"])
        result = sandbox.run(["python3", "-c", code + "print(x)"])
        after = sandbox.run(["echo", "and the supervisor still serves"])
    assert result.stdout == "1\n", result
    assert after.stdout == "and the supervisor still serves\n"


def test_supervised_runs_on_a_real_unified_hierarchy(monkeypatch):
    # v2 forbids processes in a group whose children take controllers: the supervisor has a
    # leaf group of its own beside each run's.
    from sandboxes import PythonZygote, cgroups

    v1, v2 = cgroups.cgroup_mounts()
    if v2 is None or not os.access(v2, os.W_OK):
        pytest.skip("no writable cgroup2 hierarchy here")
    unified = cgroups.CgroupManager(version=2)
    if unified.version != 2 or unified._v2_parent is None:
        pytest.skip(f"cgroup v2 unusable here: {unified.missing}")
    monkeypatch.setattr(cgroups, "_manager", unified)
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "always")
    spec = SandboxSpec(allow_weaker=sorted(unified.missing), timeout_s=0.5)
    with Sandbox(spec) as sandbox:
        daemon = sandbox.run(["sh", "-c", "(setsid sleep 100 &); echo started"])
        slow = sandbox.run(["sh", "-c", "(setsid sleep 100 &); sleep 100"])
        count = sandbox.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
        group_path = Path(unified._v2_parent) / sandbox.name
        # Between runs only the supervisor's group is left (each run's is removed after it).
        assert [p.name for p in group_path.iterdir() if p.is_dir()] == ["supervisor-1"]
    with PythonZygote(spec) as zygote:
        evaluated = zygote.evaluate("a.py", files={"a.py": "print(6 * 7)"})
    assert daemon.stdout == "started\n" and not daemon.timed_out
    assert slow.timed_out and slow.signal == 9
    assert int(count.stdout) <= 4
    assert evaluated.stdout == "42\n"
    assert_nothing_left(sandbox.name)  # once the reaper is done
    assert_nothing_left(zygote.name)
    assert not group_path.exists()


def test_a_sandbox_can_choose_its_path(monkeypatch):
    from sandboxes import SandboxError

    monkeypatch.delenv("SANDBOXES_SUPERVISE", raising=False)
    with Sandbox(SandboxSpec(), supervise="never") as few:
        pids = {few.run(["sh", "-c", "echo $$"]).stdout for _ in range(3)}
        assert few._require()._supervisor is None  # type: ignore[attr-defined]
    with Sandbox(SandboxSpec(), supervise="always") as many:
        first = many.run(["sh", "-c", "echo $$"]).stdout
        assert many._require()._supervisor is not None  # type: ignore[attr-defined]
    assert pids == {"2\n"}  # each run in namespaces of its own
    assert first == "2\n"
    with pytest.raises(SandboxError):
        Sandbox(SandboxSpec(), supervise="sometimes")
