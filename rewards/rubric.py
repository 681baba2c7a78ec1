"""A rubric: named, weighted criteria and the rule that folds their scores into one reward."""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from rewards.registry import Criterion, CriterionContext, ParamsError, kind_class
from rewards.sandboxing import CodeSandboxes, ScoringState
from rewards.spec import RubricSpecError, SpecIssue, raise_for_spec
from rewards.types import CriterionError, Outcome, RewardResult, Sample

T = TypeVar("T")
log = logging.getLogger(__name__)

# How much longer than its own timeout a sandboxed criterion may take in all (creating the
# sandbox, copying files, several runs) before the rubric gives up on it.
SANDBOX_DEADLINE_FACTOR = 3.0
SANDBOX_DEADLINE_GRACE_S = 10.0


@contextlib.contextmanager
def _cyclic_gc_paused(pause: bool) -> Iterator[None]:
    """Pauses the cyclic garbage collector for a burst of cheap scoring.

    Scoring thousands of samples with in-process criteria allocates many small dicts (the
    details), and the collections they trigger measured at over half the time of the batch.
    Results hold no cycles, so reference counting frees them anyway; the collector runs
    again, unchanged, as soon as the burst ends (it is only re-enabled if it was enabled).
    """
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class DeadlineExceeded(Exception):
    pass


