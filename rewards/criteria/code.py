"""Code criteria, all run in a sandbox: unit tests, compiles, coverage, ruff, runtime.

Model-written code never runs on the host. Python only.

Threat model (``unit_tests``, ``coverage``, ``runtime_efficiency``, ``io_tests``). The
candidate's code is hostile: it may patch builtins, ``sys.modules``, the test framework or
``os._exit``; exit early with status 0; print "OK"/"passed"/forged harness records; walk the
call stack or its own memory for expected values; read the environment or the filesystem;
rewrite files; leave processes running; or return objects that equal everything. None of that
may earn reward, whatever the test format: plain asserts (MBPP), ``def check(candidate)``
suites (HumanEval, with an ``entry_point``), pytest-style ``def test_*()`` functions,
``unittest.TestCase`` classes, or stdin/stdout cases.

How the verdict is kept out of reach (`rewards/sandbox_scripts/runner.py` has the details):

- The tests run in a *judge* process, the candidate in a *server* process, both in the
  sample's sandbox. The judge makes itself non-dumpable (no other process of the sandbox can
  open its memory or descriptors through /proc) and forks the server *before* it reads the
  request, so the tests, the expected values and the record key were never in the server's
  memory; it reads the request to EOF before the candidate's code starts.
- A name the tests take from the candidate (``add``, ``candidate`` in ``check``) is a proxy in
  the judge: a call sends the arguments as plain values, the server calls the candidate's
  function, and only a plain value comes back (strict JSON types; any other object stays in
  the server behind a handle whose comparisons are never delegated, so an object that
  "equals everything" equals nothing). Comparisons with expected values happen in the judge.
  A test's builtins (``sorted``, ``len``) are the judge's own, never a candidate's global
  of the same name; a module or an imported function a test takes from the candidate
  (``math``, ``from math import isclose``) is re-imported in the judge by its real name.
  Only names the tests use and never bind themselves come from the candidate at all.
- When the tests end, the judge SIGKILLs every other process of the sandbox and checks that
  none is left, then writes its records, each signed with a per-run key (BLAKE2b) the
  candidate never saw, to a pipe no candidate process holds. The host keeps only records
  whose signature verifies. Whatever the candidate prints goes to stderr, unread.
- On the default path (``sandbox.python_evaluations: "zygote"``, `rewards.sandboxing`) the
  judge is a fresh fork of a zygote: a pre-imported Python, pid 1 of a long-lived sandbox,
  that never ran sample code or saw a request. The judge then forks the server as above;
  the record key is made on the host (``secrets``) for each run and arrives on the judge's
  stdin after that fork, so it is neither in the zygote, nor in the server, nor derivable
  from what runs share (the hash seed, the pid counter). The judge's ``kill(-1)`` spares
  pid 1, the zygote; before the next run the zygote has every process of this one killed
  (its cgroup), its files, /tmp and /dev/shm emptied and its SysV objects removed.
- Stdin/stdout cases are compared on the host; the expected output never enters the sandbox.
- Runtime: CPU time comes from the sandbox's cgroup (outside every process), the result is
  relayed by the judge, and after each measured run the judge empties /work and /tmp so a
  later round cannot reuse a cached answer.

What falls back to a clearly scored 0 (``error`` says why) rather than trusting the
candidate's process: a test that passes a value that cannot cross processes to the candidate
(a lambda, a judge-side object), that compares candidate-made objects with ``==``, that
subclasses a candidate's class, or that runs past the deadline. Residual, documented: the
line counts of ``coverage`` are measured inside the candidate's process (it can inflate them),
so coverage only counts when every test passes in the judge; a helper a test neither defines
nor imports but takes from the candidate's own code (a bare ``isclose`` the candidate wrote)
is the candidate's to answer, so tests must import their helpers (MBPP's ``test_imports``
and ``setup`` run in the judge); and a test that calls the candidate in a very long loop pays
a pipe round trip per call. If the judge cannot make itself non-dumpable it refuses to run
and every sample scores 0 with the reason.
"""

from __future__ import annotations

import ast
import hmac
import json
import re
import secrets
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, ClassVar

