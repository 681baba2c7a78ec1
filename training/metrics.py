"""Per-step metrics, with names users of verl and TRL already read.

From the samples of a step (`SampleRecord`, gathered from every rank):

- ``reward/mean``, ``reward/std``; ``reward/<domain>/mean|std``;
  ``reward/<domain>/<criterion>/mean`` (verl's ``critic/score/mean`` per data source, TRL's
  ``rewards/<func>/mean``); ``critic/score/mean`` is kept as an alias of ``reward/mean``.
- ``pass_rate`` and ``pass_rate/<domain>`` (reward total >= the domain's ``pass_threshold``).
- ``response_length/mean``, ``response_length/clip_ratio`` (stopped by the token limit).
- ``frac_reward_zero_std`` (TRL): the fraction of groups whose rewards were all equal.
- ``batch/discarded_fraction``: the share of the step's samples it did not train on (their
  trajectories carry ``discarded``, the reason: `training.trajectory.DISCARD_REASONS`).
- ``mix/<domain>/weight`` and ``mix/<domain>/prompts``: the mix that was actually drawn.

From the trainer: ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/kl``, ``actor/kl_loss``,
``actor/entropy``, ``actor/grad_norm``, ``actor/lr``, ``critic/advantages/mean`` ...
Timing: ``timing_s/{rollout,tools,reward,train,weight_sync,step}``; throughput:
``perf/throughput`` (prompt + response tokens per second of the whole step),
``perf/rollout_tokens_per_s``, ``perf/num_tokens``.
Held-out evaluation: ``eval/reward/mean``, ``eval/reward/sem`` (standard error of that mean),
``eval/reward/<domain>/mean``, ``eval/pass_rate``, ``eval/pass_rate/<domain>``.

Events from the metrics: ``run.collapsed`` / ``run.collapse_recovered`` (`CollapseDetector`).

The step as a timeline: after each step's metrics the loop sends a ``step.timeline`` event,
``{"step", "step_s", "stages": [{"stage", "start_s", "end_s", "rank", ...}]}``, one span per
stage and rank (every rank's, gathered on rank 0), start and end in seconds from the step's
start. Stages: ``rollout``, ``tools`` (only when tool calls ran; it spans the same wall time as
its rollout round, since an episode interleaves generation and tools), ``reward`` (those three
once per generation round, with ``round``: DAPO's dynamic sampling runs several),
``logprobs`` (the reference/old log-prob and value passes, only when the step runs any),
``train`` (the update), ``weight_sync`` and ``checkpoint`` (a periodic save after the step; it
ends after ``step_s``, which stays ``timing_s/step``). Every span names its ``host``.
``rollout`` and ``tools`` spans carry ``busy_s``, the seconds each stage itself took in that
window (what ``timing_s/rollout`` and ``timing_s/tools`` sum); ``logprobs`` and ``train``
together are ``timing_s/train``; for the others ``end_s - start_s`` summed over the step is
``timing_s/<stage>``. Held-out evaluation runs between steps and is not on the timeline.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAIN_METRICS", "CollapseDetector", "SampleRecord", "eval_metrics", "sample_metrics"]

# What the CLI's live table shows, in this order.
MAIN_METRICS = (
    "reward/mean",
    "pass_rate",
    "response_length/mean",
    "actor/kl",
    "actor/entropy",
    "actor/pg_loss",
    "actor/grad_norm",
    "frac_reward_zero_std",
    "perf/throughput",
    "timing_s/step",
)


@dataclass
class SampleRecord:
    """What the metrics need from one sample (small, so ranks can gather them cheaply)."""

    domain: str
    group: int
    reward: float
    breakdown: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    response_length: int = 0
    prompt_length: int = 0
    clipped: bool = False


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    """Population std (what verl/TRL log for batch rewards)."""
    if not values:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _sem(values: Sequence[float]) -> float:
    """Standard error of the mean (sample std / sqrt n)."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def sample_metrics(records: Iterable[SampleRecord]) -> dict[str, float]:
    records = list(records)
    out: dict[str, float] = {}
    rewards = [r.reward for r in records]
    out["reward/mean"] = _mean(rewards)
    out["reward/std"] = _std(rewards)
    out["critic/score/mean"] = out["reward/mean"]
    out["pass_rate"] = _mean([float(r.passed) for r in records])
    out["response_length/mean"] = _mean([float(r.response_length) for r in records])
    out["response_length/clip_ratio"] = _mean([float(r.clipped) for r in records])
    by_domain: dict[str, list[SampleRecord]] = defaultdict(list)
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in records:
        by_domain[record.domain].append(record)
        groups[(record.domain, record.group)].append(record.reward)
    for domain, items in sorted(by_domain.items()):
        values = [r.reward for r in items]
        out[f"reward/{domain}/mean"] = _mean(values)
        out[f"reward/{domain}/std"] = _std(values)
        out[f"pass_rate/{domain}"] = _mean([float(r.passed) for r in items])
        criteria = sorted({name for r in items for name in r.breakdown})
        for criterion in criteria:
            scores = [r.breakdown[criterion] for r in items if criterion in r.breakdown]
            out[f"reward/{domain}/{criterion}/mean"] = _mean(scores)
            out[f"reward/{domain}/{criterion}/std"] = _std(scores)
    flat = [max(v) - min(v) <= 0.0 for v in groups.values()]
    out["frac_reward_zero_std"] = _mean([float(f) for f in flat]) if flat else float("nan")
    out["perf/num_tokens"] = float(sum(r.response_length + r.prompt_length for r in records))
    return out