def call_with_deadline(function: Callable[[], T], deadline_s: float) -> T:
    """Runs ``function`` on a fresh daemon thread and waits at most ``deadline_s``.

    Python cannot stop a thread, so a function that overruns keeps running in the background
    until it returns; the caller gets `DeadlineExceeded` at once and moves on. C code that
    holds the GIL (a backtracking `re`, SymPy on huge integers) would stall even the waiting,
    so the criteria keep such work out of threads: model-written code runs in a sandbox,
    symbolic maths in killable worker processes (`rewards.workers`), and regexes over model
    output use the `regex` module's own timeout.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = function()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="rewards-criterion", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise DeadlineExceeded(f"timed out after {deadline_s:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class _Entry:
    name: str
    weight: float
    criterion: Criterion
    timeout_s: float


class Rubric:
    """Build with `Rubric.from_spec`; see the `rewards` package docstring for the spec."""

    def __init__(self, spec: dict[str, Any], entries: list[_Entry]) -> None:
        self.spec = spec
        self._entries = entries
        sandboxed = [e.criterion for e in entries if e.criterion.uses_sandbox]
        self._sandboxes = (
            CodeSandboxes(spec.get("sandbox", {}), any(c.needs_tools for c in sandboxed))
            if sandboxed
            else None
        )
        aggregate = spec.get("aggregate", "weighted_sum")
        if isinstance(aggregate, dict):
            gate = aggregate["gate"]
            self._gates: list[str] = [gate] if isinstance(gate, str) else list(gate)
            self._gate_threshold = float(aggregate.get("threshold", 1.0))
            self._method: str = aggregate.get("then", "weighted_sum")
        else:
            self._gates = []
            self._gate_threshold = 1.0
            self._method = aggregate
        self._normalize = bool(spec.get("normalize", False))
        clip = spec.get("clip")
        self._clip: tuple[float, float] | None = (clip[0], clip[1]) if clip else None
        self._parallel = any(e.criterion.blocking or e.criterion.uses_sandbox for e in entries)
        sandbox = spec.get("sandbox", {})
        cpus = os.cpu_count() or 1
        self.default_workers = int(sandbox.get("max_concurrency", 2 * cpus))

    @classmethod
    def from_spec(cls, spec: dict[str, Any], *, resources: dict[str, Any] | None = None) -> Rubric:
        """Validates ``spec`` (raising `RubricSpecError` with every issue) and builds it.

        ``resources`` hands criteria objects a JSON spec cannot hold, by name: an LLM judge's
        generation engine, a preloaded reward model.
        """
        raise_for_spec(spec)
        spec = copy.deepcopy(spec)
        sandbox_settings = dict(spec.get("sandbox", {}))
        entries = []
        issues: list[SpecIssue] = []
        for index, item in enumerate(spec["criteria"]):
            criterion_cls = kind_class(item["kind"])
            assert criterion_cls is not None  # validated above
            timeout_s = float(item.get("timeout_s", criterion_cls.default_timeout_s))
            context = CriterionContext(
                name=item["name"],
                timeout_s=timeout_s,
                sandbox_settings=sandbox_settings,
                resources=dict(resources or {}),
            )
            try:
                criterion = criterion_cls(dict(item.get("params", {})), context)
            except ParamsError as exc:
                issues.append(SpecIssue(f"criteria[{index}].params.{exc.path}", exc.message))
                continue
            weight = float(item.get("weight", 1.0))
            entries.append(_Entry(item["name"], weight, criterion, timeout_s))
        if issues:
            for entry in entries:
                entry.criterion.close()
            raise RubricSpecError(issues)
        return cls(spec, entries)

    @property
    def criterion_names(self) -> list[str]:
        return [entry.name for entry in self._entries]

    def score(self, sample: Sample | dict[str, Any]) -> RewardResult:
        """Scores one sample. A criterion that crashes or overruns scores 0 with the reason
        in ``details[name]["error"]``; this method itself does not raise for them."""
        if not isinstance(sample, Sample):
            sample = Sample.from_dict(sample)
        return self._score(sample, {})

    def _score(
        self, sample: Sample, judged: dict[str, tuple[float, dict[str, Any]]]
    ) -> RewardResult:
        breakdown: dict[str, float] = {}
        details: dict[str, Any] = {}
        state = ScoringState(self._sandboxes)
        try:
            for entry in self._entries:
                if entry.name in judged:
                    score, found = judged[entry.name]
                else:
                    score, found = self._evaluate(entry, sample, state)
                breakdown[entry.name] = score
                details[entry.name] = found
                state.earlier[entry.name] = score
        finally:
            state.close()
        total, how = self._aggregate(breakdown)
        details["_aggregate"] = how
        return RewardResult(total=total, breakdown=breakdown, details=details)

    def score_batch(
        self, samples: Iterable[Sample | dict[str, Any]], max_workers: int | None = None
    ) -> list[RewardResult]:
        """Scores many samples on a bounded pool of threads; results keep the input order.

        Rubrics of cheap in-process criteria run on the calling thread (threads would only
        add contention); rubrics with sandboxed, model or user-code criteria run up to
        ``max_workers`` samples at once (default: the spec's ``sandbox.max_concurrency``,
        else twice the CPU count).
        """
        batch = [s if isinstance(s, Sample) else Sample.from_dict(s) for s in samples]
        workers = max_workers if max_workers is not None else self.default_workers
        if workers < 1:
            raise ValueError("max_workers must be at least 1")
        judged = self._judge_batchable(batch)
        parallel = self._parallel or max_workers is not None
        if workers == 1 or len(batch) <= 1 or not parallel:
            with _cyclic_gc_paused(len(batch) >= 64):
                return [self._score(s, judged[i]) for i, s in enumerate(batch)]
        with ThreadPoolExecutor(max_workers=min(workers, len(batch))) as pool:
            return list(pool.map(self._score, batch, judged))

    def _judge_batchable(
        self, batch: list[Sample]
    ) -> list[dict[str, tuple[float, dict[str, Any]]]]:
        """Outcomes of the batchable criteria for the whole batch, per sample; a criterion
        whose batch call fails is left out, so each sample is judged alone."""
        judged: list[dict[str, tuple[float, dict[str, Any]]]] = [{} for _ in batch]
        if len(batch) < 2:
            return judged
        for entry in self._entries:
            criterion = entry.criterion
            if not criterion.batchable:
                continue
            started = time.perf_counter()
            deadline = entry.timeout_s * max(1.0, len(batch) / 8)
            try:
                outcomes = call_with_deadline(partial(criterion.evaluate_batch, batch), deadline)
            except DeadlineExceeded as exc:
                failed = {"error": f"batch {exc}", "timed_out": True}
                for per_sample in judged:
                    per_sample[entry.name] = (0.0, dict(failed))
                continue
            except Exception:
                log.info("batch judgement of %r failed; judging one by one", entry.name,
                         exc_info=True)  # fmt: skip
                continue
            if outcomes is None or len(outcomes) != len(batch):
                continue
            share = round((time.perf_counter() - started) * 1000 / len(batch), 3)
            for per_sample, outcome in zip(judged, outcomes, strict=True):
                if isinstance(outcome, Outcome):
                    found = {**outcome.details, "elapsed_ms": share, "batched": True}
                    per_sample[entry.name] = (float(outcome.score), found)
        return judged

    def close(self) -> None:
        for entry in self._entries:
            entry.criterion.close()
        if self._sandboxes is not None:
            self._sandboxes.close()

    def __enter__(self) -> Rubric:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------

    def _evaluate(
        self, entry: _Entry, sample: Sample, state: ScoringState
    ) -> tuple[float, dict[str, Any]]:
        criterion = entry.criterion
        started = time.perf_counter()
        try:
            if criterion.uses_sandbox:
                deadline = entry.timeout_s * SANDBOX_DEADLINE_FACTOR + SANDBOX_DEADLINE_GRACE_S
                try:
                    outcome = call_with_deadline(lambda: criterion.judge(sample, state), deadline)
                except DeadlineExceeded:
                    state.kill_running()
                    raise
            elif criterion.blocking:
                outcome = call_with_deadline(
                    lambda: criterion.judge(sample, state), entry.timeout_s
                )
            else:
                outcome = criterion.judge(sample, state)
            if not isinstance(outcome, Outcome):
                raise CriterionError(f"returned {type(outcome).__name__}, not an Outcome")
            score, found = float(outcome.score), dict(outcome.details)
        except DeadlineExceeded as exc:
            score, found = 0.0, {"error": str(exc), "timed_out": True}
        except CriterionError as exc:
            score, found = 0.0, {"error": str(exc)}
        except Exception as exc:
            score, found = (
                0.0,
                {
                    "error": f"crashed: {type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=-4)[-2000:],
                },
            )
        found["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return score, found

    def _aggregate(self, scores: dict[str, float]) -> tuple[float, dict[str, Any]]:
        how: dict[str, Any] = {"method": self._method}
        weighted = [(e.weight, scores[e.name]) for e in self._entries if e.weight > 0]
        if self._method == "min":
            raw = min((s for _, s in weighted), default=0.0)
        elif self._method == "product":
            # A weighted geometric product: each score (negative ones count as 0) raised to
            # its weight; normalised, the weighted geometric mean.
            log_sum, weight_sum, zero = 0.0, 0.0, False
            for weight, score in weighted:
                if score <= 0:
                    zero = True
                    break
                log_sum += weight * math.log(score)
                weight_sum += weight
            if zero or not weighted:
                raw = 0.0
            else:
                raw = math.exp(log_sum / weight_sum if self._normalize else log_sum)
        else:
            raw = sum(w * s for w, s in weighted)
            weight_sum = sum(w for w, _ in weighted)
            if self._normalize and weight_sum > 0:
                raw /= weight_sum
        total = raw
        if self._gates:
            passed = {g: scores[g] >= self._gate_threshold - 1e-9 for g in self._gates}
            how["gates"] = passed
            if not all(passed.values()):
                total = 0.0
        if self._clip is not None:
            total = min(max(total, self._clip[0]), self._clip[1])
        how["raw"] = raw
        return float(total), how