from rewards.registry import Criterion, ParamProblem, register
from rewards.sandbox_scripts import BOOT, script_bytecode, script_text
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
    "description": "test snippets: asserts, a HumanEval `def check(candidate)`, pytest-style "
    "`def test_*()` functions or unittest classes; default: the sample's ground_truth (a list, "
    "or a dict with 'tests'/'test_list'/'test')",
}
ENTRY_POINT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
    "description": "the candidate's function a `check(candidate)` suite receives; default: "
    "the sample's ground_truth['entry_point'], else the last function the code defines",
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
            if tests is None and isinstance(truth.get("test"), str):
                tests = [truth["test"]]  # HumanEval: one `def check(candidate)` suite
            setup = setup or truth.get("setup", truth.get("test_setup_code", "")) or ""
            imports = truth.get("test_imports") or []
            if isinstance(imports, list) and imports:
                setup = "\n".join([*map(str, imports), setup])
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise CriterionError("no tests: give params.tests or a list of tests as ground_truth")
    return tests, str(setup or "")


def entry_point(sample: Sample, params: dict[str, Any]) -> str | None:
    if "entry_point" in params:
        return str(params["entry_point"])
    truth = sample.ground_truth
    if isinstance(truth, dict) and isinstance(truth.get("entry_point"), str):
        name = truth["entry_point"]
        return name if name.isidentifier() else None
    return None


def parse_records(stdout: str) -> list[dict[str, Any]]:
    """Records of the single-process runner (user reward functions): Python literals of
    plain values, read with `ast.literal_eval` (which evaluates nothing)."""
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
    """The single-process runner's request as a Python literal."""
    return repr(request)


def signed_records(stdout: str, key: bytes) -> list[dict[str, Any]]:
    """The judge's records whose signature verifies with this run's key; anything else on
    stdout (a forged marker, a replay from another run) is ignored."""
    records = []
    for line in stdout.splitlines():
        if not line.startswith(MARKER) or len(line) > MAX_RECORD_CHARS:
            continue
        mac, _, payload = line[len(MARKER) :].partition(" ")
        expected = blake2b(payload.encode(), key=key, digest_size=16).hexdigest()
        if not hmac.compare_digest(mac, expected):
            continue
        try:
            record = json.loads(payload)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# --- values as the judge reports them -------------------------------------------------------


class BadValue(ValueError):
    pass


def decode(value: Any, depth: int = 0) -> Any:
    """The host's twin of the runner's ``from_wire``: tagged JSON back to plain Python."""
    if depth > 100:
        raise BadValue("value nested too deeply")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [decode(v, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "t" and isinstance(inner, list):
            return tuple(decode(v, depth + 1) for v in inner)
        if tag in ("s", "fs") and isinstance(inner, list):
            return frozenset(decode(v, depth + 1) for v in inner)
        if tag == "d" and isinstance(inner, list):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in inner}
        if tag == "f" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag == "i" and isinstance(inner, str):
            return int(inner, 16)
        if tag == "b" and isinstance(inner, str):
            return bytes.fromhex(inner)
        if tag == "c" and isinstance(inner, list) and len(inner) == 2:
            return complex(float(inner[0]), float(inner[1]))
    raise BadValue("malformed value")


# --- planning the tests ---------------------------------------------------------------------

_COMPARE_OPS = {
    ast.Eq: "Eq", ast.NotEq: "NotEq", ast.Lt: "Lt", ast.LtE: "LtE", ast.Gt: "Gt",
    ast.GtE: "GtE", ast.In: "In", ast.NotIn: "NotIn", ast.Is: "Is", ast.IsNot: "IsNot",
}  # fmt: skip


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


@dataclass
class TestItem:
    """One scored test: what the judge runs and how the result is labelled."""

    id: int
    label: str
    source: str = ""
    split: dict[str, Any] | None = None
    call: dict[str, Any] | None = None

    def request(self) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.id, "source": self.source}
        if self.split is not None:
            item["split"] = self.split
        if self.call is not None:
            item["call"] = self.call
        return item


@dataclass
class TestPlan:
    items: list[TestItem] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    formats: set[str] = field(default_factory=set)


