"""``SANDBOXES_LAUNCHER=native``: launch.c sets the sandbox up from bwrap's own arguments.

The native path must give exactly the sandbox bwrap gives (namespaces, mounts and their flags,
id maps, capabilities, no_new_privs, seccomp, user namespaces disabled, hostname, environment,
working directory, devices, limits), with no bwrap process anywhere, and every hostile program
must end as safely on it. The whole sandboxes suite also passes with the variable set.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandboxes import Sandbox, SandboxSpec
from sandboxes.bwrap import bwrap_path, launch_binary
from sandboxes.workspace import sandboxes_root
from tests.sandboxes.conftest import assert_nothing_left
from tests.sandboxes.test_hostile import HOSTILE, _run_hostile


@pytest.fixture(autouse=True)
def _needs_the_launcher() -> None:
    if launch_binary(sandboxes_root()) is None:
        pytest.skip("no C compiler here: no launcher, so no native launch")


#: What a command can see of its sandbox. Numbers that differ between any two sandboxes
#: (mount ids, pipe inodes, times, names) are taken out below.
INTROSPECT = r"""
id; hostname; pwd; echo "PWD=$PWD"; env | sort
ls -la / /dev | awk '{print $1, $3, $4, $NF}'
cat /proc/self/uid_map /proc/self/gid_map /proc/self/setgroups
grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status
awk '{ $1 = $2 = $3 = ""; print }' /proc/self/mountinfo
cat /proc/self/cgroup
tr '\0' ' ' </proc/1/cmdline; echo
ls /proc/self/fd
cat /proc/sys/user/max_user_namespaces
unshare -U true 2>/dev/null; echo "unshare user: $?"
ulimit -a; umask
cat /proc/net/dev | awk 'NR > 2 {print $1}'
for d in / /usr /etc /dev /proc/sys /work /tmp /dev/shm; do
    touch "$d/.probe" 2>/dev/null && echo "$d writable" || echo "$d read-only"
done
python3 -c "import socket; s = socket.socket(socket.AF_UNIX); s.bind('\0probe'); print('abstract')"
python3 -c "import socket; socket.socket()" 2>&1 | tail -1
"""


def _introspect(monkeypatch: pytest.MonkeyPatch, launcher: str, supervise: str) -> list[str]:
    monkeypatch.setenv("SANDBOXES_LAUNCHER", launcher)
    monkeypatch.setenv("SANDBOXES_SUPERVISE", supervise)
    with Sandbox(SandboxSpec(timeout_s=60, env={"FROM_SPEC": "x"})) as sandbox:
        result = sandbox.run(["sh", "-c", INTROSPECT])
    assert result.exit_code == 0, result
    assert result.stderr == "", result
    assert_nothing_left(sandbox.name)
    text = re.sub(r"sb-[0-9a-f-]+", "SANDBOX", result.stdout)
    text = re.sub(r"sandbox-launch-[0-9a-f]+", "LAUNCHER", text)
    return text.splitlines()


@pytest.mark.parametrize("supervise", ["never", "always"])
def test_a_native_sandbox_is_exactly_what_bwrap_makes(supervise, monkeypatch):
    """First runs (an init as pid 1, started ahead or not) and supervised runs alike."""
    native = _introspect(monkeypatch, "native", supervise)
    assert native == _introspect(monkeypatch, "bwrap", supervise)
    # The comparison is only worth something if the defences are there on both.
    for line in ("CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1",
                 "Seccomp:\t2", "uid=65534(sandbox) gid=65534(sandbox) groups=65534(sandbox)",
                 "unshare user: 1", "/ read-only", "/usr read-only", "/work writable",
                 "abstract", "PermissionError: [Errno 13] Permission denied"):  # fmt: skip
        if line.startswith("uid=") and os.geteuid() != 0:
            continue
        assert line in native, (line, native)


def _setup_programs(monkeypatch: pytest.MonkeyPatch, launcher: str) -> set[str]:
    """The programs running in a sandbox's cgroup while its command sleeps."""
    monkeypatch.setenv("SANDBOXES_LAUNCHER", launcher)
    monkeypatch.setenv("SANDBOXES_PRESTART", "0")
    monkeypatch.setenv("SANDBOXES_SUPERVISE", "never")  # pid 1 is the init, not a supervisor
    sandbox = Sandbox(SandboxSpec(timeout_s=60)).open()
    try:
        group = sandbox._require().cgroup  # type: ignore[attr-defined]
        runner = threading.Thread(target=sandbox.run, args=(["sleep", "2"],))
        runner.start()
        programs: set[str] = set()
        deadline = time.monotonic() + 10
        while "sleep" not in programs and time.monotonic() < deadline:
            time.sleep(0.01)
            for pid in group.pids():
                try:
                    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                except OSError:
                    continue
                programs.add(os.fsdecode(argv0))
        runner.join(timeout=30)
    finally:
        sandbox.close()
    assert_nothing_left(sandbox.name)
    return programs


def test_the_native_launch_starts_no_bwrap(monkeypatch):
    launch = launch_binary(sandboxes_root())
    assert bwrap_path() in _setup_programs(monkeypatch, "bwrap")
    native = _setup_programs(monkeypatch, "native")
    assert bwrap_path() not in native
    assert {launch, "/sandbox-init", "sleep"} <= native, native


