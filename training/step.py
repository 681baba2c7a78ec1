"""One training step's stages, and the named values that pass between them.

``_Run.train_step`` (`training.loop`) is this sequence; each stage takes the previous ones'
outputs by name::

    rollout     _Run.rollout_and_score   → Rollouts    prompts drawn, sampled, rewarded
                                                       (tools and reward inside; DAPO's
                                                       dynamic sampling repeats it)
    recompute   _Run.recompute           → Recomputed  forward-only passes: reference and
                                                       old log-probs, value estimates
    advantages  compute_step_advantages  → Advantages  KL in the reward, the estimator,
                                                       zero-variance groups
    rows        build_update_batch       → UpdateBatch one trainer row per assistant turn
    update      _Run.update              → UpdateResult epochs x mini-batches of
                                                       `Trainer.train_step`
    sync        _Run.sync_weights                      the new policy into the rollout engine
    record      _Run.record_step         → metrics     metrics, trajectories, timeline, events

The stages here are pure (tensors and samples in, named values out): they are what the
algorithms decide, apart from the engines, the trainer and the sink that `_Run` owns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from training.algorithm_config import AlgorithmConfig
from training.batching import TrainRow

__all__ = [
    "GROUP_RELATIVE",
    "Advantages",
    "Recomputed",
    "Rollouts",
    "Sample",
    "UpdateBatch",
    "UpdateResult",
    "build_update_batch",
    "compute_step_advantages",
    "per_sample_tokens",
]

# Estimators whose advantage is relative to the prompt's group: zero for a group with no spread.
GROUP_RELATIVE = frozenset({"grpo", "dr_grpo", "dapo", "rloo"})


@dataclass
class Sample:
    """One sample of this step on this rank, through rollout and reward."""

    domain: str
    group: int  # global prompt index of this step
    task: dict[str, Any]
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    policy_version: int
    messages: list[dict[str, Any]] | None = None
    turns: list[tuple[list[int], list[int], list[float]]] | None = None  # multi-turn episodes
    observations: list[dict[str, Any]] = field(default_factory=list)
    sandbox_image: str | None = None
    reward: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    # Why the step did not train on it (`training.trajectory.DISCARD_REASONS`); None if it did.
    discarded: str | None = None

    def pieces(self) -> list[tuple[list[int], list[int], list[float]]]:
        """``(context, response, rollout log-probs)`` of each assistant turn (one piece for a
        single-turn sample); the responses joined are ``response_ids``."""
        return self.turns or [(self.prompt_ids, self.response_ids, self.logprobs)]


@dataclass
class Rollouts:
    """The rollout stage's output: every sample generated this step on this rank (metrics and
    trajectories see them all), the ones to train on (dynamic sampling keeps only groups whose
    rewards differ), the prompts drawn, and the stage's timings."""

    samples: list[Sample]
    trained: list[Sample]
    drawn: list[tuple[str, dict[str, Any]]]
    metrics: dict[str, float]  # batch/generation_rounds, batch/varied_groups (dynamic only)
    rollout_s: float
    tools_s: float
    reward_s: float


@dataclass
class Recomputed:
    """Forward-only passes over the samples to train on, per sample and response token (a
    multi-turn episode's turns joined): ``None`` where the step does not need it."""

    ref_logprobs: list[list[float]] | None  # the reference policy: KL (loss or reward)
    # The policy before the update: the KL in the reward, and the importance ratio's
    # denominator when the batch is used more than once.
    old_logprobs: list[list[float]] | None
    values: list[list[float]] | None  # the value head's estimates (PPO/GAE)


@dataclass
class Advantages:
    """The advantage stage's output, ``[samples, longest response]`` tensors."""

    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor | None  # the critic's estimates the returns were computed from
    response_mask: torch.Tensor
    keep: list[bool]  # the sample trains (DAPO drops groups whose rewards are all equal)
    metrics: dict[str, float]  # reward KL, critic/advantages/mean, batch/kept_fraction


@dataclass
class UpdateBatch:
    """The update's input: the trainer's rows and each row's reference log-probs."""

    rows: list[TrainRow]
    ref_logprobs: list[list[float]] | None


@dataclass
class UpdateResult:
    """Each trainer metric over the step's optimiser steps (epochs x mini-batches)."""

    per_step: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.per_step.setdefault(key, []).append(value)

    @property
    def skipped(self) -> bool:
        """No optimiser step had a row to train on."""
        return all(self.per_step.get("train/skipped", [1.0]))

    def metrics(self) -> dict[str, float]:
        """The step's value of each metric: the mean over optimiser steps, the learning rate
        as it was at the last."""
        return {
            key: values[-1] if key in ("actor/lr",) else float(np.mean(values))
            for key, values in self.per_step.items()
        }


def per_sample_tokens(
    samples: Sequence[Sample], score: Callable[[list[TrainRow]], list[list[float]]]
) -> list[list[float]]:
    """A per-token quantity (reference log-probabilities, value estimates) for each sample's
    response tokens. A multi-turn episode is scored turn by turn, each assistant turn in its own
    context (the conversation so far, tool observations included), and the turns are joined in
    the order of ``response_ids``."""
    rows: list[TrainRow] = []
    spans: list[tuple[int, int]] = []
    for s in samples:
        start = len(rows)
        for prompt_ids, response_ids, _ in s.pieces():
            rows.append(TrainRow(prompt_ids, response_ids, [0.0] * len(response_ids)))
        spans.append((start, len(rows)))
    scored = score(rows)
    return [[x for piece in scored[a:b] for x in piece] for a, b in spans]


