"""User reward functions: trusted installed code by dotted path, or untrusted code in a sandbox.

Two signatures are recognised and called unchanged:

- verl: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, which
  returns a number or a dict with ``"score"``. Called with the sample's domain, response,
  ground truth and metadata.
- TRL: ``reward_func(prompts, completions, **kwargs)``, which returns a list of numbers (or
  ``None`` for "does not apply"). `Rubric.score_batch` calls it once for the whole batch,
  as TRL does (`Rubric.score` with one-element lists); each metadata key is passed as a
  list (TRL passes dataset columns so; None where a sample lacks it), ``ground_truth`` too. Chat
  samples pass the prompt and completion as message lists, as TRL does for conversational
  data.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
from collections.abc import Callable
from typing import Any, ClassVar

from rewards.criteria.code import literal_request, parse_records
from rewards.registry import Criterion, ParamProblem, ParamsError, register
from rewards.sandbox_scripts import BOOT, script_bytecode, script_text
from rewards.sandboxing import ScoringState, tail
from rewards.types import CriterionError, Outcome, Sample

_DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*([:.][A-Za-z_][A-Za-z0-9_]*)$"
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")


def detect_signature(function: Callable[..., Any]) -> str:
    """``"verl"`` or ``"trl"``; ValueError when the signature is neither."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot read the signature: {exc}") from exc
    names = [p.name for p in parameters]
    if tuple(names[:3]) == VERL_PARAMETERS:
        return "verl"
    has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    if names[:2] == ["prompts", "completions"] and has_kwargs:
        return "trl"
    raise ValueError(
        f"signature ({', '.join(names)}) is neither verl's compute_score(data_source, "
        "solution_str, ground_truth, extra_info) nor TRL's reward_func(prompts, completions, "
        "**kwargs)"
    )


def _import(path: str) -> Callable[..., Any]:
    if ":" in path:
        module_name, _, attribute = path.partition(":")
    else:
        module_name, _, attribute = path.rpartition(".")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{path!r} is not callable")
    return target  # type: ignore[no-any-return]


def _takes_extra_info(function: Callable[..., Any]) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return len(parameters) > 3 or any(
        p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in parameters
    )


def _as_score(value: Any) -> tuple[float | None, dict[str, Any]]:
    extra: dict[str, Any] = {}
    if isinstance(value, dict):
        extra = {k: v for k, v in value.items() if k != "score" and _jsonable(v)}
        value = value.get("score")
    if value is None:
        return None, extra
    if isinstance(value, bool):
        value = float(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise CriterionError(f"returned {value!r}, not a finite number")
    return float(value), extra


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _trl_arguments(samples: list[Sample]) -> dict[str, Any]:
    """TRL's call for a batch: prompts, completions, and every column as a list (a sample
    without a column gets None there)."""
    prompts: list[Any] = []
    completions: list[Any] = []
    for sample in samples:
        if sample.messages is not None:
            prompts.append(
                sample.prompt
                if isinstance(sample.prompt, list)
                else [{"role": "user", "content": sample.prompt_text}]
            )
            completions.append([{"role": "assistant", "content": sample.response}])
        else:
            prompts.append(sample.prompt_text)
            completions.append(sample.response)
    keys = list(dict.fromkeys(key for sample in samples for key in sample.metadata))
    columns = {key: [sample.metadata.get(key) for sample in samples] for key in keys}
    columns.setdefault("ground_truth", [sample.ground_truth for sample in samples])
    return {"prompts": prompts, "completions": completions, **columns}


@register
class PythonFunction(Criterion):
    """Calls an installed (trusted) reward function by dotted path, unchanged.

    ``function`` is ``package.module:name`` (or ``package.module.name``); its signature
    decides how it is called (see the module notes: verl's ``compute_score`` or TRL's
    ``reward_func``). Extra keyword arguments come from ``kwargs``. A function that returns
    ``None`` (TRL: "does not apply") scores 0 with ``details.applicable`` false; a dict's
    other keys are kept in ``details``. Runs in-process with the criterion's deadline: this
    is for code the deployment installed, not code a user typed (``sandboxed_function``).
    """

    kind = "python_function"
    summary = "An installed reward function (verl compute_score or TRL reward_func)."
    blocking = True
    batchable = True
    default_timeout_s = 30.0
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["function"],
        "properties": {
            "function": {"type": "string", "pattern": _DOTTED},
            "kwargs": {"type": "object"},
        },
    }

    def __init__(self, params: dict[str, Any], context: Any) -> None:
        super().__init__(params, context)
        try:
            self._function = _import(params["function"])
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise ParamsError("function", f"cannot import {params['function']!r}: {exc}") from exc
        try:
            self.signature = detect_signature(self._function)
            self._extra_info = _takes_extra_info(self._function)
        except ValueError as exc:
            raise ParamsError("function", str(exc)) from exc

    def evaluate(self, sample: Sample) -> Outcome:
        kwargs = dict(self.params.get("kwargs", {}))
        if self.signature == "verl":
            arguments = [sample.domain, sample.response, sample.ground_truth]
            if self._extra_info:
                arguments.append(sample.metadata)
            value = self._function(*arguments, **kwargs)
        else:
            values = self._function(**_trl_arguments([sample]), **kwargs)
            if not isinstance(values, list | tuple) or len(values) != 1:
                raise CriterionError("a TRL reward function must return one value per completion")
            value = values[0]
        return self._outcome(value)

    def _outcome(self, value: Any) -> Outcome:
        score, extra = _as_score(value)
        if score is None:
            return Outcome(0.0, {"applicable": False, "signature": self.signature})
        return Outcome(score, {"signature": self.signature, **extra})

    def evaluate_batch(self, samples: list[Sample]) -> list[Outcome] | None:
        """TRL functions are batch functions: one call for the whole batch, as TRL makes."""
        if self.signature != "trl":
            return None
        values = self._function(**_trl_arguments(samples), **dict(self.params.get("kwargs", {})))
        if not isinstance(values, list | tuple) or len(values) != len(samples):
            raise CriterionError("a TRL reward function must return one value per completion")
        return [self._outcome(value) for value in values]


