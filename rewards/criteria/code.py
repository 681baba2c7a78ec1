"""Code criteria, all run in a sandbox: unit tests, compiles, coverage, ruff, runtime.

Model-written code never runs on the host. Python only. How the unit-test criterion resists
reward hacking: the tests' expected values never enter the sandbox. Each ``assert`` is taken
apart on the host (`ast`): the sandbox evaluates only the expressions that involve the
candidate and reports their values as strictly typed JSON (plain types only: an object that
overrides ``__eq__`` is refused), and the host compares them with the expected literals. So
rewriting the test file, exiting early with status 0, printing "PASSED", monkeypatching
``assert``/``unittest``/the harness, forging the harness's report, or returning a wrapper that
equals everything earns nothing. Where a test has no literal side (``assert f(x) ==
sorted(x)``) both sides come back as plain values, which still defeats ``__eq__`` tricks but
not a candidate that forges the report; tests that are not a (series of statements ending in
a) single ``assert`` run as opaque code whose verdict the sandbox reports. Both say
``"verified": "in_sandbox"`` in their results; MBPP/HumanEval-style asserts against literals
say ``"host"``.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rewards.registry import Criterion, ParamProblem, register
from rewards.sandbox_scripts import script_text
from rewards.sandboxing import IMAGE_RUFF, ScoringState, fresh_dir, run_in, tail
from rewards.types import CriterionError, Outcome, Sample

MARKER = "@@rewards-record "
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:\n)?```", re.DOTALL | re.IGNORECASE)
MAX_CODE_CHARS = 200_000
MAX_RECORD_CHARS = 1_000_000

CODE_FROM_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": ["last_block", "all_blocks", "full"],
    "description": "where the code is: the last fenced code block (default; the whole "
    "response if there is none), all blocks joined, or the full response",
}
TESTS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "minItems": 1,
    "description": "test snippets, typically one assert each; default: the sample's "
    "ground_truth (a list, or a dict with 'tests'/'test_list')",
}


def extract_code(text: str, mode: str = "last_block") -> str:
    if mode != "full":
        blocks = _FENCE.findall(text)
        if blocks:
            return blocks[-1] if mode == "last_block" else "\n\n".join(blocks)
    return text


def candidate_code(sample: Sample, params: dict[str, Any]) -> str:
    code = extract_code(sample.response, params.get("code_from", "last_block"))
    if len(code) > MAX_CODE_CHARS:
        raise CriterionError(f"code longer than {MAX_CODE_CHARS} characters")
    if "\x00" in code:
        raise CriterionError("code contains NUL bytes")
    return code if code.endswith("\n") else code + "\n"


def tests_and_setup(sample: Sample, params: dict[str, Any]) -> tuple[list[str], str]:
    truth = sample.ground_truth
    tests = params.get("tests")
    setup = params.get("setup", "")
    if tests is None:
        if isinstance(truth, list):
            tests = truth
        elif isinstance(truth, dict):
            tests = truth.get("tests", truth.get("test_list"))
            setup = setup or truth.get("setup", truth.get("test_setup_code", "")) or ""
            imports = truth.get("test_imports") or []
            if isinstance(imports, list) and imports:
                setup = "\n".join([*map(str, imports), setup])
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise CriterionError("no tests: give params.tests or a list of tests as ground_truth")
    return tests, str(setup or "")


def parse_records(stdout: str) -> list[dict[str, Any]]:
    """The runner's records: Python literals of plain values, read with `ast.literal_eval`
    (which evaluates nothing); a malformed or oversized line is skipped."""
    records = []
    for line in stdout.splitlines():
        if line.startswith(MARKER) and len(line) <= MAX_RECORD_CHARS:
            try:
                record = ast.literal_eval(line[len(MARKER) :])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def literal_request(request: dict[str, Any]) -> str:
    """The runner's request as a Python literal (see the runner's docstring)."""
    return repr(request)


# --- values reported by the sandbox --------------------------------------------------------


class BadValue(ValueError):
    pass


def decode(value: Any, depth: int = 0) -> Any:
    """The host-side twin of the runner's ``encode``: plain JSON back to plain Python."""
    if depth > 80:
        raise BadValue("value nested too deeply")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [decode(v, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "tuple" and isinstance(inner, list):
            return tuple(decode(v, depth + 1) for v in inner)
        if tag == "set" and isinstance(inner, list):
            return frozenset(decode(v, depth + 1) for v in inner)
        if tag == "dict" and isinstance(inner, list):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in inner}
        if tag == "float" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag == "bytes" and isinstance(inner, str):
            return bytes.fromhex(inner)
        if tag == "complex" and isinstance(inner, list) and len(inner) == 2:
            return complex(float(inner[0]), float(inner[1]))
    raise BadValue("malformed value")


# --- taking tests apart ---------------------------------------------------------------------

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b or (a == b and type(a) is type(b) and a in (None, True, False)),
    ast.IsNot: lambda a, b: not (a is b or (a == b and type(a) is type(b))),
}


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


