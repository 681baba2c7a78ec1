"""Nothing in a sandbox may change pid 1's limits, priority or scheduling.

Those calls check only that the uids match, and pid 1's children inherit what it has: without
the seccomp rule a command could lower the supervisor's open-file limit or CPU priority for
every later run, i.e. for a zygote's next sample or a recycled pool sandbox's next user.
"""

from __future__ import annotations

import pytest

from sandboxes import PythonZygote, Sandbox, SandboxSpec

ATTACK = r"""
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}[os.uname().machine]

def ioprio(which, who):
    if libc.syscall(IOPRIO_SET, which, who, 3 << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")

attempts = {
    "prlimit": lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3)),
    "prlimit-fsize": lambda: resource.prlimit(1, resource.RLIMIT_FSIZE, (0, 0)),
    "renice": lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),
    "renice-group": lambda: os.setpriority(os.PRIO_PGRP, 1, 19),
    "renice-uid": lambda: os.setpriority(os.PRIO_USER, 0, 19),
    "affinity": lambda: os.sched_setaffinity(1, {0}),
    "idle-policy": lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)),
    "ioprio": lambda: ioprio(1, 1),
    "ioprio-uid": lambda: ioprio(3, 0),
}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "CHANGED")
    except PermissionError:
        print(name, "refused")
# Its own settings stay its own business.
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
os.nice(5)
os.sched_setaffinity(0, {0})
print("own ok")
"""
STATE = r"""
import os, resource
print(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_FSIZE))
print(os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0))
"""


def _check(attack_out: str, before: str, after: str) -> None:
    assert "CHANGED" not in attack_out, attack_out
    assert attack_out.count("refused") == 9 and "own ok" in attack_out, attack_out
    assert before == after


@pytest.mark.parametrize("supervise", ["never", "always"])
def test_a_command_cannot_change_pid_1s_limits_or_priority(supervise):
    with Sandbox(SandboxSpec(), supervise=supervise) as sandbox:
        before = sandbox.run(["python3", "-c", STATE]).stdout
        attack = sandbox.run(["python3", "-c", ATTACK])
        after = sandbox.run(["python3", "-c", STATE]).stdout
    _check(attack.stdout, before, after)


def test_a_zygote_evaluation_cannot_change_the_next_ones_limits_or_priority():
    with PythonZygote(SandboxSpec()) as zygote:
        before = zygote.evaluate("s.py", files={"s.py": STATE}).stdout
        attack = zygote.evaluate("a.py", files={"a.py": ATTACK})
        after = zygote.evaluate("s.py", files={"s.py": STATE}).stdout
    _check(attack.stdout, before, after)