@register
class SandboxedFunction(Criterion):
    """Runs reward code a user typed (untrusted) inside a sandbox and returns its score.

    ``code`` defines ``function`` (default ``compute_score``) with verl's or TRL's
    signature, using the standard library only. The sample travels in as JSON (metadata
    that is not JSON is left out); the function's number comes back. It never runs on the
    host, and a crash, a timeout or a non-number scores 0 with the reason.
    """

    kind = "sandboxed_function"
    summary = "User reward code (verl/TRL signature) run only inside a sandbox."
    uses_sandbox = True
    default_timeout_s = 10.0
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["code"],
        "properties": {
            "code": {"type": "string", "minLength": 1, "maxLength": 200000},
            "function": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        import ast

        try:
            tree = ast.parse(params["code"])
        except SyntaxError as exc:
            return [("code", f"is not valid Python: {exc.msg} (line {exc.lineno})")]
        name = params.get("function", "compute_score")
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if name not in defined:
            return [("function", f"the code defines no top-level function {name!r}")]
        return []

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        payload = {
            "domain": sample.domain,
            "prompt": sample.prompt if _jsonable(sample.prompt) else sample.prompt_text,
            "response": sample.response,
            "ground_truth": sample.ground_truth if _jsonable(sample.ground_truth) else None,
            "metadata": {k: v for k, v in sample.metadata.items() if _jsonable(v)},
        }
        request = {
            "mode": "function",
            "source": "user_reward.py",
            "function": self.params.get("function", "compute_score"),
            "sample": payload,
        }
        result = state.run_python(
            "boot.py",
            ["runner.pyc", "runner.py"],
            {
                "user_reward.py": self.params["code"],
                "runner.py": script_text("runner.py"),
                "runner.pyc": script_bytecode("runner.py"),
                "boot.py": BOOT,
            },
            stdin=literal_request(request),
            timeout=self.context.timeout_s,
            prefix="function",
        )

        records = parse_records(result.stdout)
        if not records:
            raise CriterionError(
                f"the function returned nothing (exit {result.exit_code}, timed out "
                f"{result.timed_out}): {tail(result.stderr, 800)}"
            )
        record = records[-1]
        if "error" in record:
            raise CriterionError(f"the function failed: {record['error']}")
        score = record.get("score")
        if (
            not isinstance(score, int | float)
            or isinstance(score, bool)
            or not math.isfinite(score)
        ):
            raise CriterionError("the function returned no number")
        return Outcome(float(score), {"stderr": tail(result.stderr, 500)})

    def evaluate(self, sample: Sample) -> Outcome:
        raise CriterionError("sandboxed_function needs a rubric's sandbox")
