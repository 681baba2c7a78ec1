"""The registry of criterion kinds: every kind registers its name, parameters and docs here.

Registering is cheap: a kind's module declares its parameter schema as plain data and imports
its heavy dependencies (transformers, trimesh, sandboxes) only when it first judges a sample,
so validating a spec in the console never loads a model or a mesh library.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from rewards.types import Outcome, Sample

if TYPE_CHECKING:
    from rewards.sandboxing import ScoringState

ParamProblem = tuple[str, str]
"""A problem with a criterion's parameters: (path below ``params``, message)."""


class ParamsError(Exception):
    """Raised by a criterion's constructor for a parameter that only fails when used (a
    dotted path that does not import); `Rubric.from_spec` turns it into a `SpecIssue`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class Criterion:
    """Base class of every criterion kind.

    Subclasses set ``kind``, ``summary`` and ``params_schema`` (a JSON schema for ``params``),
    document themselves in the class docstring, and implement ``evaluate``. ``check_params``
    adds checks a JSON schema cannot express (a regex that must compile); it reports
    problems, it never raises.
    """

    kind: ClassVar[str]
    summary: ClassVar[str]
    params_schema: ClassVar[dict[str, Any]] = {"type": "object", "additionalProperties": False}
    # Kinds whose evaluation may block for long (user code, models, symbolic maths) are run
    # with a deadline by the rubric; cheap deterministic kinds run inline.
    blocking: ClassVar[bool] = False
    # Kinds that run code in a sandbox; the rubric provides them one through `context`.
    uses_sandbox: ClassVar[bool] = False
    # Sandboxed kinds that need coverage.py or ruff inside the sandbox (the tools image).
    needs_tools: ClassVar[bool] = False
    default_timeout_s: ClassVar[float] = 10.0
    # Kinds that implement `evaluate_batch` (they must not read `state.earlier`).
    batchable: ClassVar[bool] = False

    def __init__(self, params: dict[str, Any], context: CriterionContext) -> None:
        self.params = params
        self.context = context

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        return []

    @classmethod
    def references(cls, params: dict[str, Any]) -> list[tuple[str, str]]:
        """(path below ``params``, criterion name) for each earlier criterion it reads."""
        return []

    def evaluate(self, sample: Sample) -> Outcome:
        raise NotImplementedError

    def evaluate_batch(self, samples: list[Sample]) -> list[Outcome] | None:
        """Judges many samples in one go (a batched model forward, one call of a TRL
        function), or returns None when this criterion judges one at a time. `score_batch`
        calls it first for kinds with ``batchable``; if it raises, those samples are judged
        one by one instead."""
        return None

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        """What the rubric calls. ``state`` holds the scores of the criteria before this one
        (``state.earlier``) and the sample's sandbox (``state.sandbox()``); kinds that need
        neither just implement `evaluate`."""
        return self.evaluate(sample)

    def close(self) -> None:
        """Releases what the criterion holds (a model, a pool); called by ``Rubric.close``."""


@dataclass
class CriterionContext:
    """What a rubric hands each criterion it builds."""

    name: str
    timeout_s: float
    sandbox_settings: dict[str, Any]
    # Objects the caller injects by name, e.g. an LLM judge's generation engine; set through
    # `Rubric.from_spec(spec, resources={...})`.
    resources: dict[str, Any]


@dataclass(frozen=True)
class CriterionKindInfo:
    """What the rubric editor's help panel shows for a kind."""

    name: str
    summary: str
    params_schema: dict[str, Any]
    docs: str
    uses_sandbox: bool


_KINDS: dict[str, type[Criterion]] = {}
C = TypeVar("C", bound=type[Criterion])


def register(cls: C) -> C:
    """Class decorator adding a criterion kind to the registry."""
    name = cls.kind
    if name in _KINDS and _KINDS[name] is not cls:
        raise ValueError(f"criterion kind {name!r} is registered twice")
    _KINDS[name] = cls
    return cls


def _ensure_builtin_kinds() -> None:
    import rewards.criteria  # noqa: F401  (registers the built-in kinds)


def kind_class(name: str) -> type[Criterion] | None:
    _ensure_builtin_kinds()
    return _KINDS.get(name)


def kind_names() -> list[str]:
    _ensure_builtin_kinds()
    return sorted(_KINDS)


def criterion_kinds() -> dict[str, CriterionKindInfo]:
    """Every registered kind, by name, with its parameter schema and documentation."""
    _ensure_builtin_kinds()
    return {
        name: CriterionKindInfo(
            name=name,
            summary=cls.summary,
            params_schema=cls.params_schema,
            docs=inspect.cleandoc(cls.__doc__ or cls.summary),
            uses_sandbox=cls.uses_sandbox,
        )
        for name, cls in sorted(_KINDS.items())
    }