@dataclass
class Probe:
    id: int
    test: str
    mode: str  # "value": the host checks the value; "exec": the sandbox reports pass/fail
    source: str
    before: list[str] = field(default_factory=list)
    check: Callable[[Any], bool] | None = None
    # "host": the host compares a value against the test's literal, which never enters the
    # sandbox; "in_sandbox": the verdict rests on values or a pass/fail the candidate's own
    # process reports (both sides of a comparison computed there, or opaque test code).
    verified: str = "host"

    def request(self) -> dict[str, Any]:
        return {"id": self.id, "mode": self.mode, "source": self.source, "before": self.before}


def plan_probe(index: int, test: str) -> Probe:
    """How one test is checked; see the module docstring."""
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        raise CriterionError(f"test {index} is not valid Python: {exc}") from exc
    body = tree.body
    asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    if not body or not isinstance(body[-1], ast.Assert) or len(asserts) != 1:
        return Probe(index, test, "exec", test, verified="in_sandbox")
    before = [ast.unparse(node) for node in body[:-1]]
    condition = body[-1].test
    value_probe = _value_probe(condition)
    if value_probe is None:
        return Probe(index, test, "exec", test, verified="in_sandbox")
    source, check, verified = value_probe
    return Probe(index, test, "value", source, before, check, verified)


def _value_probe(node: ast.expr) -> tuple[str, Callable[[Any], bool], str] | None:
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        compare = _COMPARE.get(type(node.ops[0]))
        if compare is None:
            return None
        left, right = node.left, node.comparators[0]
        right_is_literal, expected = _literal(right)
        if right_is_literal:
            return ast.unparse(left), lambda v: bool(compare(v, expected)), "host"
        left_is_literal, expected = _literal(left)
        if left_is_literal:
            return ast.unparse(right), lambda v: bool(compare(expected, v)), "host"
        # Both sides are computed in the sandbox: both come back as plain values (so an
        # `__eq__` override still cannot fake equality), but a candidate that forges its
        # report could make them agree.
        pair = f"({ast.unparse(left)}, {ast.unparse(right)})"
        return (
            pair,
            lambda v: isinstance(v, tuple) and len(v) == 2 and bool(compare(v[0], v[1])),
            "in_sandbox",
        )
    if isinstance(node, ast.Call) and _is_isclose(node.func) and len(node.args) == 2:
        keywords = {}
        for keyword in node.keywords:
            ok, value = _literal(keyword.value)
            if not ok or keyword.arg not in ("rel_tol", "abs_tol"):
                return None
            keywords[keyword.arg] = value
        for probe_side, literal_side in ((0, 1), (1, 0)):
            ok, expected = _literal(node.args[literal_side])
            if ok and _is_number(expected):
                source = ast.unparse(node.args[probe_side])

                def near(value: Any, target: Any = expected) -> bool:
                    return _is_number(value) and math.isclose(value, target, **keywords)

                return source, near, "host"
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ast.unparse(node.operand), lambda v: not v, "host"
    return ast.unparse(node), bool, "host"


