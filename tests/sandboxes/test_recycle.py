"""A recycled pool sandbox (``SandboxPool(recycle=True)``): nothing of one user reaches the next.

Each case runs as user A of a sandbox that has already served a first user, then user B takes
the sandbox (the same one when A left it fit for reuse, a fresh one when the pool closed it)
and looks around: B must see exactly what the first user saw (files, directory metadata,
processes, IPC, hostname, environment, limits, priority) and must have its whole limits. The
host must be left with nothing once the pool closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import threading
import time
import uuid

import pytest

from sandboxes import SandboxError, SandboxPool, SandboxSpec
from sandboxes.workspace import sandboxes_root
from tests.sandboxes.conftest import assert_nothing_left, sandboxes_of_this_process
from tests.sandboxes.test_hostile import (
    HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE,
    HOSTILE,
    _expect,
)

SPEC = SandboxSpec(timeout_s=10, memory_mb=96, pids=32, disk_mb=16)
KEY = 0x5EED

#: What a user can observe of the state the sandbox was handed over in (run as B, and as the
#: first user for comparison). Its own process (and the shell, if any) is left out.
PROBE = textwrap.dedent(
    """
    import ctypes, json, os, resource, socket
    libc = ctypes.CDLL(None, use_errno=True)
    seen = {}
    files = []
    for top in ("/work", "/tmp", "/dev/shm"):
        for root, dirs, names in os.walk(top):
            files += [os.path.join(root, n) for n in dirs + names]
    seen["files"] = sorted(files)
    leaks = []
    for root, dirs, names in os.walk("/"):
        if root.startswith(("/proc", "/sys")):
            dirs[:] = []
            continue
        leaks += [os.path.join(root, n) for n in names if n.startswith("leak-")]
    seen["leaks"] = leaks
    seen["dirs"] = {}
    seen["times"] = {}
    for top in ("/work", "/tmp", "/dev/shm"):
        info = os.lstat(top)
        seen["dirs"][top] = [oct(info.st_mode), info.st_uid, info.st_gid, info.st_nlink,
                             sorted(os.listxattr(top))]
        seen["times"][top] = info.st_mtime_ns
    me = os.getpid()
    seen["processes"] = sorted(
        int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)
    )
    seen["sysv"] = {k: open(f"/proc/sysvipc/{k}").readlines()[1:] for k in ("shm", "sem", "msg")}
    seen["sysv get"] = [libc.shmget(SYSV_KEY, 0, 0), libc.semget(SYSV_KEY, 0, 0),
                        libc.msgget(SYSV_KEY, 0)]
    seen["mq"] = [libc.mq_open(b"/leak", 2), ctypes.get_errno()]
    seen["hostname"] = [socket.gethostname(), os.uname().nodename]
    # (PWD: the bwrap path's init shell exports it, so a fresh sandbox's first run has it.)
    seen["env"] = {k: v for k, v in os.environ.items() if k != "PWD"}
    seen["cwd"] = os.getcwd()
    seen["limits"] = open("/proc/self/limits").read()
    seen["priority"] = [os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)),
                        os.sched_getscheduler(0)]
    seen["umask"] = [line for line in open("/proc/self/status") if line.startswith("Umask")]
    print(json.dumps(seen))
    """
).replace("SYSV_KEY", str(KEY))


def _probe(sandbox) -> dict:
    result = sandbox.run(["python3", "-c", PROBE])
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def _through_a_recycled_sandbox(
    attack: list[str], *, recycled: bool, timeout: float | None = None, spec: SandboxSpec = SPEC
):
    """Runs ``attack`` as user A of a used recycled sandbox; returns A's result and B's view."""
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(spec) as first:
            name = first.name
            before = _probe(first)
        with pool.acquire(spec) as user_a:
            assert user_a.name == name  # A really is a second user
            result = user_a.run(attack, timeout=timeout)
        with pool.acquire(spec) as user_b:
            assert (user_b.name == name) is recycled, (user_b.name, name, result)
            after = _probe(user_b)
            b_name = user_b.name
    if not recycled:  # a fresh sandbox was made at another moment
        before.pop("times")
        after.pop("times")
    assert after == before, result
    assert_nothing_left(name)
    assert_nothing_left(b_name)
    assert not sandboxes_of_this_process()
    return result, after


def _sh(script: str) -> list[str]:
    return ["sh", "-c", textwrap.dedent(script)]


def _py(code: str, *args: str) -> list[str]:
    return ["python3", "-c", textwrap.dedent(code), *args]


# -- files ------------------------------------------------------------------------------------
def test_files_in_work_tmp_and_dev_shm_and_their_metadata_do_not_reach_the_next_user():
    result, _ = _through_a_recycled_sandbox(
        _sh(
            """
            set -e
            echo a > /work/leak-a; echo b > /tmp/leak-b; echo c > /dev/shm/leak-c
            mkdir -p /work/.d/e /tmp/deep/er; echo x > /work/.d/e/leak-x; echo h > /work/.hidden
            ln -s /etc/passwd /work/link; ln -s /work/.hidden /tmp/link2; mkfifo /tmp/fifo
            ln /work/leak-a /work/hardlink
            python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/tmp/sock")'
            chmod 000 /work/.d; chmod 0777 /work /tmp; chmod 1777 /dev/shm
            touch -d 2001-02-03 /work /tmp /dev/shm
            python3 -c 'import os; os.setxattr("/work", "user.leak", b"A was here")'
            python3 -c 'import os; os.setxattr("/tmp", "user.leak", b"A was here")'
            echo done
            """
        ),
        recycled=True,
    )
    assert result.stdout == "done\n", result


def test_a_file_held_open_and_unlinked_by_a_background_process_is_gone():
    result, _ = _through_a_recycled_sandbox(
        _sh(
            """
            python3 -c '
            import os, time
            f = open("/tmp/leak-held", "w"); f.write("x" * 4000000); f.flush()
            os.unlink("/tmp/leak-held")
            m = open("/dev/shm/leak-mapped", "w+b"); m.truncate(1 << 20)
            import mmap; region = mmap.mmap(m.fileno(), 1 << 20); os.unlink("/dev/shm/leak-mapped")
            print("holding", flush=True); time.sleep(1000)' &
            sleep 0.5; echo started
            """
        ),
        recycled=True,
    )
    assert "started" in result.stdout, result


def test_a_full_disk_is_empty_again_for_the_next_user():
    fill = """
        import os
        written = 0
        try:
            for i in range(100):
                with open(f"/work/leak-fill{i}", "wb") as f:
                    for _ in range(4):
                        f.write(b"x" * 1024 * 1024)
                        written += 1
        except OSError as exc:
            print("full after MB:", written)
        """
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            first = user_a.run(_py(fill))
        with pool.acquire(SPEC) as user_b:
            assert user_b.name == name
            again = user_b.run(_py(fill))
    assert first.stdout == again.stdout and first.stdout.startswith("full after MB: 1"), again
    assert_nothing_left(name)


def test_a_tree_too_deep_to_remove_calmly_gets_the_sandbox_discarded():
    result, after = _through_a_recycled_sandbox(
        _py(
            """
            import os
            os.chdir("/work")
            for _ in range(3000):
                os.mkdir("d")
                os.chdir("d")
            open("leak-deep", "w").close()
            print("deep")
            """
        ),
        recycled=False,  # Python's rmtree recurses per level: the reset fails, so: discard
    )
    assert result.stdout == "deep\n", result
    assert after["files"] == []


def test_writes_anywhere_else_fail_so_nothing_outside_the_cleared_directories_survives():
    result, after = _through_a_recycled_sandbox(
        _py(
            """
            import os
            made = []
            for root, dirs, _ in os.walk("/"):
                if root.startswith(("/proc", "/sys")):
                    dirs[:] = []
                    continue
                try:
                    open(os.path.join(root, "leak-anywhere"), "w").close()
                    made.append(root)
                except OSError:
                    pass
            print(sorted(r for r in made if not r.startswith(("/work/", "/tmp/"))))
            """
        ),
        recycled=True,
    )
    assert result.stdout == "['/dev/shm', '/tmp', '/work']\n", result
    assert after["leaks"] == []


# -- processes --------------------------------------------------------------------------------
def test_background_daemons_and_processes_that_ignore_sigterm_do_not_survive():
    marker = f"leak-{uuid.uuid4().hex}"
    result, after = _through_a_recycled_sandbox(
        _sh(
            f"""
            nohup sleep 1000 >/dev/null 2>&1 &
            setsid sh -c 'sleep 1000 & exit' {marker} &
            python3 -c '
            import os, signal, sys, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    signal.signal(signal.SIGHUP, signal.SIG_IGN)
                    time.sleep(1000)
                os._exit(0)
            os.wait()' {marker}
            python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);
            time.sleep(1000)' {marker} &
            sleep 0.3; echo started
            """
        ),
        recycled=True,
    )
    assert "started" in result.stdout, result
    assert after["processes"] == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# -- ipc, hostname, environment, pid 1 --------------------------------------------------------
def test_sysv_ipc_and_posix_message_queues_do_not_reach_the_next_user():
    result, after = _through_a_recycled_sandbox(
        _py(
            f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            shm = libc.shmget({KEY}, 1 << 20, 0o1666)
            sem = libc.semget({KEY}, 1, 0o1666)
            msg = libc.msgget({KEY}, 0o1666)
            print("sysv", shm >= 0, sem >= 0, msg >= 0)
            print("mq", libc.mq_open(b"/leak", 0o100 | 2, 0o666, None), ctypes.get_errno())
            """
        ),
        recycled=True,
    )
    assert result.stdout == "sysv True True True\nmq -1 1\n", result  # mq_open: EPERM
    assert after["sysv"] == {"shm": [], "sem": [], "msg": []}
    assert after["sysv get"] == [-1, -1, -1]