def plan_tests(tests: list[str], setup: str = "") -> TestPlan:
    """How each test snippet is run by the judge; a snippet may yield several items."""
    plan = TestPlan()
    for index, test in enumerate(tests):
        try:
            tree = ast.parse(test)
        except SyntaxError as exc:
            raise CriterionError(f"test {index} is not valid Python: {exc}") from exc
        plan.names.update(_names(tree))
        _plan_one(plan, test, tree)
    if setup:
        try:
            plan.names.update(_names(ast.parse(setup)))
        except SyntaxError as exc:
            raise CriterionError(f"the tests' setup is not valid Python: {exc}") from exc
    return plan


def _names(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _plan_one(plan: TestPlan, test: str, tree: ast.Module) -> None:
    body = tree.body
    calls_at_top = any(isinstance(node, ast.Expr) for node in body)
    functions = [node for node in body if isinstance(node, ast.FunctionDef)]
    classes = [
        node for node in body
        if isinstance(node, ast.ClassDef) and any(_base_name(b).endswith("TestCase")
                                                   for b in node.bases)
    ]  # fmt: skip
    check = [f for f in functions if f.name == "check" and f.args.args]
    pytest_style = [
        f for f in functions
        if f.name.startswith("test") and not f.args.args and not f.args.vararg
    ]  # fmt: skip
    label = test.strip()[:300]
    if check and not calls_at_top:
        plan.formats.add("check")
        call = {"name": "check", "args": ["__entry_point__"]}
        plan.items.append(TestItem(len(plan.items), label, test, call=call))
        return
    if (pytest_style or classes) and not calls_at_top:
        source = test
        for function in pytest_style:
            plan.formats.add("pytest")
            plan.items.append(TestItem(len(plan.items), function.name, source,
                                       call={"name": function.name}))  # fmt: skip
            source = ""
        for cls in classes:
            plan.formats.add("unittest")
            plan.items.append(TestItem(len(plan.items), cls.name, source,
                                       call={"unittest": cls.name}))  # fmt: skip
            source = ""
        return
    asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    if body and isinstance(body[-1], ast.Assert) and len(asserts) == 1:
        condition = body[-1].test
        if isinstance(condition, ast.Compare) and len(condition.ops) == 1:
            op = _COMPARE_OPS.get(type(condition.ops[0]))
            if op is not None:
                left, right = condition.left, condition.comparators[0]
                plan.formats.add("assert")
                split = {
                    "before": [ast.unparse(node) for node in body[:-1]],
                    "left": ast.unparse(left),
                    "op": op,
                    "right": ast.unparse(right),
                    "candidate_side": "right" if _is_literal(left) else "left",
                }
                plan.items.append(TestItem(len(plan.items), label, split=split))
                return
    plan.formats.add("assert")
    plan.items.append(TestItem(len(plan.items), label, test))


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _runner_files(code: str) -> dict[str, str | bytes]:
    return {
        "solution.py": code,
        "runner.py": script_text("runner.py"),
        "runner.pyc": script_bytecode("runner.py"),
        "boot.py": BOOT,
    }


def judge_deadline(timeout_s: float) -> float:
    """The judge's own deadline: early enough to kill the candidate and sign its records
    inside the sandbox's timeout (a run killed from outside reports nothing)."""
    return max(0.2, timeout_s * 0.9 - 0.15)


@dataclass
class JudgeRun:
    records: list[dict[str, Any]]
    result: Any

    @property
    def load_error(self) -> str | None:
        for record in self.records:
            if "load_error" in record:
                return str(record["load_error"])[:500]
        return None

    @property
    def finished(self) -> bool:
        return any(record.get("done") for record in self.records)

    @property
    def deadline(self) -> bool:
        return any(record.get("deadline") for record in self.records)


def run_judge(
    state: ScoringState,
    code: str,
    *,
    timeout_s: float,
    server: dict[str, Any] | None = None,
    items: list[TestItem] | None = None,
    names: set[str] | None = None,
    setup: str = "",
    entry: str | None = None,
    wipe: bool = False,
    prefix: str = "judge",
) -> JudgeRun:
    """One sandbox run of the judge and the candidate server; the signed records back."""
    key = secrets.token_bytes(16)
    request = {
        "key": key.hex(),
        "deadline_s": judge_deadline(timeout_s),
        "server": {"solution": "solution.py", **(server or {})},
        "items": [item.request() for item in items or []],
        "names": sorted(names or ()),
        "setup": setup,
        "entry_point": entry,
        "wipe": wipe,
    }
    result = state.run_python(
        "boot.py",
        ["runner.pyc", "runner.py", "judge"],
        _runner_files(code),
        stdin=json.dumps(request),
        timeout=timeout_s,
        prefix=prefix,
    )
    return JudgeRun(signed_records(result.stdout, key), result)


def judge_results(items: list[TestItem], run: JudgeRun) -> tuple[int, list[dict[str, Any]]]:
    by_id: dict[int, dict[str, Any]] = {}
    for record in run.records:
        ident = record.get("id")
        if isinstance(ident, int) and not isinstance(ident, bool) and ident not in by_id:
            by_id[ident] = record
    load_error = run.load_error
    passed = 0
    results = []
    for item in items:
        outcome: dict[str, Any] = {"test": item.label, "verified": "judge"}
        found = by_id.get(item.id)
        ok = False
        if found is None:
            outcome["error"] = load_error or (
                "no result (the run ended before this test)" if not run.finished else "no result"
            )
        else:
            ok = found.get("passed") is True
            if not ok:
                if "got" in found:
                    outcome["got"] = str(found["got"])[:300]
                if found.get("error") and found.get("error") != "AssertionError":
                    outcome["error"] = str(found["error"])[:500]
        outcome["passed"] = ok
        passed += ok
        results.append(outcome)
    return passed, results


def exec_summary(result: Any) -> dict[str, Any]:
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "wall_s": round(result.wall_s, 4),
        "cpu_s": None if result.cpu_s is None else round(result.cpu_s, 5),
        "stderr": tail(result.stderr, 1500),
    }


