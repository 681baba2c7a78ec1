"""The two ways Python-only criteria run: zygote forks (default) and a fresh sandbox per sample.

The reward-hacking set runs unchanged on the default (zygote) path in test_reward_hacking.py;
here it runs again on the fresh-sandbox path, and the zygote path is checked for what it
adds: one long-lived sandbox serves many samples, so nothing a sample leaves (files,
processes, a tampered interpreter, SysV objects, environment) may reach the next, and the
judge's end-of-run kill must spare the zygote itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from rewards import Rubric
from rewards.spec import validate_spec
from tests.rewards.conftest import one_criterion, sample
from tests.rewards.test_reward_hacking import FORMATS, HACKS, HONEST

ASSERTS = FORMATS["asserts"]

# Tries to leave something behind in every way a later sample could notice.
PLANTER = """\
import builtins, json, os, subprocess, sys, time
for path in ('/tmp/planted', '/dev/shm/planted', '/work/planted', os.path.expanduser('~/planted')):
    try:
        with open(path, 'w') as f:
            f.write('x')
    except OSError:
        pass
try:
    os.makedirs('/tmp/locked', exist_ok=True)
    os.chmod('/tmp/locked', 0)
except OSError:
    pass
os.environ['PLANTED'] = '1'
builtins.planted = True
json.dumps = lambda *a, **k: 'forged'
sys.modules['math'] = None
try:  # the zygote's memory: it is not dumpable, so this must fail
    with open('/proc/1/mem', 'r+b') as mem:
        mem.write(b'x')
except OSError:
    pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(30)
    os._exit(0)
subprocess.Popen(['sleep', '30'], start_new_session=True)
try:
    import _posixshmem
    _posixshmem.shm_open('/planted', os.O_CREAT | os.O_RDWR, 0o600)
except Exception:
    pass
def add(a, b):
    return a + b
"""

# Right only when nothing of an earlier sample is visible.
SPY = """\
import builtins, json, os, sys
def _clean():
    leftovers = [p for p in ('/tmp/planted', '/dev/shm/planted', '/work/planted',
                             os.path.expanduser('~/planted'), '/tmp/locked', '/dev/shm/sem.planted')
                 if os.path.lexists(p)]
    if leftovers or 'PLANTED' in os.environ or hasattr(builtins, 'planted'):
        return False
    if json.dumps(1) != '1' or sys.modules.get('math', 0) is None:
        return False
    ours = {1, os.getpid(), os.getppid()}
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) not in ours:
            try:
                with open(f'/proc/{entry}/stat') as stat:
                    state = stat.read().rsplit(')', 1)[-1].split()[0]
            except OSError:
                continue
            if state not in ('Z', 'X'):
                return False
    return True
CLEAN = _clean()
def add(a, b):
    return a + b if CLEAN else None