def _is_isclose(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "isclose") or (
        isinstance(func, ast.Attribute) and func.attr == "isclose"
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _runner_files(code: str) -> dict[str, str]:
    return {"solution.py": code, "runner.py": script_text("runner.py")}


def _python(script: str = "runner.py") -> list[str]:
    return ["python3", "-I", "-X", "utf8", script]


def run_probes(
    state: ScoringState,
    code: str,
    tests: list[str],
    setup: str,
    timeout_s: float,
    *,
    mode: str = "probes",
    extra: dict[str, Any] | None = None,
) -> tuple[list[Probe], list[dict[str, Any]], Any]:
    probes = [plan_probe(i, test) for i, test in enumerate(tests)]
    request = {
        "mode": mode,
        "solution": "solution.py",
        "setup": setup,
        "probes": [p.request() for p in probes],
        **(extra or {}),
    }
    directory = fresh_dir(mode)
    result = run_in(
        state.sandbox(),
        directory,
        _runner_files(code),
        _python(),
        stdin=literal_request(request),
        timeout=timeout_s,
    )
    return probes, parse_records(result.stdout), result


def judge_probes(
    probes: list[Probe], records: list[dict[str, Any]]
) -> tuple[int, list[dict[str, Any]], str | None]:
    first: dict[int, dict[str, Any]] = {}
    load_error = None
    for record in records:
        if "load_error" in record and load_error is None:
            load_error = str(record["load_error"])
        ident = record.get("id")
        if isinstance(ident, int) and not isinstance(ident, bool) and ident not in first:
            first[ident] = record
    passed = 0
    results = []
    for probe in probes:
        outcome: dict[str, Any] = {
            "test": probe.test[:300],
            "verified": probe.verified if probe.mode == "value" else "in_sandbox",
        }
        found = first.get(probe.id)
        ok = False
        if found is None:
            outcome["error"] = load_error or "no result (the program stopped before this test)"
        elif "error" in found:
            outcome["error"] = str(found["error"])[:500]
        elif probe.mode == "exec":
            ok = found.get("passed") is True
        else:
            try:
                value = decode(found.get("value"))
                assert probe.check is not None
                ok = bool(probe.check(value))
                if not ok:
                    outcome["got"] = repr(value)[:300]
            except (BadValue, TypeError, ValueError, KeyError) as exc:
                outcome["error"] = f"unusable value: {exc}"
        outcome["passed"] = ok
        passed += ok
        results.append(outcome)
    return passed, results, load_error


def exec_summary(result: Any) -> dict[str, Any]:
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "wall_s": round(result.wall_s, 4),
        "stderr": tail(result.stderr, 1500),
    }


_CODE_PARAMS: dict[str, Any] = {
    "code_from": CODE_FROM_SCHEMA,
    "tests": TESTS_SCHEMA,
    "setup": {"type": "string", "description": "code run after the candidate, before tests"},
}


class _SandboxedCriterion(Criterion):
    uses_sandbox = True
    default_timeout_s = 10.0

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        problems = []
        for index, test in enumerate(params.get("tests") or []):
            try:
                ast.parse(test)
            except SyntaxError as exc:
                problems.append((f"tests[{index}]", f"is not valid Python: {exc.msg}"))
        return problems