def _judged_tests(
    criterion: Criterion, sample: Sample, state: ScoringState, server: dict[str, Any]
) -> tuple[list[TestItem], JudgeRun, int, list[dict[str, Any]]]:
    code = candidate_code(sample, criterion.params)
    tests, setup = tests_and_setup(sample, criterion.params)
    plan = plan_tests(tests, setup)
    run = run_judge(
        state,
        code,
        timeout_s=criterion.context.timeout_s,
        server=server,
        items=plan.items,
        names=plan.names,
        setup=setup,
        entry=entry_point(sample, criterion.params),
    )
    if not run.records and not run.result.timed_out:
        raise CriterionError(f"the judge reported nothing: {exec_summary(run.result)}")
    passed, results = judge_results(plan.items, run)
    return plan.items, run, passed, results


_CODE_PARAMS: dict[str, Any] = {
    "code_from": CODE_FROM_SCHEMA,
    "tests": TESTS_SCHEMA,
    "setup": {"type": "string", "description": "code the tests run first (imports, helpers)"},
    "entry_point": ENTRY_POINT_SCHEMA,
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
    sample's ``ground_truth``: a list; a dict with ``tests``/``test_list`` and
    ``setup``/``test_setup_code``/``test_imports`` as in MBPP; or HumanEval's ``test`` and
    ``entry_point``) are snippets: asserts, a ``def check(candidate)`` suite (called with the
    ``entry_point`` function), pytest-style ``def test_*()`` functions (each one a test;
    ``pytest.raises``/``approx`` work without pytest) or ``unittest.TestCase`` classes (each
    class a test). ``setup`` runs in the tests' namespace first. Each test's result is in
    ``details.tests`` (passed, the value got when a comparison failed, the error). With
    ``"credit": "all"`` the score is 1 only when every test passes.

    The tests run in a judge process the candidate cannot reach (see the module notes on
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
        items, run, passed, results = _judged_tests(self, sample, state, {})
        details: dict[str, Any] = {
            "passed": passed,
            "total": len(items),
            "tests": results,
            "run": exec_summary(run.result),
        }
        if run.load_error:
            details["load_error"] = run.load_error
        if run.deadline:
            details["timed_out"] = True
        if self.params.get("credit") == "all":
            return Outcome(1.0 if passed == len(items) else 0.0, details)
        return Outcome(passed / len(items), details)

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
        result = state.run_python(
            "check.py",
            [],
            {"solution.py": code, "check.py": self._CHECK},
            timeout=self.context.timeout_s,
            prefix="compiles",
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

    coverage.py runs in the sandbox around the candidate's code while the judge runs the
    ``tests`` (as for ``unit_tests``). ``branch`` measures branches too. ``details.missing``
    lists the missed lines. The lines are counted inside the candidate's own process, which
    could inflate them, so the score is 0 unless every test passes in the judge (which the
    candidate cannot reach): a candidate that fails, exits or tampers covers nothing.
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
        server = {"coverage": True, "branch": bool(self.params.get("branch", False))}
        items, run, passed, _ = _judged_tests(self, sample, state, server)
        if run.load_error:
            # Code that does not load covers nothing (exiting at import is not coverage).
            return Outcome(0.0, {"load_error": run.load_error})
        if passed < len(items):
            failed = len(items) - passed
            reason = f"{failed} of {len(items)} tests failed: coverage counts only for passing code"
            return Outcome(0.0, {"reason": reason})
        reports = [r["coverage"] for r in run.records if isinstance(r.get("coverage"), dict)]
        if not reports:
            raise CriterionError(f"coverage produced no report: {exec_summary(run.result)}")
        lines = len(candidate_code(sample, self.params).splitlines())
        statements = {s for s in reports[-1].get("statements", []) if _line(s, lines)}
        missing = {s for s in reports[-1].get("missing", []) if _line(s, lines)} & statements
        if not statements:
            return Outcome(0.0, {"reason": "no statements to cover"})
        covered = len(statements - missing)
        return Outcome(
            covered / len(statements),
            {"statements": len(statements), "covered": covered,
             "missing": sorted(missing)[:200]},
        )  # fmt: skip


def _line(value: Any, lines: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= lines


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

        def measure(source: str, expression: str) -> tuple[float, dict[str, Any] | None, Any]:
            run = run_judge(
                state, source, timeout_s=sandbox_timeout, prefix="timing", wipe=True,
                server={"workload": expression, "setup": setup},
            )  # fmt: skip
            records = [r for r in run.records if r.get("id") == 0]
            result = run.result
            cost = result.cpu_s if result.cpu_s is not None else result.wall_s
            return cost, (records[0] if records else None), result

        baseline = min(measure("", "None")[0] for _ in range(rounds))
        reference_costs, candidate_costs = [], []
        reference_records, candidate_records = [], []
        candidate_run = None
        for _ in range(rounds):
            cost, record, _ = measure(reference, workload)
            reference_costs.append(cost)
            reference_records.append(record)
            cost, record, candidate_run = measure(code, workload)
            candidate_costs.append(cost)
            candidate_records.append(record)
        reference_record = reference_records[-1]
        if not reference_record or "value" not in reference_record:
            raise CriterionError(f"the reference solution failed: {reference_record}")
        details: dict[str, Any] = {"baseline_s": baseline}
        # Every measured round must have answered: a round that killed the judge (and so
        # left its files behind) must not let a later round's time count.
        failed = [r for r in candidate_records if not r or "value" not in r]
        if failed:
            details["reason"] = (failed[0] or {}).get("error") or exec_summary(candidate_run)
            return Outcome(0.0, details)
        try:
            expected = decode(reference_record["value"])
            same = all(decode(r["value"]) == expected for r in candidate_records if r)
        except (BadValue, ValueError, TypeError):
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
        exact = bool(self.params.get("exact", False))
        results: list[dict[str, Any]] = []
        passed = 0
        for index, (stdin, expected) in enumerate(cases):
            if results and self.params.get("stop_on_failure") and not results[-1]["passed"]:
                results.append({"case": index, "passed": False, "skipped": True})
                continue
            # Each case starts from the code as written: one case cannot leave a file (or
            # rewrite solution.py) for the next.
            run = state.run_python(
                "solution.py",
                [],
                {"solution.py": code},
                stdin=stdin,
                timeout=per_case_timeout,
                prefix="io",
                utf8_mode=False,
            )
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