"""


def unit_tests_rubric(path: str, **criterion: Any) -> Rubric:
    spec = {
        "version": 1,
        "criteria": [{"name": "tests", "kind": "unit_tests", "timeout_s": 3, **criterion}],
        "sandbox": {"memory_mb": 256, "max_concurrency": 1, "python_evaluations": path},
    }
    return Rubric.from_spec(spec)


def code(text: str) -> str:
    return f"```python\n{text}\n```"


def zygotes_opened(rubric: Rubric) -> int:
    pool = rubric._sandboxes.zygotes() if rubric._sandboxes is not None else None
    assert pool is not None
    return pool.opened


def test_the_switch_is_validated():
    spec = one_criterion("unit_tests")
    spec["sandbox"] = {"python_evaluations": "reused_interpreter"}
    assert [issue.path for issue in validate_spec(spec)] == ["sandbox.python_evaluations"]


def test_the_fresh_sandbox_path_opens_no_zygote():
    with unit_tests_rubric("fresh_sandbox") as rubric:
        assert rubric.score(sample(code(HONEST), ASSERTS)).total == 1.0
        assert rubric._sandboxes is not None
        assert rubric._sandboxes.zygotes() is None


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_no_hack_earns_anything_on_the_fresh_sandbox_path(fmt):
    names = list(HACKS)
    with unit_tests_rubric("fresh_sandbox") as rubric:
        honest = rubric.score(sample(code(HONEST), FORMATS[fmt]))
        results = rubric.score_batch(
            [sample(code(HACKS[name]), FORMATS[fmt]) for name in names], max_workers=2
        )
    assert honest.total == 1.0, honest.details
    assert {n: r.total for n, r in zip(names, results, strict=True) if r.total} == {}


@pytest.mark.parametrize("path", ["zygote", "fresh_sandbox"])
def test_a_sample_sees_nothing_an_earlier_sample_left(path):
    with unit_tests_rubric(path) as rubric:
        assert rubric.score(sample(code(SPY), ASSERTS)).total == 1.0  # the spy itself works
        assert rubric.score(sample(code(PLANTER + SPY), ASSERTS)).total == 0.0  # and sees
        for _ in range(2):
            planted = rubric.score(sample(code(PLANTER), ASSERTS))
            assert planted.total == 1.0, planted.details
            spied = rubric.score(sample(code(SPY), ASSERTS))
            assert spied.total == 1.0, spied.details
        if path == "zygote":
            assert zygotes_opened(rubric) == 1  # the same zygote served every sample


def test_the_judges_kill_and_a_timed_out_sample_spare_the_zygote():
    # Each judge ends with kill(-1) over the sandbox; the zygote (pid 1) must outlive it, as
    # it must a candidate that loops past the deadline or kills everything it can itself.
    killer = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    with unit_tests_rubric("zygote") as rubric:
        scores = [
            rubric.score(sample(code(text), ASSERTS)).total
            for text in (HONEST, "while True:\n    pass", killer + HONEST, HONEST)
        ]
        assert scores == [1.0, 0.0, 0.0, 1.0]
        assert zygotes_opened(rubric) == 1


def test_io_cases_each_start_from_the_code_as_written():
    # A program that rewrites itself would pass later cases on the old shared directory.
    program = (
        "import sys\nprint(int(sys.stdin.read()) * 2)\nopen(__file__, 'w').write('print(0)')\n"
    )
    cases = [{"stdin": str(n), "stdout": str(2 * n)} for n in (1, 2, 3)]
    for path in ("zygote", "fresh_sandbox"):
        spec = one_criterion("io_tests", {"cases": cases}, timeout_s=3)
        spec["sandbox"] = {"memory_mb": 256, "max_concurrency": 1, "python_evaluations": path}
        with Rubric.from_spec(spec) as rubric:
            assert rubric.score(sample(code(program))).total == 1.0, path


@pytest.mark.parametrize("path", ["zygote", "fresh_sandbox"])
def test_every_python_criterion_gives_the_same_scores_on_both_paths(path):
    spec = {
        "version": 1,
        "criteria": [
            {"name": "tests", "kind": "unit_tests"},
            {"name": "compiles", "kind": "compiles"},
            {"name": "coverage", "kind": "coverage"},
            {
                "name": "function",
                "kind": "sandboxed_function",
                "params": {
                    "code": "def compute_score(domain, response, ground_truth, extra):\n"
                    "    return float('return a + b' in response)\n"
                },
            },
        ],
        "sandbox": {"memory_mb": 256, "max_concurrency": 1, "python_evaluations": path},
    }
    with Rubric.from_spec(spec) as rubric:
        right = rubric.score(sample(code(HONEST), ASSERTS))
        wrong = rubric.score(sample(code("def add(a, b):\n    return a - b"), ASSERTS))
        broken = rubric.score(sample(code("def add(a, b)\n    return a + b"), ASSERTS))
    assert right.breakdown == {"tests": 1.0, "compiles": 1.0, "coverage": 1.0, "function": 1.0}
    assert wrong.breakdown == {"tests": 0.0, "compiles": 1.0, "coverage": 0.0, "function": 0.0}
    assert broken.breakdown["tests"] == broken.breakdown["compiles"] == 0.0


def test_without_a_zygote_python_runs_take_the_fresh_sandbox_path(monkeypatch):
    from sandboxes import PythonZygote, SandboxError

    def refuse(self: PythonZygote) -> PythonZygote:
        raise SandboxError("a supervisor needs the sandbox's cgroup")

    monkeypatch.setattr(PythonZygote, "open", refuse)
    with unit_tests_rubric("zygote") as rubric:
        results = [rubric.score(sample(code(text), ASSERTS)) for text in (HONEST, SPY)]
        assert [r.total for r in results] == [1.0, 1.0], results[0].details
        assert rubric._sandboxes is not None
        assert rubric._sandboxes.zygotes() is None


@pytest.mark.slow
def test_a_sample_that_exhausts_the_sandbox_leaves_the_next_a_working_zygote():
    exhausts = {
        "processes": "import os\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\n",
        "memory": "x = []\nwhile True:\n    x.append(bytearray(10**7))\n",
        "disk": "i = 0\nwhile True:\n    open(f'/work/f{i}', 'wb').write(b'x' * 10**6)\n"
        "    i += 1\n",
        "/tmp": "i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 10**6)\n"
        "    i += 1\n",
    }
    with unit_tests_rubric("zygote") as rubric:
        for what, text in exhausts.items():
            assert rubric.score(sample(code(text + HONEST), ASSERTS)).total == 0.0, what
            after = rubric.score(sample(code(SPY), ASSERTS))
            assert after.total == 1.0, (what, after.details)
        assert zygotes_opened(rubric) == 1


def test_on_the_zygote_path_samples_sandboxes_are_recycled_and_no_sample_sees_another():
    """The pool behind non-Python tools (ruff) resets and reuses a sample's sandbox on the
    default path, and keeps fresh sandboxes on the fresh-sandbox path; a later sample sees none
    of an earlier one's files or processes."""
    from rewards.sandboxing import CodeSandboxes, ScoringState

    recycling = CodeSandboxes({"max_concurrency": 1}, needs_tools=False)
    fresh = CodeSandboxes({"max_concurrency": 1, "python_evaluations": "fresh_sandbox"}, False)
    try:
        assert recycling.pool().recycle and not fresh.pool().recycle
        first = ScoringState(recycling)
        planting = first.sandbox()
        name = planting.name
        planting.run(
            [
                "sh",
                "-c",
                "echo x >/work/planted; echo x >/tmp/planted; echo x >/dev/shm/planted; "
                "(setsid sleep 60 &); sleep 61 &",
            ]
        )
        first.close()
        second = ScoringState(recycling)
        looking = second.sandbox()
        assert looking.name == name  # the same sandbox, reset
        seen = looking.run(
            ["sh", "-c", "ls -A /work /tmp /dev/shm; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]
        )
        second.close()
        assert "planted" not in seen.stdout and "sleep" not in seen.stdout, seen.stdout
    finally:
        recycling.close()
        fresh.close()