def _padded(per_sample: Sequence[Sequence[float]], samples: Sequence[Sample], like: torch.Tensor):
    """Per-sample token lists as a ``[samples, longest]`` tensor shaped ``like`` (zero pad)."""
    out = torch.zeros_like(like)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        out[i, :n] = torch.tensor(per_sample[i][:n])
    return out


def compute_step_advantages(
    samples: Sequence[Sample],
    recomputed: Recomputed,
    algorithm: AlgorithmConfig,
    kl_coef: float,
) -> Advantages:
    """The advantage stage: the KL penalty in the reward (when the algorithm puts it there),
    the estimator's advantages (groups never span ranks), group-relative advantages zeroed for
    groups without spread, and which samples train (DAPO drops zero-variance groups)."""
    from training.algorithms import (
        apply_kl_in_reward,
        compute_advantages,
        filter_zero_variance_groups,
    )

    longest = max((max(len(s.response_ids), 1) for s in samples), default=1)
    mask = torch.zeros((len(samples), longest))
    for i, s in enumerate(samples):
        mask[i, : len(s.response_ids)] = 1.0
    if not samples:
        empty = torch.zeros((0, longest))
        return Advantages(empty, empty, None, mask, [], {})
    rewards: torch.Tensor = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    groups = [s.group for s in samples]
    metrics: dict[str, float] = {}
    ref = recomputed.ref_logprobs
    if algorithm.kl_in_reward and ref is not None and kl_coef > 0:
        # The policy side is recomputed by the trainer, like the reference: the rollout
        # engine's log-probs differ from the trainer's by kernel and precision (bf16 vLLM),
        # and that error would read as KL (verl uses the actor's old_log_prob here too).
        assert recomputed.old_logprobs is not None
        rewards, kl_metrics = apply_kl_in_reward(
            rewards,
            logprobs=_padded(recomputed.old_logprobs, samples, mask),
            ref_logprobs=_padded(ref, samples, mask),
            response_mask=mask,
            coef=kl_coef,
            kind=algorithm.kl_estimator,
        )
        metrics.update(kl_metrics)
    values = None if recomputed.values is None else _padded(recomputed.values, samples, mask)
    advantages, returns = compute_advantages(
        algorithm.advantage_estimator,
        rewards=rewards,
        response_mask=mask,
        values=values,
        group_index=groups,
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        norm_by_std=algorithm.norm_by_std,
        epsilon=algorithm.epsilon,
    )
    if algorithm.advantage_estimator in GROUP_RELATIVE:
        # A group whose rewards are all equal carries no signal; its (r - mean) / (std + eps)
        # is float rounding divided by eps, which Adam would turn into full-size noise steps.
        varied = filter_zero_variance_groups(rewards, groups, response_mask=mask, tolerance=1e-6)
        advantages = advantages * varied.to(advantages.dtype).unsqueeze(-1)
    keep = [True] * len(samples)
    if algorithm.filter_zero_variance_groups:
        keep = filter_zero_variance_groups(rewards, groups, response_mask=mask).tolist()
    metrics["critic/advantages/mean"] = float((advantages * mask).sum() / mask.sum().clamp(min=1))
    metrics["batch/kept_fraction"] = sum(keep) / len(keep)
    return Advantages(advantages, returns, values, mask, keep, metrics)


def build_update_batch(
    samples: Sequence[Sample],
    advantages: Advantages,
    recomputed: Recomputed,
    *,
    reuse: bool,
) -> UpdateBatch:
    """The trainer's rows: one per assistant turn of each kept sample with a response.
    ``reuse``: the batch serves more than one optimiser step, so the rows carry the old
    log-probabilities (a single pass is on-policy: the trainer takes its own, detached)."""
    ref = recomputed.ref_logprobs
    old = recomputed.old_logprobs if reuse else None
    rows: list[TrainRow] = []
    row_ref: list[list[float]] | None = [] if ref is not None else None
    for i, s in enumerate(samples):
        if not advantages.keep[i] or not s.response_ids:
            continue
        # The advantages, PPO's value targets and the per-token scores were computed over the
        # sample's response tokens in order, so a turn takes its slice: the credit of
        # everything after it, and its context holds the conversation so far, observations
        # included.
        pieces = s.pieces()
        turns_with_tokens = sum(1 for _, ids, _ in pieces if ids)
        start = 0
        for prompt_ids, response_ids, rollout_logprobs in pieces:
            end = start + len(response_ids)
            row = TrainRow(
                prompt_ids,
                response_ids,
                advantages.advantages[i, start:end].tolist(),
                rollout_logprobs,
                sequence_tokens=len(s.response_ids),
                sequence_share=1.0 / max(turns_with_tokens, 1),
            )
            if advantages.values is not None:
                row.returns = advantages.returns[i, start:end].tolist()
                row.old_values = advantages.values[i, start:end].tolist()
            if old is not None:
                row.old_logprobs = old[i][start:end]
            if row_ref is not None and ref is not None:
                row_ref.append(ref[i][start:end])
            rows.append(row)
            start = end
    return UpdateBatch(rows, row_ref)
