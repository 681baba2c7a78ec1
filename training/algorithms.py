"""RL post-training algorithms as pure torch functions on padded ``[batch, tokens]`` tensors.

Everything here works on the *response* part of a batch: tensors are ``[batch, tokens]``,
right-padded, with a ``response_mask`` (1 for a response token that takes part in the loss, 0
for padding). Nothing here knows about models, engines or DeepSpeed, so the loop, a notebook or
a test can call it directly. Definitions follow the ones users know from verl's ``core_algos``,
OpenRLHF and TRL; where those tools differ, the docstring says which one is followed and why.

Advantage estimators (``compute_advantages(name, ...)``, registry ``ADVANTAGE_ESTIMATORS``):

- ``grpo``: per-group ``(r - mean) / (std + eps)`` (unbiased std, like verl and TRL);
  ``norm_by_std=False`` drops the division (Dr.GRPO).
- ``dr_grpo``: ``grpo`` with ``norm_by_std=False`` whatever the argument says.
- ``dapo``: the ``grpo`` advantage; DAPO's other parts are the clip-higher policy loss
  (``clip_high > clip_low``), token-mean aggregation and ``filter_zero_variance_groups``.
- ``rloo``: leave-one-out baseline, ``r_i - mean_{j != i} r_j``.
- ``reinforce_plus_plus``: discounted token-level returns, whitened over the whole batch.
- ``reinforce_plus_plus_baseline``: ``r - group mean``, then whitened over the whole batch.
- ``gae``: generalised advantage estimation with a value head (PPO), whitened.

A group is the set of samples drawn for one prompt (``group_index``: one hashable id per row).
A group of one sample has no baseline to compare with: as in verl, its mean is taken as 0 and
its std as 1, so it keeps its raw reward (plain REINFORCE for that row).

Rewards may be given per sequence (``[batch]``, an outcome reward: it is placed on the last
response token) or per token (``[batch, tokens]``, e.g. after ``apply_kl_in_reward``).

Losses: ``policy_loss`` (PPO clip with separate ``clip_low``/``clip_high``, optional dual
clip), ``value_loss`` (clipped), ``kl_estimate`` (k1/k2/k3/abs), ``entropy_from_logits`` and
``token_logprobs_from_logits`` (chunked so the ``[tokens, vocab]`` softmax never exists whole),
``aggregate_loss`` (``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
``seq-mean-token-sum-norm``), and ``actor_loss`` which puts policy loss, KL-in-loss and the
entropy bonus together the way the loop uses them.

Micro-batches: every aggregation accepts the *global* token and sequence counts of the
mini-batch (``global_tokens``, ``global_sequences``). With them, the loss returned for a
micro-batch is that micro-batch's share of the mini-batch loss, so summing the shares over the
micro-batches of a token-budget split gives exactly the loss of the whole mini-batch (long and
short sequences are weighted as if they had been in one batch). Without them, the counts of
the tensor passed in are used. Loss-valued metrics (``actor/pg_loss``, ``actor/kl_loss``,
``actor/entropy``, ``critic/vf_loss``) are then shares as well and sum over micro-batches;
fraction metrics (``actor/pg_clipfrac`` ...) stay per-micro-batch means (weight them by tokens).

Metric names follow verl (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
``actor/ppo_kl``, ``actor/kl_loss``, ``actor/kl``, ``actor/entropy``, ``critic/vf_loss``,
``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/advantages/mean`` ...). Metric values
are Python floats, detached from the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch
from torch.utils.checkpoint import checkpoint

from training.algorithm_config import (
    ADVANTAGE_ESTIMATOR_NAMES,
    ALGORITHM_PRESETS,
    KL_ALIASES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    AlgorithmConfig,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHM_PRESETS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "AlgorithmConfig",
    "actor_loss",
    "advantage_metrics",
    "aggregate_loss",
    "apply_kl_in_reward",
    "compute_advantages",
    "entropy_from_logits",
    "filter_zero_variance_groups",
    "group_ids",
    "kl_estimate",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "register_advantage_estimator",
    "token_logprobs_from_logits",
    "token_level_rewards",
    "value_loss",
    "zero_variance_group_fraction",
]

GroupIndex = Sequence[Hashable] | torch.Tensor


# --------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set; 0 (not NaN) where nothing is set."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance over the masked entries (0 when fewer than two are set)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_mean(values, mask)
    squared = ((values - mean) ** 2 * mask).sum()
    if count < 2:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    return squared / (count - 1)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the masked entries.

    Masked-out entries come back as 0 so padding never carries an advantage.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _check_mask(response_mask: torch.Tensor) -> None:
    if response_mask.dim() != 2:
        raise ValueError(
            f"response_mask must be [batch, tokens], got shape {tuple(response_mask.shape)}"
        )


def group_ids(group_index: GroupIndex, batch_size: int) -> torch.Tensor:
    """Turns any sequence of hashable group ids into dense int64 ids ``0..n_groups-1``."""
    if isinstance(group_index, torch.Tensor):
        raw: list[Hashable] = group_index.reshape(-1).tolist()
    else:
        raw = list(group_index)
    if len(raw) != batch_size:
        raise ValueError(f"group_index has {len(raw)} entries but the batch has {batch_size} rows")
    dense: dict[Hashable, int] = {}
    return torch.tensor([dense.setdefault(g, len(dense)) for g in raw], dtype=torch.long)


def token_level_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Returns ``[batch, tokens]`` rewards: a ``[batch]`` outcome reward goes on the last
    response token of its row (rows with an empty response get nothing); a ``[batch, tokens]``
    tensor is returned masked."""
    _check_mask(response_mask)
    mask = response_mask.to(torch.float32)
    if rewards.dim() == 2:
        if rewards.shape != response_mask.shape:
            raise ValueError(
                f"token-level rewards have shape {tuple(rewards.shape)}, "
                f"response_mask has {tuple(response_mask.shape)}"
            )
        return rewards.to(torch.float32) * mask
    if rewards.dim() != 1 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be [batch] or [batch, tokens]; got {tuple(rewards.shape)} for a "
            f"response_mask of {tuple(response_mask.shape)}"
        )
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)
    # Index of the last set mask entry; -1 for an empty response.
    last = torch.where(response_mask.bool(), positions, -1).max(dim=1).values
    has_tokens = last >= 0
    rows = torch.nonzero(has_tokens).squeeze(-1)
    out[rows, last[rows]] = rewards.to(torch.float32)[rows]
    return out


