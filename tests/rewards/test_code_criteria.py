"""Code criteria in real sandboxes: unit tests, compiles, coverage, ruff, runtime, user code."""

from __future__ import annotations

import pytest

from rewards import Rubric, validate_spec
from rewards.criteria.code import plan_tests
from tests.rewards.conftest import one_criterion, sample

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def code_rubric():
    spec = {
        "version": 1,
        "criteria": [
            {"name": "compiles", "kind": "compiles", "weight": 0},
            {"name": "tests", "kind": "unit_tests", "weight": 1},
            {"name": "coverage", "kind": "coverage", "weight": 0},
            {"name": "lint", "kind": "static_analysis", "weight": 0},
        ],
        "aggregate": {"gate": "compiles", "then": "weighted_sum"},
        "sandbox": {"memory_mb": 256, "timeout_s": 10, "max_concurrency": 2},
    }
    with Rubric.from_spec(spec) as rubric:
        yield rubric


def test_a_correct_solution_passes_every_test_with_per_test_details(code_rubric):
    code = "def add(a, b):\n    if a < 0:\n        return b + a\n    return a + b"
    result = code_rubric.score(sample(fenced(code), ADD_TESTS))
    assert result.total == 1.0
    tests = result.details["tests"]
    assert (tests["passed"], tests["total"]) == (3, 3)
    assert all(t["passed"] and t["verified"] == "judge" for t in tests["tests"])
    assert result.breakdown["compiles"] == 1.0
    assert result.breakdown["coverage"] == 1.0
    assert result.breakdown["lint"] == 1.0


def test_a_partly_wrong_solution_scores_the_fraction_and_shows_what_it_got(code_rubric):
    result = code_rubric.score(sample(fenced("def add(a, b):\n    return abs(a) + b"), ADD_TESTS))
    assert result.breakdown["tests"] == pytest.approx(2 / 3)
    failed = [t for t in result.details["tests"]["tests"] if not t["passed"]]
    assert failed == [{"test": "assert add(-1, 1) == 0", "verified": "judge", "got": "2",
                       "passed": False}]  # fmt: skip


def test_code_that_does_not_compile_is_gated_to_zero(code_rubric):
    result = code_rubric.score(sample(fenced("def add(a b):\n    return a"), ADD_TESTS))
    assert result.breakdown["compiles"] == 0.0
    assert "SyntaxError" in result.details["compiles"]["reason"]
    assert result.total == 0.0


def test_coverage_counts_the_lines_the_tests_reach(code_rubric):
    code = "def add(a, b):\n    return a + b\n\ndef unused(x):\n    y = x * 2\n    return y"
    result = code_rubric.score(sample(fenced(code), ADD_TESTS))
    assert result.breakdown["coverage"] == pytest.approx(3 / 5)
    assert result.details["coverage"]["missing"] == [5, 6]


def test_ruff_issues_are_reported_per_line(code_rubric):
    code = "import os\ndef add(a, b):\n    l = 1\n    return a + b"
    result = code_rubric.score(sample(fenced(code), ADD_TESTS))
    issues = result.details["lint"]["issues"]
    assert any(i.startswith("F401") for i in issues["1"])
    assert any(i.startswith("E741") or i.startswith("F841") for i in issues["3"])
    assert result.breakdown["lint"] == pytest.approx(1 - 2 / 4)


def test_an_infinite_loop_times_out_and_scores_zero():
    spec = one_criterion("unit_tests", timeout_s=1)
    with Rubric.from_spec(spec) as rubric:
        result = rubric.score(
            sample(fenced("def add(a, b):\n    while True:\n        pass"), ADD_TESTS)
        )
    assert result.total == 0.0
    assert result.details["c"]["timed_out"] is True
    assert result.details["c"]["tests"][0]["error"] == "timed out"


def test_mbpp_style_ground_truth_with_setup_code_and_imports():
    truth = {
        "test_list": ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)", "assert area(0) == 0"],
        "test_imports": ["import math"],
    }
    with Rubric.from_spec(one_criterion("unit_tests")) as rubric:
        code = "import math\ndef area(r):\n    return math.pi * r * r"
        result = rubric.score(sample(fenced(code), truth))
    assert result.total == 1.0


def test_runtime_efficiency_scores_a_slow_solution_below_the_reference():
    params = {
        "workload": "total(3_000_000)",
        "repeat": 3,
        "reference": "def total(n):\n    return n * (n - 1) // 2",
        "rounds": 2,
    }
    with Rubric.from_spec(one_criterion("runtime_efficiency", params)) as rubric:
        slow = rubric.score(sample(fenced("def total(n):\n    return sum(range(n))")))
        wrong = rubric.score(sample(fenced("def total(n):\n    return 0")))
    assert 0 < slow.total < 1
    assert slow.details["c"]["candidate_s"] > slow.details["c"]["reference_s"]
    assert (
        wrong.total == 0.0 and wrong.details["c"]["reason"] == "result differs from the reference"
    )


@pytest.mark.parametrize(
    ("test", "items", "fmt"),
    [
        ("assert f(1) == 2", 1, "assert"),
        ("x = f(1)\nassert x == [1, 2]", 1, "assert"),
        ("for i in range(3):\n    assert f(i) == i", 1, "assert"),
        ("def check(candidate):\n    assert candidate(1) == 2", 1, "check"),
        ("def test_a():\n    assert f(1)\ndef test_b():\n    assert f(2)", 2, "pytest"),
        ("import unittest\nclass T(unittest.TestCase):\n    def test(self): pass", 1, "unittest"),
    ],
)
def test_each_test_format_is_planned_as_the_judge_will_run_it(test, items, fmt):
    plan = plan_tests([test])
    assert (len(plan.items), plan.formats) == (items, {fmt})