def test_hostname_environment_cwd_limits_and_priority_do_not_carry_over():
    result, after = _through_a_recycled_sandbox(
        _sh(
            """
            hostname leak 2>/dev/null && echo hostname changed
            python3 -c 'import socket; socket.sethostname("leak")' 2>/dev/null && echo changed
            export LEAK=1; echo 'export LEAK=1' > /work/.profile; cd /tmp; umask 000
            ulimit -n 16; renice -n 19 -p $$ >/dev/null
            prlimit --pid 1 --nofile=8:8 2>/dev/null && echo pid 1 limited
            renice -n 19 -p 1 >/dev/null 2>&1 && echo pid 1 reniced
            taskset -p -c 0 1 >/dev/null 2>&1 && echo pid 1 pinned
            echo done
            """
        ),
        recycled=True,
    )
    assert result.stdout == "done\n", result
    assert after["hostname"] == ["sandbox", "sandbox"]
    assert "LEAK" not in after["env"] and after["cwd"] == "/work"


# -- limits: a user that hits one gets the sandbox discarded ----------------------------------
def test_a_fork_bomb_gets_the_sandbox_discarded_and_the_next_user_has_all_its_pids():
    bomb = """
        import os, time
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(1000)
            except OSError:
                print("fork refused", flush=True)
                time.sleep(1000)
        """
    result, _ = _through_a_recycled_sandbox(_py(bomb), recycled=False, timeout=1.5)
    assert result.timed_out and "fork refused" in result.stdout
    # A bomb that stops by itself (no timeout) still hit the pids limit: discarded too.
    calm_bomb = """
        import os, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(1000)
                children += 1
        except OSError:
            print("fork refused after", children > 20)
        """
    result, _ = _through_a_recycled_sandbox(_py(calm_bomb), recycled=False)
    assert result.stdout == "fork refused after True\n", result
    with SandboxPool(max_active=1, recycle=True) as pool, pool.acquire(SPEC) as user_b:
        forks = user_b.run(
            _py(
                """
                    import os, time
                    children = []
                    for _ in range(25):
                        pid = os.fork()
                        if pid == 0:
                            time.sleep(5)
                            os._exit(0)
                        children.append(pid)
                    print(len(children))
                    """
            )
        )
    assert "25" in forks.stdout, forks