@register
class UnitTests(_SandboxedCriterion):
    """Runs the candidate's code against unit tests in a sandbox; scores the fraction passed.

    The code is the last fenced code block of the response (``code_from``). ``tests`` (or the
    sample's ``ground_truth``: a list, or a dict with ``tests``/``test_list`` and
    ``setup``/``test_setup_code``/``test_imports`` as in MBPP) are snippets, typically one
    ``assert`` each; ``setup`` runs after the candidate's code. Each test's result is in
    ``details.tests`` (passed, the value got when it failed, the error). With
    ``"credit": "all"`` the score is 1 only when every test passes.

    Asserts are checked on the host against their literal side (see the module notes on
    reward hacking); ``timeout_s`` bounds the whole run.
    """

    kind = "unit_tests"
    summary = "Fraction of unit tests the code passes, run in a sandbox."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {**_CODE_PARAMS, "credit": {"type": "string", "enum": ["fraction", "all"]}},
    }

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        tests, setup = tests_and_setup(sample, self.params)
        probes, records, result = run_probes(state, code, tests, setup, self.context.timeout_s)
        passed, results, load_error = judge_probes(probes, records)
        details = {
            "passed": passed,
            "total": len(probes),
            "tests": results,
            "run": exec_summary(result),
        }
        if load_error:
            details["load_error"] = load_error
        if self.params.get("credit") == "all":
            return Outcome(1.0 if passed == len(probes) else 0.0, details)
        return Outcome(passed / len(probes), details)

    def evaluate(self, sample: Sample) -> Outcome:
        raise CriterionError("unit_tests needs a rubric's sandbox")


@register
class Compiles(_SandboxedCriterion):
    """Scores 1 when the candidate's code compiles (Python ``compile``, in a sandbox), else 0.

    Nothing of the code runs: it is only compiled, but in the sandbox all the same, because a
    hostile source can exhaust the parser's memory or time. The syntax error, with its line,
    is in ``details``.
    """

    kind = "compiles"
    summary = "The code compiles (checked in a sandbox; nothing is run)."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"code_from": CODE_FROM_SCHEMA},
    }
    _CHECK = (
        "import sys\n"
        "source = open('solution.py', encoding='utf-8').read()\n"
        "try:\n"
        "    compile(source, 'solution.py', 'exec', dont_inherit=True)\n"
        "except (SyntaxError, ValueError) as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "print('compiled')\n"
    )

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        result = run_in(
            state.sandbox(),
            fresh_dir("compiles"),
            {"solution.py": code, "check.py": self._CHECK},
            _python("check.py"),
            timeout=self.context.timeout_s,
        )
        # "compiled" on stdout AND exit 0: nothing of the candidate ran, so neither can lie.
        ok = result.ok and result.stdout.strip() == "compiled"
        details: dict[str, Any] = {"compiled": ok}
        if not ok:
            details["reason"] = tail(result.stderr.strip(), 1000) or exec_summary(result)
        return Outcome(1.0 if ok else 0.0, details)


@register
class Coverage(_SandboxedCriterion):
    """Scores the fraction of the candidate's statements the given tests execute.

    coverage.py runs in the sandbox around the candidate's code and the ``tests`` (as for
    ``unit_tests``; whether they pass does not matter here). ``branch`` measures branches
    too. ``details.missing`` lists the missed lines. The candidate's own code runs in the
    measured process, so a candidate that tampers with coverage.py in-process can inflate this
    score: pair it with ``unit_tests`` and do not use it alone as a reward.
    """

    kind = "coverage"
    summary = "Fraction of the code's statements the tests execute (coverage.py in a sandbox)."
    needs_tools = True
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {**_CODE_PARAMS, "branch": {"type": "boolean"}},
    }

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        tests, setup = tests_and_setup(sample, self.params)
        probes = [Probe(i, t, "exec", t) for i, t in enumerate(tests)]
        request = {
            "mode": "coverage",
            "solution": "solution.py",
            "setup": setup,
            "branch": bool(self.params.get("branch", False)),
            "probes": [p.request() for p in probes],
        }
        result = run_in(
            state.sandbox(),
            fresh_dir("coverage"),
            _runner_files(code),
            _python(),
            stdin=literal_request(request),
            timeout=self.context.timeout_s,
        )
        records = parse_records(result.stdout)
        load_errors = [r["load_error"] for r in records if "load_error" in r]
        if load_errors:
            # Code that does not load covers nothing (exiting at import is not coverage).
            return Outcome(0.0, {"load_error": str(load_errors[0])[:500]})
        reports = [r["coverage"] for r in records if "coverage" in r]
        if not reports or not isinstance(reports[-1], dict):
            raise CriterionError(f"coverage produced no report: {exec_summary(result)}")
        statements = [s for s in reports[-1].get("statements", []) if isinstance(s, int)]
        missing = [s for s in reports[-1].get("missing", []) if isinstance(s, int)]
        if not statements:
            return Outcome(0.0, {"reason": "no statements to cover"})
        covered = len(set(statements) - set(missing))
        return Outcome(
            covered / len(statements),
            {"statements": len(statements), "covered": covered, "missing": missing[:200]},
        )


