"""PythonZygote: forked evaluations that behave like ``python3 -I`` and share nothing."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from sandboxes import PythonZygote, SandboxError, SandboxSpec
from tests.sandboxes.conftest import assert_nothing_left

PROGRAMS = {
    "prints.py": "import sys; print('out', sys.argv[1:], __name__); print('err', file=sys.stderr)",
    "exits.py": "import sys; sys.exit(4)",
    "exit_message.py": "raise SystemExit('bad input')",
    "raises.py": "def g():\n    raise ValueError('boom')\ng()",
    "syntax.py": "def f(:\n",
    "reads.py": "import sys; print(sys.stdin.read()[::-1])",
    "atexit_and_threads.py": (
        "import atexit, threading, time\n"
        "atexit.register(print, 'at exit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), print('thread done'))).start()\n"
    ),
}


def test_an_evaluation_reports_what_python3_minus_I_reports(tmp_path):
    with PythonZygote(SandboxSpec()) as zygote:
        for name, code in PROGRAMS.items():
            result = zygote.evaluate(name, "x", files={name: code}, stdin="abc")
            (tmp_path / name).write_text(code)
            bare = subprocess.run(
                ["python3", "-I", name, "x"],
                input="abc",
                capture_output=True,
                text=True,
                cwd=tmp_path,
                check=False,
            )
            assert (result.stdout, result.stderr, result.exit_code) == (
                bare.stdout,
                bare.stderr.replace(str(tmp_path), "/work"),
                bare.returncode,
            ), name


def test_no_evaluation_sees_the_files_processes_or_memory_of_another():
    meddle = textwrap.dedent(
        """
        import json, os, subprocess, sys, builtins
        open('/work/left.txt', 'w').write('secret')
        open('/tmp/left.txt', 'w').write('secret')
        open('/dev/shm/left', 'w').write('secret')
        json.dumps = lambda *a, **k: 'TAMPERED'
        builtins.print = None
        sys.modules['math'] = None
        subprocess.Popen(['sleep', '1000'], start_new_session=True)
        os.chmod('/work', 0)
        """
    )
    check = textwrap.dedent(
        """
        import json, math, os
        print(json.dumps([1]), math.sqrt(4), sorted(os.listdir('/work')),
              os.listdir('/tmp'), os.listdir('/dev/shm'))
        print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])
        """
    )
    with PythonZygote(SandboxSpec(files={"given.txt": "each time"})) as zygote:
        assert zygote.evaluate("meddle.py", files={"meddle.py": meddle}).exit_code == 0
        result = zygote.evaluate("check.py", files={"check.py": check})
    assert result.stdout == "[1] 2.0 ['check.py', 'given.txt'] [] []\nTrue\n", result
    assert_nothing_left(zygote.name)


def test_only_work_tmp_and_dev_shm_take_writes_so_nothing_else_outlives_an_evaluation():
    # /dev is a tmpfs of bwrap's own: were it writable, a file there would reach the next
    # evaluation (only /work, /tmp and /dev/shm are emptied between evaluations).
    probe = textwrap.dedent(
        """
        import os
        writable = []
        for root, dirs, _ in os.walk('/'):
            if root.startswith(('/proc', '/sys')):
                dirs[:] = []
                continue
            try:
                open(os.path.join(root, '.probe'), 'w').close()
            except OSError:
                continue
            os.unlink(os.path.join(root, '.probe'))
            if not root.startswith(('/work/', '/tmp/')):
                writable.append(root)
        with open('/dev/null', 'w') as null:
            null.write('device nodes still take writes')
        print(sorted(writable))
        """
    )
    with PythonZygote(SandboxSpec()) as zygote:
        result = zygote.evaluate("probe.py", files={"probe.py": probe})
    assert result.stdout == "['/dev/shm', '/tmp', '/work']\n", result


def test_limits_apply_to_each_evaluation_and_the_zygote_survives_them():
    with PythonZygote(SandboxSpec(memory_mb=48, timeout_s=5)) as zygote:
        oom = zygote.evaluate("m.py", files={"m.py": "x = bytearray(200 * 2**20)"})
        slow = zygote.evaluate("s.py", files={"s.py": "while True: pass"}, timeout=0.3)
        crash = zygote.evaluate("c.py", files={"c.py": "import os; os.abort()"})
        fine = zygote.evaluate("f.py", files={"f.py": "print('fine')"})
    assert oom.oom_killed and oom.signal == 9
    assert slow.timed_out and slow.signal == 9 and slow.exit_code == 137
    assert crash.signal == 6 and crash.exit_code == 134
    assert fine.stdout == "fine\n" and fine.ok
    assert fine.cpu_s is not None and fine.peak_memory_mb is not None


def test_sysv_ipc_does_not_carry_over_and_posix_queues_are_refused():
    make = textwrap.dedent(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5EED, 1 << 20, 0o1600) >= 0)
        print(libc.mq_open(b"/q", 0o100 | 2, 0o600, None), ctypes.get_errno())
        """
    )
    with PythonZygote(SandboxSpec()) as zygote:
        made = zygote.evaluate("make.py", files={"make.py": make})
        seen = zygote.evaluate(
            "see.py", files={"see.py": "print(len(open('/proc/sysvipc/shm').readlines()))"}
        )
    assert made.stdout == "True\n-1 1\n", made  # mq_open: EPERM
    assert seen.stdout == "1\n"  # the header line only