def test_a_memory_hog_gets_the_sandbox_discarded_and_the_next_user_has_all_its_memory():
    hog = "x = bytearray(400 * 2**20)"
    result, _ = _through_a_recycled_sandbox(_py(hog), recycled=False)
    assert result.oom_killed, result
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            user_a.run(_py("x = bytearray(80 * 2**20); x[::4096] = b'y' * len(x[::4096])"))
        with pool.acquire(SPEC) as user_b:
            assert user_b.name == name  # under its limit: recycled
            fits = user_b.run(_py("x = bytearray(80 * 2**20); x[::4096] = b'y' * len(x[::4096])"))
    assert fits.ok and not fits.oom_killed, fits


def test_a_timeout_endless_output_or_a_kill_gets_the_sandbox_discarded():
    _through_a_recycled_sandbox(_py("import time; time.sleep(100)"), recycled=False, timeout=0.3)
    _through_a_recycled_sandbox(
        _py("import sys\nwhile True: sys.stdout.write('y' * 65536)"), recycled=False, timeout=5
    )
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            threading.Timer(0.3, user_a.kill).start()
            killed = user_a.run(["sleep", "100"])
        with pool.acquire(SPEC) as user_b:
            assert user_b.name != name
    assert killed.signal == 9
    assert_nothing_left(name)


# -- the hand-over itself ---------------------------------------------------------------------
def test_a_users_handle_is_dead_after_release_even_from_another_thread():
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
        with pytest.raises(SandboxError):
            user_a.run(["true"])
        with pytest.raises(SandboxError):
            user_a.write_files({"leak-late": "x"})
        with pool.acquire(SPEC) as user_b:
            assert user_b.name == name
            user_a.kill()  # A's stray kill does not reach B's run
            assert user_b.run(["sh", "-c", "sleep 0.2; ls -A"]).stdout == ""