def eval_metrics(records: Iterable[SampleRecord]) -> dict[str, float]:
    records = list(records)
    rewards = [r.reward for r in records]
    out = {
        "eval/reward/mean": _mean(rewards),
        "eval/reward/sem": _sem(rewards),
        "eval/pass_rate": _mean([float(r.passed) for r in records]),
        "eval/num_tasks": float(len(records)),
    }
    by_domain: dict[str, list[SampleRecord]] = defaultdict(list)
    for record in records:
        by_domain[record.domain].append(record)
    for domain, items in sorted(by_domain.items()):
        out[f"eval/reward/{domain}/mean"] = _mean([r.reward for r in items])
        out[f"eval/pass_rate/{domain}"] = _mean([float(r.passed) for r in items])
    return out


@dataclass
class CollapseDetector:
    """Tells when a run's policy has collapsed: it stopped exploring while still wrong.

    GRPO-family estimators learn only from groups whose rewards differ. A policy that puts all
    its mass on one answer per prompt (entropy near zero) gives groups of equal rewards, hence
    no gradient, and it stays where it is for good even though most answers are wrong: what
    ``actor/entropy`` falling to a small share of its first value, ``frac_reward_zero_std``
    near 1 and ``pass_rate`` well short of solved look like together, for ``patience`` steps in
    a row. A run that solved its tasks also has flat groups and low entropy, which is why the
    pass rate is part of the test.

    The same dead end is reached the other way: a policy that spread out until its answers broke
    (every group's reward 0, entropy many times its first value). An entropy bonus feeding
    itself did that to parity on the recipe-7 demo base (entropy 0.13 -> 6 nats, held-out 0.00:
    bench/README.md, "Learning"). The payload's ``cause`` says which: ``entropy_fell`` or
    ``entropy_rose``.

    ``observe`` returns ``("run.collapsed", payload)`` on the step the run enters collapse,
    ``("run.collapse_recovered", payload)`` when it leaves, and ``None`` otherwise.
    """

    entropy_share: float = 0.1
    entropy_growth: float = 3.0
    flat_fraction: float = 0.9
    pass_rate_below: float = 0.9
    patience: int = 3
    initial_entropy: float | None = None
    streak: int = 0
    collapsed: bool = False

    def observe(self, step: int, metrics: dict[str, float]) -> tuple[str, dict[str, Any]] | None:
        entropy = metrics.get("actor/entropy")
        flat = metrics.get("frac_reward_zero_std")
        pass_rate = metrics.get("pass_rate")
        if entropy is None or flat is None or pass_rate is None or math.isnan(entropy):
            return None
        if self.initial_entropy is None:
            self.initial_entropy = entropy
        fell = entropy <= self.entropy_share * self.initial_entropy
        rose = entropy >= self.entropy_growth * self.initial_entropy
        looks_collapsed = (
            (fell or rose) and flat >= self.flat_fraction and pass_rate < self.pass_rate_below
        )
        self.streak = self.streak + 1 if looks_collapsed else 0
        payload = {
            "step": step,
            "entropy": entropy,
            "initial_entropy": self.initial_entropy,
            "frac_reward_zero_std": flat,
            "pass_rate": pass_rate,
            "reward_mean": metrics.get("reward/mean"),
            "steps": self.streak,
            "cause": "entropy_fell" if fell else "entropy_rose" if rose else None,
        }
        if not self.collapsed and self.streak >= self.patience:
            self.collapsed = True
            return "run.collapsed", payload
        if self.collapsed and not looks_collapsed:
            self.collapsed = False
            return "run.collapse_recovered", payload
        return None