def _sequence_scores(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """One scalar per row: the outcome reward, or the sum of the token-level rewards."""
    if rewards.dim() == 1:
        if rewards.shape[0] != response_mask.shape[0]:
            raise ValueError(
                f"rewards has {rewards.shape[0]} rows, response_mask {response_mask.shape[0]}"
            )
        return rewards.to(torch.float32)
    return token_level_rewards(rewards, response_mask).sum(dim=-1)


def _group_stats(
    scores: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std and group size (float)."""
    ids = ids.to(scores.device)
    n_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    size = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, ids, torch.ones_like(scores)
    )
    total = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, ids, scores
    )
    mean = total / size
    squared = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, ids, (scores - mean[ids]) ** 2
    )
    std = torch.sqrt(squared / (size - 1).clamp(min=1.0))
    return mean[ids], std[ids], size[ids]


# --------------------------------------------------------------------------------------------
# Advantage estimators
# --------------------------------------------------------------------------------------------


class AdvantageEstimator(Protocol):
    def __call__(
        self,
        *,
        rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_index: GroupIndex | None,
        values: torch.Tensor | None,
        gamma: float,
        lam: float,
        norm_by_std: bool,
        epsilon: float,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(
    name: str,
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Registers an estimator under ``name`` (the name a run spec uses)."""

    def decorate(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        ADVANTAGE_ESTIMATOR_NAMES.add(name)
        return fn

    return decorate


def compute_advantages(
    estimator: str,
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Computes ``(advantages, returns)``, both ``[batch, tokens]`` and zero on padding.

    ``rewards``: ``[batch]`` outcome rewards or ``[batch, tokens]`` token-level rewards.
    ``group_index``: one id per row (needed by grpo, dr_grpo, dapo, rloo,
    reinforce_plus_plus_baseline). ``values``: ``[batch, tokens]`` value-head outputs aligned
    with the response tokens (needed by gae). For the group estimators ``returns`` equals
    ``advantages`` (as in verl); for gae and reinforce_plus_plus it is the discounted return.
    The result carries no gradient.
    """
    try:
        fn = ADVANTAGE_ESTIMATORS[estimator]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {known}") from None
    _check_mask(response_mask)
    with torch.no_grad():
        advantages, returns = fn(
            rewards=rewards.detach(),
            response_mask=response_mask,
            group_index=group_index,
            values=None if values is None else values.detach(),
            gamma=gamma,
            lam=lam,
            norm_by_std=norm_by_std,
            epsilon=epsilon,
        )
    return advantages, returns


def _require_groups(name: str, group_index: GroupIndex | None, batch_size: int) -> torch.Tensor:
    if group_index is None:
        raise ValueError(f"advantage estimator {name!r} needs group_index (one id per row)")
    return group_ids(group_index, batch_size)


def _per_token(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)


def _grpo(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    norm_by_std: bool,
    epsilon: float,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _sequence_scores(rewards, response_mask)
    ids = _require_groups(name, group_index, scores.shape[0])
    mean, std, size = _group_stats(scores, ids)
    single = size < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = scores - mean
    per_row = centred / (std + epsilon) if norm_by_std else centred
    advantages = _per_token(per_row, response_mask)
    return advantages, advantages


@register_advantage_estimator("grpo")
def _grpo_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _grpo(
        rewards=rewards,
        response_mask=response_mask,
        group_index=group_index,
        norm_by_std=norm_by_std,
        epsilon=epsilon,
        name="grpo",
    )


@register_advantage_estimator("dr_grpo")
def _dr_grpo_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Dr.GRPO: the std division biases towards too-easy and too-hard prompts; drop it.
    return _grpo(
        rewards=rewards,
        response_mask=response_mask,
        group_index=group_index,
        norm_by_std=False,
        epsilon=epsilon,
        name="dr_grpo",
    )


@register_advantage_estimator("dapo")
def _dapo_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _grpo(
        rewards=rewards,
        response_mask=response_mask,
        group_index=group_index,
        norm_by_std=norm_by_std,
        epsilon=epsilon,
        name="dapo",
    )


@register_advantage_estimator("rloo")
def _rloo_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _sequence_scores(rewards, response_mask)
    ids = _require_groups("rloo", group_index, scores.shape[0])
    mean, _, size = _group_stats(scores, ids)
    # r_i - mean of the others == n/(n-1) * (r_i - group mean); a lone sample keeps its reward.
    leave_one_out = (scores - mean) * size / (size - 1).clamp(min=1.0)
    per_row = torch.where(size < 2, scores, leave_one_out)
    advantages = _per_token(per_row, response_mask)
    return advantages, advantages


def _discounted_returns(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    running = running.to(token_rewards.device)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running * mask[:, t]
        # Padding inside a row must not carry a return across it.
        running = running * mask[:, t]
    return returns


@register_advantage_estimator("reinforce_plus_plus")
def _reinforce_pp_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    token_rewards = token_level_rewards(rewards, response_mask)
    returns = _discounted_returns(token_rewards, response_mask, gamma)
    advantages = masked_whiten(returns, response_mask)
    return advantages, returns


@register_advantage_estimator("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _sequence_scores(rewards, response_mask)
    ids = _require_groups("reinforce_plus_plus_baseline", group_index, scores.shape[0])
    mean, _, size = _group_stats(scores, ids)
    centred = scores - torch.where(size < 2, torch.zeros_like(mean), mean)
    advantages = masked_whiten(_per_token(centred, response_mask), response_mask)
    return advantages, advantages


@register_advantage_estimator("gae")
def _gae_estimator(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex | None,
    values: torch.Tensor | None,
    gamma: float,
    lam: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values from a value head")
    if values.shape != response_mask.shape:
        raise ValueError(
            f"values have shape {tuple(values.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    token_rewards = token_level_rewards(rewards, response_mask)
    mask = response_mask.to(torch.float32)
    values = values.to(torch.float32) * mask
    batch, length = mask.shape
    next_value = torch.zeros(batch, device=mask.device)
    last_gae = torch.zeros(batch, device=mask.device)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(length)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # On padding keep the carried values, so a gap inside a row is skipped over.
        next_value = mask[:, t] * values[:, t] + (1 - mask[:, t]) * next_value
        last_gae = mask[:, t] * gae + (1 - mask[:, t]) * last_gae
        advantages[:, t] = gae * mask[:, t]
    returns = (advantages + values) * mask
    return masked_whiten(advantages, response_mask), returns


def advantage_metrics(
    advantages: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """``critic/advantages/{mean,max,min}`` and ``critic/returns/{mean,max,min}`` as in verl."""
    metrics: dict[str, float] = {}
    valid = response_mask.bool()
    for name, tensor in (("advantages", advantages), ("returns", returns)):
        picked = tensor.detach()[valid]
        if picked.numel() == 0:
            metrics.update({f"critic/{name}/{s}": 0.0 for s in ("mean", "max", "min")})
            continue
        metrics[f"critic/{name}/mean"] = float(picked.mean())
        metrics[f"critic/{name}/max"] = float(picked.max())
        metrics[f"critic/{name}/min"] = float(picked.min())
    return metrics


# --------------------------------------------------------------------------------------------
# DAPO dynamic filtering
# --------------------------------------------------------------------------------------------


def filter_zero_variance_groups(
    rewards: torch.Tensor,
    group_index: GroupIndex,
    *,
    response_mask: torch.Tensor | None = None,
    tolerance: float = 0.0,
) -> torch.Tensor:
    """Boolean ``[batch]`` mask of the rows to keep: rows of groups whose rewards differ.

    A group whose samples all got the same reward gives every sample a zero group advantage,
    so it only dilutes the batch (DAPO's dynamic sampling drops it). Groups of one sample are
    dropped too: they have no variance to learn from. Keeping the batch full after dropping is
    the loop's job (draw more prompts, as DAPO does). ``tolerance`` treats a spread up to that
    value as equal (for rewards with float noise).
    """
    scores = rewards if rewards.dim() == 1 else None
    if scores is None:
        if response_mask is None:
            raise ValueError("token-level rewards need response_mask to be summed per row")
        scores = _sequence_scores(rewards, response_mask)
    scores = scores.detach().to(torch.float32)
    ids = group_ids(group_index, scores.shape[0]).to(scores.device)
    n_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    high = torch.full((n_groups,), -torch.inf, device=scores.device).scatter_reduce(
        0, ids, scores, reduce="amax"
    )
    low = torch.full((n_groups,), torch.inf, device=scores.device).scatter_reduce(
        0, ids, scores, reduce="amin"
    )
    varied = (high - low) > tolerance
    return varied[ids]


def zero_variance_group_fraction(rewards: torch.Tensor, group_index: GroupIndex) -> float:
    """Fraction of groups (not rows) whose rewards are all equal: TRL's
    ``frac_reward_zero_std``. Groups of one sample count as zero-variance."""
    ids = group_ids(group_index, rewards.shape[0])
    if ids.numel() == 0:
        return 0.0
    keep = filter_zero_variance_groups(rewards, ids)
    n_groups = int(ids.max().item()) + 1
    varied_groups = torch.unique(ids[keep.cpu()]).numel()
    return (n_groups - varied_groups) / n_groups


# --------------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------------


def aggregate_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: float | None = None,
    global_sequences: float | None = None,
    constant_normalizer: float | None = None,
    sequence_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduces a ``[batch, tokens]`` loss to a scalar.

    - ``token-mean``: sum over all response tokens / number of tokens (DAPO, verl's default):
      every token weighs the same, so long answers are not under-weighted.
    - ``seq-mean-token-sum``: each sequence's token sum, averaged over sequences.
    - ``seq-mean-token-mean``: each sequence's token mean, averaged over sequences (the
      original GRPO): every sequence weighs the same whatever its length.
    - ``seq-mean-token-sum-norm``: Dr.GRPO's constant normaliser: sum over all tokens /
      (number of sequences x ``constant_normalizer``), like TRL's ``dr_grpo`` loss. Set the
      constant to the generation budget (``max_new_tokens``) so it never changes between
      steps (``RunSpec.algorithm_config`` does); it defaults to this tensor's padded width,
      and the trainer passes the mini-batch's longest response rather than a micro-batch's.
      (verl divides by the width only, without the sequence count: a scale factor, the
      gradient direction is the same.)

    Sequences with an empty response are not counted. ``global_tokens`` /
    ``global_sequences`` replace this tensor's counts with the mini-batch's (see the module
    docstring on micro-batches); with no tokens at all the loss is 0, never NaN.
    ``sequence_tokens`` (``[batch]``) replaces each row's own token count as the divisor of
    ``seq-mean-token-mean``: a row that is one turn of a multi-turn episode is averaged over
    the whole episode's tokens, so the episode, not each turn, weighs one sequence.
    """
    _check_mask(response_mask)
    if loss_mat.shape != response_mask.shape:
        raise ValueError(
            f"loss has shape {tuple(loss_mat.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(loss_mat.dtype)
    token_sums = (loss_mat * mask).sum(dim=-1)
    token_counts = mask.sum(dim=-1)
    sequences = (
        float(global_sequences)
        if global_sequences is not None
        else float((token_counts > 0).sum().item())
    )
    sequences = max(sequences, 1.0)
    if mode == "token-mean":
        tokens = float(global_tokens) if global_tokens is not None else float(mask.sum().item())
        return token_sums.sum() / max(tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return token_sums.sum() / sequences
    if mode == "seq-mean-token-mean":
        lengths = token_counts if sequence_tokens is None else sequence_tokens.to(token_sums)
        per_sequence = token_sums / lengths.clamp(min=1.0)
        return per_sequence.sum() / sequences
    if mode == "seq-mean-token-sum-norm":
        constant = (
            float(constant_normalizer)
            if constant_normalizer is not None
            else float(response_mask.shape[-1])
        )
        if constant <= 0:
            raise ValueError(f"constant_normalizer must be positive, got {constant}")
        return token_sums.sum() / (sequences * constant)
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(LOSS_AGGREGATIONS)}")


# --------------------------------------------------------------------------------------------
# KL to the reference policy
# --------------------------------------------------------------------------------------------


def kl_estimate(kind: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy.

    With ``log_ratio = logprobs - ref_logprobs``:
    ``k1`` = ``log_ratio`` (unbiased, high variance, can be negative), ``abs`` = ``|log_ratio|``,
    ``k2`` = ``0.5 * log_ratio**2`` (low variance, biased), ``k3`` =
    ``exp(-log_ratio) - 1 + log_ratio`` (unbiased, always >= 0, clamped to [-10, 10] like
    verl's ``low_var_kl``). Aliases: ``kl``, ``mse``, ``low_var_kl``. Gradients flow through
    ``logprobs`` (the reference is treated as fixed).
    """
    kind = KL_ALIASES.get(kind, kind)
    log_ratio = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        # Clamp before exp: a token the reference finds vastly less likely must not overflow.
        neg = (-log_ratio).clamp(min=-20.0, max=20.0)
        return (torch.exp(neg) - 1.0 - neg).clamp(min=-10.0, max=10.0)
    known = ", ".join(KL_ESTIMATORS + tuple(KL_ALIASES))
    raise ValueError(f"unknown KL estimator {kind!r}; known: {known}")


def apply_kl_in_reward(
    rewards: torch.Tensor,
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Folds a KL penalty into token-level rewards: ``r_t - coef * kl_t`` (PPO/RLHF style).

    ``rewards`` may be ``[batch]`` (placed on the last token) or ``[batch, tokens]``;
    ``logprobs`` are the rollout policy's. Returns the new ``[batch, tokens]`` rewards and
    ``actor/reward_kl_penalty`` (mean per-token KL) and ``actor/reward_kl_penalty_coeff``.
    Use the token-aware estimators (gae, reinforce_plus_plus) with these rewards: the group
    estimators only see each row's sum.
    """
    token_rewards = token_level_rewards(rewards, response_mask)
    with torch.no_grad():
        kl = kl_estimate(kind, logprobs.detach(), ref_logprobs) * response_mask.to(torch.float32)
    penalised = token_rewards - coef * kl
    metrics = {
        "actor/reward_kl_penalty": float(masked_mean(kl, response_mask)),
        "actor/reward_kl_penalty_coeff": float(coef),
    }
    return penalised, metrics


# --------------------------------------------------------------------------------------------
# Log-probabilities and entropy from logits, chunked
# --------------------------------------------------------------------------------------------


def _entropy_chunk(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return log_z - (probs * logits).sum(dim=-1)


def _logprob_chunk(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _chunked(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    extra: torch.Tensor | None,
    chunk_tokens: int,
) -> torch.Tensor:
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    lead_shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_extra = None if extra is None else extra.reshape(-1)
    # With gradients, each chunk is recomputed in backward instead of keeping its
    # [chunk, vocab] float32 softmax alive: peak memory stays one chunk, not the whole batch.
    use_checkpoint = torch.is_grad_enabled() and flat.requires_grad
    pieces = []
    for start in range(0, flat.shape[0], chunk_tokens):
        args: tuple[torch.Tensor, ...] = (flat[start : start + chunk_tokens],)
        if flat_extra is not None:
            args = (*args, flat_extra[start : start + chunk_tokens])
        if use_checkpoint:
            pieces.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            pieces.append(fn(*args))
    if not pieces:
        return torch.zeros(lead_shape, dtype=torch.float32, device=logits.device)
    return torch.cat(pieces).reshape(lead_shape)


def entropy_from_logits(logits: torch.Tensor, *, chunk_tokens: int = 1024) -> torch.Tensor:
    """Per-position entropy ``[...]`` of the softmax over the last dim of ``logits [..., vocab]``.

    Computed in float32, ``chunk_tokens`` positions at a time (checkpointed under autograd),
    so a large vocabulary times a long batch never materialises a full-size float32 softmax.
    """
    return _chunked(_entropy_chunk, logits, None, chunk_tokens)


def token_logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, *, chunk_tokens: int = 1024
) -> torch.Tensor:
    """``log softmax(logits)[label]`` per position, in float32, chunked like
    ``entropy_from_logits``. ``logits [..., vocab]`` and ``labels [...]`` must already be aligned
    (logits at position i scored against the token at i + 1)."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)}, logits {tuple(logits.shape)} "
            "(expected labels == logits.shape[:-1])"
        )
    return _chunked(_logprob_chunk, logits, labels.long(), chunk_tokens)


# --------------------------------------------------------------------------------------------
# Policy and value losses
# --------------------------------------------------------------------------------------------


def policy_loss(
    loss_type: str = "ppo",
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    global_tokens: float | None = None,
    global_sequences: float | None = None,
    constant_normalizer: float | None = None,
    sequence_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss and its metrics.

    ``ppo``: per token ``max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``
    with ``ratio = exp(logprobs - old_logprobs)``. ``clip_high > clip_low`` is DAPO's
    clip-higher (e.g. 0.2 / 0.28). ``dual_clip = c > 1`` additionally caps the loss of
    negative-advantage tokens at ``-A * c`` (Dual-clip PPO; verl uses c = 3).
    ``vanilla_pg``: ``-A * logprobs`` (REINFORCE, no ratio; for strictly on-policy use).

    Metrics: ``actor/pg_loss``, ``actor/pg_clipfrac`` (tokens where the clipped branch is
    taken), ``actor/pg_clipfrac_lower`` (tokens capped by the dual clip), ``actor/ppo_kl``
    (mean ``old_logprobs - logprobs``, how far this update has moved from the rollout policy).
    """
    _check_mask(response_mask)
    for name, tensor in (("logprobs", logprobs), ("old_logprobs", old_logprobs)):
        if tensor.shape != response_mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, "
                f"response_mask {tuple(response_mask.shape)}"
            )
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low} clip_high={clip_high}")
    if clip_low >= 1:
        raise ValueError(f"clip_low must be < 1 (ratio floor 1 - clip_low), got {clip_low}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    advantages = advantages.detach()
    log_ratio = logprobs - old_logprobs.detach()
    # A log-ratio beyond +-20 only means numerical trouble; clamping keeps exp finite.
    log_ratio = log_ratio.clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    mask = response_mask.bool()

    if loss_type == "vanilla_pg":
        losses = -advantages * logprobs
        clipped = torch.zeros_like(mask)
        dual_clipped = torch.zeros_like(mask)
    elif loss_type == "ppo":
        unclipped = -advantages * ratio
        clipped_losses = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        losses = torch.maximum(unclipped, clipped_losses)
        clipped = clipped_losses > unclipped
        dual_clipped = torch.zeros_like(mask)
        if dual_clip is not None:
            cap = -advantages * dual_clip
            negative = advantages < 0
            dual_clipped = negative & (losses > cap)
            losses = torch.where(negative, torch.minimum(losses, cap), losses)
    else:
        raise ValueError(f"unknown policy loss {loss_type!r}; known: {', '.join(POLICY_LOSSES)}")

    loss = aggregate_loss(
        losses,
        response_mask,
        aggregation,
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        constant_normalizer=constant_normalizer,
        sequence_tokens=sequence_tokens,
    )
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": float(loss.detach()),
            "actor/pg_clipfrac": float(masked_mean(clipped.float(), mask)),
            "actor/pg_clipfrac_lower": float(masked_mean(dual_clipped.float(), mask)),
            "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
        }
    return loss, metrics


def value_loss(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None = 0.2,
    aggregation: str = "token-mean",
    global_tokens: float | None = None,
    global_sequences: float | None = None,
    constant_normalizer: float | None = None,
    sequence_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO): ``0.5 * max((v - R)^2, (clip(v, v_old +- eps) - R)^2)``.

    ``clip_range=None`` gives the plain ``0.5 * (v - R)^2``. Metrics: ``critic/vf_loss``,
    ``critic/vf_clipfrac`` (tokens where the clipped branch is larger), ``critic/vpred_mean``.
    """
    _check_mask(response_mask)
    returns = returns.detach()
    unclipped = (values - returns).square()
    if clip_range is None:
        losses = 0.5 * unclipped
        clipped = torch.zeros_like(response_mask, dtype=torch.bool)
    else:
        if clip_range < 0:
            raise ValueError(f"clip_range must be >= 0, got {clip_range}")
        old = old_values.detach()
        v_clipped = old + (values - old).clamp(-clip_range, clip_range)
        clipped_sq = (v_clipped - returns).square()
        losses = 0.5 * torch.maximum(unclipped, clipped_sq)
        clipped = clipped_sq > unclipped
    loss = aggregate_loss(
        losses,
        response_mask,
        aggregation,
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        constant_normalizer=constant_normalizer,
        sequence_tokens=sequence_tokens,
    )
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": float(loss.detach()),
            "critic/vf_clipfrac": float(masked_mean(clipped.float(), response_mask)),
            "critic/vpred_mean": float(masked_mean(values.detach(), response_mask)),
        }
    return loss, metrics


# --------------------------------------------------------------------------------------------
# The combined actor loss (the config itself: training.algorithm_config)
# --------------------------------------------------------------------------------------------


def actor_loss(
    config: AlgorithmConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl_coef: float | None = None,
    global_tokens: float | None = None,
    global_sequences: float | None = None,
    sequence_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss + ``kl_coef * KL`` (when KL is in the loss) - ``entropy_coef * entropy``.

    ``kl_coef`` overrides the config's (the live override from ``Control``). ``entropy`` is the
    per-token entropy of the current policy (``entropy_from_logits``); it is always reported as
    ``actor/entropy`` (its token mean) when given, and enters the loss (aggregated like the
    policy loss) only if ``entropy_coef > 0``. KL metrics:
    ``actor/kl_loss`` (the aggregated estimate) and ``actor/kl`` (mean per-token k1, the
    plain log-ratio to the reference).
    """
    agg: dict[str, Any] = {
        "global_tokens": global_tokens,
        "global_sequences": global_sequences,
        "constant_normalizer": config.constant_normalizer,
        "sequence_tokens": sequence_tokens,
    }
    loss, metrics = policy_loss(
        config.policy_loss,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=config.dual_clip,
        aggregation=config.loss_aggregation,
        **agg,
    )
    coef = config.kl_coef if kl_coef is None else kl_coef
    if coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {coef}")
    if ref_logprobs is not None:
        kl_tokens = kl_estimate(config.kl_estimator, logprobs, ref_logprobs)
        kl_term = aggregate_loss(kl_tokens, response_mask, config.loss_aggregation, **agg)
        metrics["actor/kl_loss"] = float(kl_term.detach())
        metrics["actor/kl"] = float(masked_mean((logprobs - ref_logprobs).detach(), response_mask))
        metrics["actor/kl_coef"] = float(coef)
        if not config.kl_in_reward and coef > 0:
            loss = loss + coef * kl_term
    elif coef > 0 and not config.kl_in_reward:
        raise ValueError("KL in the loss needs ref_logprobs (kl_coef > 0, kl_in_reward false)")
    if entropy is not None:
        entropy_term = aggregate_loss(entropy, response_mask, config.loss_aggregation, **agg)
        # Reported per token whatever the loss aggregation: under the sum-based modes the
        # aggregated term is a sum over tokens (or a sum over a constant), not an entropy.
        metrics["actor/entropy"] = float(
            aggregate_loss(
                entropy.detach(), response_mask, "token-mean", global_tokens=global_tokens
            )
        )
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * entropy_term
    elif config.entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    return loss, metrics