DEFAULT_RUFF_RULES = ["E", "F", "W", "B"]


@register
class StaticAnalysis(_SandboxedCriterion):
    """Runs ruff on the candidate's code in a sandbox and scores how clean it is.

    ``select`` picks rule codes or prefixes (default E, F, W, B); ``ignore`` drops some.
    ``score``: ``per_line`` (default) is the fraction of non-blank lines with no issue;
    ``per_issue`` is ``1 − issues / max_issues`` (default 10), floored at 0.
    ``details.issues`` maps line numbers to the issues found there.
    """

    kind = "static_analysis"
    summary = "How clean ruff finds the code (issues per line), run in a sandbox."
    needs_tools = True
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "code_from": CODE_FROM_SCHEMA,
            "select": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[A-Z]{1,4}[0-9]{0,4}$"},
                "minItems": 1,
            },
            "ignore": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[A-Z]{1,4}[0-9]{0,4}$"},
            },
            "score": {"type": "string", "enum": ["per_line", "per_issue"]},
            "max_issues": {"type": "integer", "minimum": 1},
        },
    }

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        argv = [
            IMAGE_RUFF,
            "check",
            "--isolated",
            "--no-cache",
            "--output-format",
            "json",
            "--exit-zero",
            "--select",
            ",".join(self.params.get("select", DEFAULT_RUFF_RULES)),
        ]
        if self.params.get("ignore"):
            argv += ["--ignore", ",".join(self.params["ignore"])]
        argv.append("solution.py")
        result = run_in(
            state.sandbox(),
            fresh_dir("ruff"),
            {"solution.py": code},
            argv,
            timeout=self.context.timeout_s,
        )
        if not result.ok:
            raise CriterionError(f"ruff failed: {exec_summary(result)}")
        try:
            found = json.loads(result.stdout)
        except ValueError as exc:
            raise CriterionError("ruff output is not JSON") from exc
        by_line: dict[int, list[str]] = {}
        for issue in found if isinstance(found, list) else []:
            row = (issue.get("location") or {}).get("row")
            if isinstance(row, int):
                by_line.setdefault(row, []).append(f"{issue.get('code')}: {issue.get('message')}")
        lines = [line for line in code.splitlines() if line.strip()]
        issue_count = sum(len(v) for v in by_line.values())
        if self.params.get("score") == "per_issue":
            score = max(0.0, 1.0 - issue_count / int(self.params.get("max_issues", 10)))
        elif not lines:
            score = 0.0
        else:
            score = max(0.0, 1.0 - len(by_line) / len(lines))
        shown = {str(k): v[:5] for k, v in sorted(by_line.items())[:100]}
        return Outcome(score, {"issues": shown, "issue_count": issue_count, "lines": len(lines)})


