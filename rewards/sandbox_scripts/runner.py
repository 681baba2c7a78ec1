"""Runs inside a sandbox with ``python3 -I runner.py``; reads one JSON request on stdin.

Modes:
- ``probes``: exec the candidate (solution.py), then evaluate each probe; for a ``value``
  probe report the expression's value as strictly typed JSON (plain types only: an object
  with its own ``__eq__`` is refused), for an ``exec`` probe report whether it raised.
  The host, not this process, decides whether a value passes: expected values never enter
  the sandbox.
- ``coverage``: the same, under coverage.py (from /image/site), then report the candidate's
  statements and the missed ones.
- ``function``: load user reward code and call its function with the sample.

The request arrives as a Python literal and records leave as Python literals (``repr`` of
plain values; the host reads them with ``ast.literal_eval``): importing ``json`` (and ``re``
with it) would cost more than the tests themselves. Records go to the original stdout, one
per line after a marker; everything the candidate prints goes to stderr. Records from this
process are only as trustworthy as the candidate lets them be, which is why the host
compares values itself.
"""

import math
import os
import sys

MARKER = "@@rewards-record "
MAX_DEPTH = 60
MAX_ITEMS = 100000


class NotPlain(TypeError):
    pass


def encode(value, depth=0, budget=None):
    if budget is None:
        budget = [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlain("value too large to report")
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is int:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1, budget) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, depth + 1, budget) for v in value]}
    if kind is dict:
        return {
            "dict": [
                [encode(k, depth + 1, budget), encode(v, depth + 1, budget)]
                for k, v in value.items()
            ]
        }
    if kind is set or kind is frozenset:
        return {"set": [encode(v, depth + 1, budget) for v in value]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise NotPlain(f"returned a {kind.__module__}.{kind.__qualname__}, not a plain value")


def describe(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text[:500]


def main():
    request = eval(sys.stdin.read(), {"__builtins__": {}})  # noqa: S307 - the host's literal
    records = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the candidate reads EOF, not our request

    def emit(record):
        records.write(MARKER + repr(record) + "\n")
        records.flush()

    mode = request["mode"]
    if mode == "function":
        return run_function(request, emit)
    coverage = None
    solution = os.path.abspath(request["solution"])
    if mode == "coverage":
        sys.path.insert(0, "/image/site")
        import coverage as coverage_module

        coverage = coverage_module.Coverage(
            data_file=None,
            include=[solution],
            branch=bool(request.get("branch")),
            config_file=False,
        )
    with open(solution, encoding="utf-8") as handle:
        source = handle.read()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    if coverage is not None:
        coverage.start()
    try:
        try:
            exec(compile(source, solution, "exec"), namespace)  # noqa: S102 - in the sandbox
            if request.get("setup"):
                exec(compile(request["setup"], "<setup>", "exec"), namespace)  # noqa: S102
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it is a failure
            if coverage is not None:
                coverage.stop()
                coverage = None
            emit({"load_error": describe(exc)})
            return
        else:
            run_probes(request["probes"], namespace, emit)
    finally:
        if coverage is not None:
            coverage.stop()
    if coverage is not None:
        _, statements, _, missing, _ = coverage.analysis2(solution)
        emit({"coverage": {"statements": sorted(statements), "missing": sorted(missing)}})


def run_probes(probes, namespace, emit):
    for probe in probes:
        ident = probe["id"]
        try:
            for statement in probe.get("before", []):
                exec(compile(statement, f"<test {ident}>", "exec"), namespace)  # noqa: S102
            if probe["mode"] == "value":
                code = compile(probe["source"], f"<test {ident}>", "eval")
                value = eval(code, namespace)  # noqa: S307 - in the sandbox
                emit({"id": ident, "value": encode(value)})
            else:
                exec(compile(probe["source"], f"<test {ident}>", "exec"), namespace)  # noqa: S102
                emit({"id": ident, "passed": True})
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the test failed
            emit({"id": ident, "error": describe(exc)})


def run_function(request, emit):
    namespace = {"__name__": "user_reward", "__builtins__": __builtins__}
    try:
        with open(request["source"], encoding="utf-8") as handle:
            exec(compile(handle.read(), "user_reward.py", "exec"), namespace)  # noqa: S102
        function = namespace.get(request["function"])
        if not callable(function):
            emit({"error": f"no function {request['function']!r} in the code"})
            return
        import inspect

        names = list(inspect.signature(function).parameters)
        sample = request["sample"]
        if names[:2] == ["prompts", "completions"]:
            columns = {
                k: [v] for k, v in sample["metadata"].items() if k not in ("prompts", "completions")
            }
            result = function(
                prompts=[sample["prompt"]], completions=[sample["response"]], **columns
            )
            result = result[0] if isinstance(result, list) and result else result
        else:
            result = function(
                sample["domain"], sample["response"], sample["ground_truth"], sample["metadata"]
            )
        if isinstance(result, dict):
            result = result.get("score")
        if type(result) is bool:
            result = float(result)
        if type(result) not in (int, float) or not math.isfinite(result):
            emit({"error": f"returned {type(result).__name__}, not a finite number"})
            return
        emit({"score": float(result)})
    except BaseException as exc:  # noqa: BLE001
        import traceback

        emit({"error": describe(exc), "traceback": traceback.format_exc()[-1500:]})


if __name__ == "__main__":
    main()