def test_bad_arguments_are_refused():
    with pytest.raises(SandboxError):
        PythonZygote(SandboxSpec(driver="docker"))
    with pytest.raises(SandboxError):
        PythonZygote(preload="json")
    with pytest.raises(SandboxError):
        PythonZygote(python="python3")
    with pytest.raises(SandboxError, match="did not start"):
        PythonZygote(python="/no/such/python").open()
    with pytest.raises(SandboxError, match="no_such_module"):
        PythonZygote(preload=["no_such_module"], zygote_memory_mb=128).open()
    with pytest.raises(SandboxError):
        PythonZygote(zygote_memory_mb=8)
    with PythonZygote(SandboxSpec()) as zygote:
        with pytest.raises(SandboxError):
            zygote.evaluate("")
        with pytest.raises(SandboxError):
            zygote.evaluate("a.py", timeout=0)
        missing = zygote.evaluate("missing.py")
    assert missing.exit_code == 2 and "missing.py" in missing.stderr
    with pytest.raises(SandboxError):
        zygote.evaluate("a.py")
    assert_nothing_left(zygote.name)


def test_killing_an_evaluation_from_another_thread_keeps_the_zygote_and_closing_ends_all():
    import threading
    import time

    zygote = PythonZygote(SandboxSpec(timeout_s=60)).open()
    results = []
    sleeper = {"s.py": "import time; print('asleep', flush=True); time.sleep(60)"}

    def evaluate() -> None:
        results.append(zygote.evaluate("s.py", files=sleeper))

    for ending in (zygote.kill, zygote.close):
        runner = threading.Thread(target=evaluate)
        runner.start()
        time.sleep(0.5)
        ending()
        runner.join(timeout=20)
        assert not runner.is_alive()
    assert [(r.signal, r.timed_out, r.stderr) for r in results] == [(9, False, "")] * 2
    assert_nothing_left(zygote.name)


def test_a_zygote_can_run_an_images_interpreter(monkeypatch):
    import os
    import shutil
    from pathlib import Path

    from sandboxes import ImageSpec

    cache = Path("/var/tmp") / f"sandboxes-zygote-images-{os.getpid()}"
    monkeypatch.setenv("SANDBOXES_IMAGE_CACHE", str(cache))
    image = ImageSpec(
        name="zygote-venv",
        files={"tool.py": "def shout(s):\n    return s.upper()\n"},
        setup="python3 -m venv --without-pip /image/venv && "
        "cp tool.py /image/venv/lib/python3*/site-packages/",
    )
    try:
        spec = SandboxSpec(image=image)
        with PythonZygote(spec, python="/image/venv/bin/python", preload=["tool"]) as zygote:
            result = zygote.evaluate(
                "a.py", files={"a.py": "import sys, tool; print(tool.shout('hi'), sys.prefix)"}
            )
        assert result.stdout == "HI /image/venv\n", result
        assert_nothing_left(zygote.name)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def test_a_zygote_starts_no_bwrap_ahead_that_it_would_give_up(monkeypatch):
    """A zygote's first run is its supervisor: it takes storage made ahead, never a spare whose
    bwrap waits for a first command, and leaves its spec only spares of that kind."""
    from sandboxes import Sandbox, reaper
    from sandboxes.bwrap import BwrapDriver

    spec = SandboxSpec(memory_mb=96)
    started: list[str] = []
    prestart = BwrapDriver._prestart

    def counting(self, *args):  # type: ignore[no-untyped-def]
        started.append(self.name)
        return prestart(self, *args)

    monkeypatch.setattr(BwrapDriver, "_prestart", counting)
    for _ in range(2):  # the second takes what the first left
        with PythonZygote(spec) as zygote:
            assert zygote.evaluate("a.py", files={"a.py": "print(6 * 7)"}).stdout == "42\n"
            assert zygote._sandbox._require()._prestarted is None  # type: ignore[attr-defined]
        assert reaper.drain(timeout=30)
        assert_nothing_left(zygote.name)
    assert started == []
    # A plain sandbox of the same spec still gets its first bwrap started ahead, where this
    # machine can (its spares are of another shape than the zygote's).
    with Sandbox(spec) as sandbox:
        assert sandbox.run(["true"]).exit_code == 0
    assert reaper.drain(timeout=30)