@register
class RuntimeEfficiency(_SandboxedCriterion):
    """Scores the candidate's speed against a reference solution, both run in one sandbox.

    ``workload`` is an expression run ``repeat`` times (default 1) after loading the code,
    e.g. ``solve(list(range(10**5)))``; ``reference`` is the reference solution's code
    (default: ``ground_truth["reference"]``). CPU time comes from the sandbox's cgroup — from
    outside the process, so the candidate cannot fake it — minus the cost of an empty run;
    each side is measured ``rounds`` times (default 3) and the fastest kept. Score:
    ``min(1, slack · reference_time / candidate_time)`` (``slack`` default 1.0), and 0 when the
    candidate's workload result differs from the reference's.
    """

    kind = "runtime_efficiency"
    summary = "Speed relative to a reference solution, measured in the same sandbox."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["workload"],
        "properties": {
            "code_from": CODE_FROM_SCHEMA,
            "workload": {"type": "string", "minLength": 1},
            "reference": {"type": "string", "minLength": 1},
            "setup": {"type": "string"},
            "repeat": {"type": "integer", "minimum": 1, "maximum": 100000},
            "rounds": {"type": "integer", "minimum": 1, "maximum": 20},
            "slack": {"type": "number", "exclusiveMinimum": 0},
        },
    }
    default_timeout_s = 30.0

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        try:
            ast.parse(params["workload"], mode="eval")
        except SyntaxError as exc:
            return [("workload", f"must be a Python expression: {exc.msg}")]
        return []

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        reference = self.params.get("reference")
        if reference is None and isinstance(sample.ground_truth, dict):
            reference = sample.ground_truth.get("reference")
        if not isinstance(reference, str):
            raise CriterionError("no reference solution: give params.reference")
        repeat = int(self.params.get("repeat", 1))
        workload = f"[({self.params['workload']}) for _ in range({repeat})][-1]"
        setup = str(self.params.get("setup", ""))
        rounds = int(self.params.get("rounds", 3))
        sandbox_timeout = self.context.timeout_s / (2 * rounds + 1)

        def measure(source: str, expression: str) -> tuple[float, Any, Any]:
            probe = Probe(0, expression, "value", expression, check=lambda v: True)
            request = {"mode": "probes", "solution": "solution.py", "setup": setup,
                       "probes": [probe.request()]}  # fmt: skip
            result = run_in(
                state.sandbox(), fresh_dir("timing"), _runner_files(source), _python(),
                stdin=literal_request(request), timeout=sandbox_timeout,
            )  # fmt: skip
            records = [r for r in parse_records(result.stdout) if r.get("id") == 0]
            cost = result.cpu_s if result.cpu_s is not None else result.wall_s
            return cost, (records[0] if records else None), result

        baseline = min(measure("", "None")[0] for _ in range(rounds))
        reference_costs, candidate_costs = [], []
        reference_record = candidate_record = None
        candidate_run = None
        for _ in range(rounds):
            cost, reference_record, _ = measure(reference, workload)
            reference_costs.append(cost)
            cost, candidate_record, candidate_run = measure(code, workload)
            candidate_costs.append(cost)
        if not reference_record or "value" not in reference_record:
            raise CriterionError(f"the reference solution failed: {reference_record}")
        details: dict[str, Any] = {"baseline_s": baseline}
        if not candidate_record or "value" not in candidate_record:
            details["reason"] = (candidate_record or {}).get("error") or exec_summary(candidate_run)
            return Outcome(0.0, details)
        try:
            same = decode(candidate_record["value"]) == decode(reference_record["value"])
        except BadValue:
            same = False
        if not same:
            return Outcome(0.0, {**details, "reason": "result differs from the reference"})
        floor = 0.001
        reference_time = max(min(reference_costs) - baseline, floor)
        candidate_time = max(min(candidate_costs) - baseline, floor)
        slack = float(self.params.get("slack", 1.0))
        score = min(1.0, slack * reference_time / candidate_time)
        details.update(reference_s=reference_time, candidate_s=candidate_time)
        return Outcome(score, details)