#: The least a native launch accepts (every namespace, pid 1, a hostname), and a command.
MINIMAL_ARGS = [
    "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
    "--unshare-cgroup-try", "--hostname", "sandbox", "--as-pid-1",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
]  # fmt: skip


def _native_launch(args: list[str], **popen: object) -> subprocess.CompletedProcess[str]:
    """``sandbox-launch --native`` with bwrap's ARGS, dropping to nobody first when root."""
    launch = launch_binary(sandboxes_root())
    assert launch is not None
    ids = ["--ids", "65534", "65534"] if os.geteuid() == 0 else []
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [launch, *ids, "--native", "--", bwrap_path(), *args],
        capture_output=True,
        text=True,
        **popen,
    )


def _refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 125, result
    assert result.stdout == "" and "sandbox-launch: native:" in result.stderr, result


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda args: [a for a in args if a != "--unshare-net"], id="a namespace less"),
        pytest.param(
            lambda args: ["--unshare-user" if a == "--unshare-net" else a for a in args],
            id="one namespace twice, another not",
        ),
        pytest.param(lambda args: [a for a in args if a != "--as-pid-1"], id="not as pid 1"),
        pytest.param(lambda args: ["--share-net", *args], id="an option it does not know"),
        pytest.param(lambda args: ["--cap-add", "ALL", *args], id="capabilities asked for"),
        # bwrap puts any destination after "/newroot/": these two would land beside the new
        # root, in the set-up tmpfs that also holds the host's tree as /oldroot.
        pytest.param(lambda args: ["--dir", "/../escape", *args], id="a destination with .."),
        pytest.param(lambda args: ["--dir", "escape", *args], id="a relative destination"),
        pytest.param(lambda args: ["--hostname", "other", *args], id="a single option twice"),
        # 2^32 + 1 as an int is 1: the status would go to stdout, and the sandbox lose it.
        pytest.param(
            lambda args: ["--json-status-fd", "4294967297", *args], id="a descriptor past int"
        ),
    ],
)
def test_the_native_launch_refuses_arguments_it_was_not_written_for(change):
    """Anything but what bwrap.py writes stops the launch before the namespaces exist."""
    args = [*MINIMAL_ARGS, "--", "/bin/sh", "-c", "echo ran"]
    ok = _native_launch(args)
    assert (ok.returncode, ok.stdout) == (0, "ran\n"), ok
    _refused(_native_launch(change(args)))


def test_a_descriptor_option_given_twice_is_refused_not_leaked_into_the_sandbox():
    """bwrap keeps the last ``--json-status-fd``; the first, never closed, would be open in
    the sandbox's command (a pipe to the host)."""
    first_read, first = os.pipe()
    second_read, second = os.pipe()
    try:
        args = [*MINIMAL_ARGS, "--proc", "/proc", "--", "/bin/ls", "/proc/self/fd"]
        once = _native_launch(["--json-status-fd", str(second), *args], pass_fds=(second,))
        assert once.returncode == 0 and str(second) not in once.stdout.split(), once
        twice = _native_launch(
            ["--json-status-fd", str(first), "--json-status-fd", str(second), *args],
            pass_fds=(first, second),
        )
        assert str(first) not in twice.stdout.split(), twice
        _refused(twice)
    finally:
        for fd in (first_read, first, second_read, second):
            os.close(fd)


def test_a_destination_through_a_symlink_a_run_left_is_refused():
    """A run leaves, in its writable /work, a link to the host's tree as the set-up sees it
    (``/oldroot/...``); a later launch on that workspace with a destination below the link
    must not follow it (bwrap would, and make the directory on the host)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as base:  # noqa: S108 - reachable by nobody
        os.chmod(base, 0o755)  # noqa: S103 - the launch runs as nobody and must see in
        work = Path(base) / "work"
        host = Path(base) / "host"  # a host directory the sandbox's uid may write
        work.mkdir()
        host.mkdir()
        if os.geteuid() == 0:
            os.chown(host, 65534, 65534)
        (work / "link").symlink_to(f"/oldroot{host}")
        for dest in ("/work/link/planted", "/work/link"):
            args = [*MINIMAL_ARGS, "--bind", str(work), "/work", "--dir", dest]
            _refused(_native_launch([*args, "--", "/bin/sh", "-c", "echo ran"]))
            assert list(host.iterdir()) == []
        assert (work / "link").is_symlink()


@pytest.mark.parametrize("count", [b"2", b"18446744073709551615", b"18446744073709551614"])
def test_the_init_refuses_a_command_whose_environment_count_is_past_its_fields(count):
    """``--init-wait``'s message (``launch.c``): a count of environment entries past the
    fields sent is malformed, however large (one near 2^64 once wrapped the bound check and
    the init wrote past its array)."""
    launch = launch_binary(sandboxes_root())
    assert launch is not None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        init = subprocess.Popen(
            [launch, "--init-wait", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        theirs.close()
        fields = b"/\0" + count + b"\0true\0"
        ours.sendall(struct.pack("=Q", len(fields)) + fields)
        out, err = init.communicate(timeout=30)
    assert (init.returncode, out, err) == (125, b"", b"sandbox-init: malformed command\n")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_in_a_native_sandbox_ends_safely_and_leaves_nothing(
    name, canary, monkeypatch
):
    monkeypatch.setenv("SANDBOXES_LAUNCHER", "native")
    _run_hostile(HOSTILE[name], canary)
