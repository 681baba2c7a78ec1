"""Per-step metrics, with names users of verl and TRL already read.

From the samples of a step (`SampleRecord`, gathered from every rank):

- ``reward/mean``, ``reward/std``; ``reward/<domain>/mean|std``;
  ``reward/<domain>/<criterion>/mean`` (verl's ``critic/score/mean`` per data source, TRL's
  ``rewards/<func>/mean``); ``critic/score/mean`` is kept as an alias of ``reward/mean``.
- ``pass_rate`` and ``pass_rate/<domain>`` (reward total >= the domain's ``pass_threshold``).
- ``response_length/mean``, ``response_length/clip_ratio`` (stopped by the token limit).
- ``frac_reward_zero_std`` (TRL): the fraction of groups whose rewards were all equal.
- ``mix/<domain>/weight`` and ``mix/<domain>/prompts``: the mix that was actually drawn.

From the trainer: ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/kl``, ``actor/kl_loss``,
``actor/entropy``, ``actor/grad_norm``, ``actor/lr``, ``critic/advantages/mean`` ...
Timing: ``timing_s/{rollout,tools,reward,train,weight_sync,step}``; throughput:
``perf/throughput`` (prompt + response tokens per second of the whole step),
``perf/rollout_tokens_per_s``, ``perf/num_tokens``.
Held-out evaluation: ``eval/reward/mean``, ``eval/reward/sem`` (standard error of that mean),
``eval/reward/<domain>/mean``, ``eval/pass_rate``, ``eval/pass_rate/<domain>``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["MAIN_METRICS", "SampleRecord", "eval_metrics", "sample_metrics"]

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