def _normalise_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@register
class IoTests(_SandboxedCriterion):
    """Runs the candidate as a program on each input; scores the fraction of right outputs.

    For stdin/stdout tasks (competitive programming, CodeContests/APPS style). ``cases``
    (or the sample's ``ground_truth``: a list, or a dict with ``cases``; or a dict with
    ``inputs`` and ``outputs`` lists) hold ``{"stdin": ..., "stdout": ...}``. Each case is
    one run of ``python3 -I solution.py`` in the sample's sandbox, limited to ``timeout_s``
    divided among the cases. Outputs are compared on the host, line by line, ignoring
    trailing whitespace (``exact: true`` compares bytes): the expected output never enters
    the sandbox, so a program can only print it by computing it. ``stop_on_failure`` skips
    the remaining cases after the first failure (they count as failed).
    """

    kind = "io_tests"
    summary = "Fraction of stdin/stdout cases the program answers right, run in a sandbox."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "code_from": CODE_FROM_SCHEMA,
            "cases": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["stdin", "stdout"],
                    "additionalProperties": False,
                    "properties": {"stdin": {"type": "string"}, "stdout": {"type": "string"}},
                },
            },
            "exact": {"type": "boolean"},
            "stop_on_failure": {"type": "boolean"},
        },
    }

    def _cases(self, sample: Sample) -> list[tuple[str, str]]:
        cases: Any = self.params.get("cases")
        truth = sample.ground_truth
        if cases is None and isinstance(truth, dict):
            if "inputs" in truth and "outputs" in truth:
                inputs, outputs = truth["inputs"], truth["outputs"]
                if (
                    not isinstance(inputs, list)
                    or not isinstance(outputs, list)
                    or len(inputs) != len(outputs)
                ):
                    raise CriterionError("'inputs' and 'outputs' must be lists of equal length")
                cases = [{"stdin": i, "stdout": o} for i, o in zip(inputs, outputs, strict=True)]
            else:
                cases = truth.get("cases")
        elif cases is None:
            cases = truth
        if not isinstance(cases, list) or not cases:
            raise CriterionError("no cases: give params.cases or cases as ground_truth")
        parsed = []
        for case in cases:
            if not (isinstance(case, dict) and isinstance(case.get("stdin"), str)
                    and isinstance(case.get("stdout"), str)):  # fmt: skip
                raise CriterionError("each case needs 'stdin' and 'stdout' strings")
            parsed.append((case["stdin"], case["stdout"]))
        return parsed

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        code = candidate_code(sample, self.params)
        cases = self._cases(sample)
        per_case_timeout = max(0.5, self.context.timeout_s / len(cases))
        directory = fresh_dir("io")
        sandbox = state.sandbox()
        exact = bool(self.params.get("exact", False))
        results: list[dict[str, Any]] = []
        passed = 0
        for index, (stdin, expected) in enumerate(cases):
            if results and self.params.get("stop_on_failure") and not results[-1]["passed"]:
                results.append({"case": index, "passed": False, "skipped": True})
                continue
            files = {"solution.py": code} if index == 0 else {}
            run = run_in(sandbox, directory, files, ["python3", "-I", "solution.py"],
                         stdin=stdin, timeout=per_case_timeout)  # fmt: skip
            got = run.stdout
            ok = (
                (got == expected)
                if exact
                else (_normalise_output(got) == _normalise_output(expected))
            )
            ok = ok and not run.timed_out and not run.truncated
            outcome: dict[str, Any] = {"case": index, "passed": ok}
            if not ok:
                outcome.update(got=tail(got, 300), stderr=tail(run.stderr, 300),
                               exit_code=run.exit_code, timed_out=run.timed_out)  # fmt: skip
            passed += ok
            results.append(outcome)
        return Outcome(
            passed / len(cases), {"passed": passed, "total": len(cases), "cases": results}
        )

    def evaluate(self, sample: Sample) -> Outcome:
        raise CriterionError("io_tests needs a rubric's sandbox")