def test_a_release_while_a_users_thread_still_runs_discards_the_sandbox():
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            worker = threading.Thread(target=lambda: user_a.run(["sleep", "100"]), daemon=True)
            worker.start()
            time.sleep(0.3)
        worker.join(10)
        assert not worker.is_alive()
        with pool.acquire(SPEC) as user_b:
            assert user_b.name != name
    assert_nothing_left(name)


def test_a_user_that_closes_its_sandbox_gets_it_removed_and_the_next_a_fresh_one():
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            user_a.close()
        assert_nothing_left(name)
        with pool.acquire(SPEC) as user_b:
            assert user_b.name != name
            assert user_b.run(["true"]).ok


def test_each_sandbox_serves_at_most_max_uses_users_and_specs_are_not_mixed():
    with SandboxPool(max_active=1, recycle=True, max_uses=3) as pool:
        names = []
        for _ in range(4):
            with pool.acquire(SPEC) as user:
                names.append(user.name)
        assert names[0] == names[1] == names[2] != names[3]
        other = SandboxSpec(timeout_s=10, memory_mb=64, pids=32, disk_mb=16, files={"f": "1"})
        with pool.acquire(other) as user:
            assert user.name != names[3]
            assert user.read_file("f") == b"1"
            user.write_files({"f": "changed"})
        with pool.acquire(other) as user:
            assert user.read_file("f") == b"1"  # the spec's files, as on a fresh sandbox
    assert not sandboxes_of_this_process()


def test_the_reset_refuses_a_workspace_that_is_not_proven_empty():
    # Something on the sandbox's tmpfs that clearing /work, /tmp and /dev/shm cannot see (here
    # planted from the host) makes the tmpfs fuller than when made: the sandbox is discarded.
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(SPEC) as user_a:
            name = user_a.name
            (sandboxes_root() / name / "hidden").write_bytes(b"x" * 10000)
        with pool.acquire(SPEC) as user_b:
            assert user_b.name != name
    assert_nothing_left(name)


def test_network_loopback_and_other_unrecyclable_specs_get_a_fresh_sandbox_each_time():
    spec = SandboxSpec(network="loopback")
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(spec) as first:
            name = first.name
        with pool.acquire(spec) as second:
            assert second.name != name
    assert not sandboxes_of_this_process()


def test_recycling_works_through_acquire_async_and_run():
    async def main() -> list[str]:
        with SandboxPool(max_active=2, recycle=True) as pool:
            results = await asyncio.gather(
                *(pool.run_async(SPEC, ["sh", "-c", "ls -A; echo x > f"]) for _ in range(6))
            )
            seen = [r.stdout for r in results]
            seen.append(pool.run(SPEC, ["sh", "-c", "ls -A"]).stdout)
            return seen

    assert asyncio.run(main()) == [""] * 7
    assert not sandboxes_of_this_process()


# -- every hostile program, as a recycled sandbox's second user -------------------------------
#: The first user ran two commands (pids 2 and 3), so A's program is pid 4: pid numbers go on
#: counting in a recycled sandbox, as in a zygote.
_THIRD_RUN_CHECKS = {
    "reading the host environment and /proc/1/environ": _expect("processes visible: [1, 4]"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_in_a_recycled_sandbox_ends_safely_and_the_next_user_sees_nothing(
    name, canary
):
    case = HOSTILE[name]
    marker = f"hostile-{uuid.uuid4().hex}"
    spec = SandboxSpec(**{"timeout_s": 5, "memory_mb": 128, "pids": 32, **case.spec})
    with SandboxPool(max_active=1, recycle=True) as pool:
        with pool.acquire(spec) as first:
            sandboxes = {first.name}
            assert first.run(["true"]).exit_code == 0
            before = _probe(first)
        with pool.acquire(spec) as user_a:
            sandboxes.add(user_a.name)
            result = user_a.run(
                ["python3", "-c", textwrap.dedent(case.code), marker],
                stdin=case.stdin,
                timeout=case.timeout,
            )
            recyclable = spec.network == "none"
            check = _THIRD_RUN_CHECKS.get(name, case.check) if recyclable else case.check
            check(result)
        with pool.acquire(spec) as user_b:
            sandboxes.add(user_b.name)
            after = _probe(user_b)
    if len(sandboxes) > 1:
        before.pop("times")
        after.pop("times")
    assert after == before, (name, result)
    assert canary not in result.stdout and canary not in result.stderr
    for sandbox in sandboxes:
        assert_nothing_left(sandbox, marker)
    assert not any(p.exists() for p in HOST_PATHS_THE_SANDBOX_TRIES_TO_WRITE)