def test_invalid_tests_are_spec_issues():
    (issue,) = validate_spec(one_criterion("unit_tests", {"tests": ["assert (("]}))
    assert issue.path == "criteria[0].params.tests[0]"


# --- user code in the sandbox ------------------------------------------------------------------

VERL_CODE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == ground_truth else 0.25
"""
TRL_CODE = """
def reward_func(prompts, completions, **kwargs):
    return [len(c) / 10 for c in completions]
"""


def test_sandboxed_user_functions_with_either_signature():
    with Rubric.from_spec(one_criterion("sandboxed_function", {"code": VERL_CODE})) as rubric:
        assert rubric.score(sample("yes", "yes")).total == 1.0
        assert rubric.score(sample("no", "yes")).total == 0.25
    trl = one_criterion("sandboxed_function", {"code": TRL_CODE, "function": "reward_func"})
    with Rubric.from_spec(trl) as rubric:
        assert rubric.score(sample("12345")).total == 0.5


def test_sandboxed_user_code_cannot_reach_the_host_and_failures_score_zero():
    snoop = """
import os
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(open('/etc/shadow').read()) + len(os.environ.get('SECRET_KEY', '')))
"""
    with Rubric.from_spec(one_criterion("sandboxed_function", {"code": snoop})) as rubric:
        result = rubric.score(sample("x"))
    assert result.total == 0.0
    assert (
        "FileNotFoundError" in result.details["c"]["error"]
        or "Permission" in result.details["c"]["error"]
    )


def test_sandboxed_function_params_are_checked_before_running():
    spec = one_criterion("sandboxed_function", {"code": "def other(): pass"})
    assert validate_spec(spec)[0].path == "criteria[0].params.function"


def test_io_tests_compare_outputs_on_the_host():
    cases = [
        {"stdin": "1 2\n", "stdout": "3\n"},
        {"stdin": "10 -4\n", "stdout": "6"},
        {"stdin": "0 0\n", "stdout": "0\n"},
    ]
    with Rubric.from_spec(one_criterion("io_tests", {"cases": cases})) as rubric:
        right = rubric.score(sample(fenced("a, b = map(int, input().split())\nprint(a + b)  ")))
        off_by_one = rubric.score(
            sample(fenced("a, b = map(int, input().split())\nprint(a + b + (a == 0))"))
        )
        liar = rubric.score(sample(fenced("import sys\nprint('3')\nsys.exit(0)")))
    assert right.total == 1.0
    assert off_by_one.total == pytest.approx(2 / 3)
    assert off_by_one.details["c"]["cases"][2]["got"] == "1\n"
    assert liar.total == pytest.approx(1 / 3)  # a constant answer passes only its own case


def test_io_tests_read_codecontests_style_ground_truth():
    truth = {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "25\n"]}
    with Rubric.from_spec(one_criterion("io_tests", {"stop_on_failure": True})) as rubric:
        result = rubric.score(sample(fenced("n = int(input())\nprint(n + n)"), truth))
    assert result.total == 0.5
    assert result.details["c"]["cases"][1]["got"] == "10\n"


def test_classes_in_place_changes_generators_and_exceptions_cross_to_the_judge():
    code = (
        "class Stack:\n"
        "    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n"
        "    def pop(self):\n        return self.items.pop()\n"
        "    def __len__(self):\n        return len(self.items)\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
        "def evens(n):\n    return (i for i in range(n) if i % 2 == 0)\n"
        "def safe_div(a, b=1):\n"
        "    if b == 0:\n        raise ValueError('division by zero')\n"
        "    return a / b\n"
    )
    tests = [
        "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2",
        "s = Stack()\ns.push(5)\nassert len(s) == 1 and s.items == [5]",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "assert list(evens(7)) == [0, 2, 4, 6]",
        "assert safe_div(6, b=3) == 2.0",
        "try:\n    safe_div(1, 0)\n    raise AssertionError('no error')\n"
        "except ValueError:\n    pass",
        "assert Stack() != Stack()",
    ]
    with Rubric.from_spec(one_criterion("unit_tests")) as rubric:
        result = rubric.score(sample(fenced(code), tests))
    assert result.total == 1.0, result.details["c"]["tests"]


def test_a_test_the_judge_cannot_send_to_the_candidate_fails_with_the_reason():
    code = "def apply(f, x):\n    return f(x)"
    with Rubric.from_spec(one_criterion("unit_tests")) as rubric:
        result = rubric.score(sample(fenced(code), ["assert apply(lambda v: v + 1, 1) == 2"]))
    assert result.total == 0.0
    assert "cannot be sent to the candidate" in result.details["c"]["tests"][0]["error"]


def test_humaneval_ground_truth_names_its_entry_point():
    truth = {
        "test": "def check(candidate):\n    assert candidate('abc') == 'cba'\n",
        "entry_point": "reverse",
    }
    code = (
        "def helper(s):\n    return s[::-1]\n\n"
        "def reverse(s):\n    return helper(s)\n\n"
        "def noise():\n    pass"
    )
    with Rubric.from_spec(one_criterion("unit_tests")) as rubric:
        assert rubric.score(sample(fenced(code), truth)).total == 1.0
        wrong = rubric.score(sample(fenced(code.replace("[::-1]", "")), truth))
    assert wrong.total == 0.0


def test_a_sandbox_python_of_another_bytecode_version_runs_the_judge_from_source(monkeypatch):
    import rewards.criteria.code as code_module

    monkeypatch.setattr(code_module, "script_bytecode", lambda name: b"\0\0\0\0" + bytes(12))
    with Rubric.from_spec(one_criterion("unit_tests")) as rubric:
        result = rubric.score(sample(fenced("def add(a, b):\n    return a + b"), ADD_TESTS))
    assert result.total == 1.0
