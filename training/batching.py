"""Micro-batches formed by a token budget, and the sharding of a step's samples over ranks.

A micro-batch is padded to its longest row, so its cost is ``rows x longest``. Filling
micro-batches in order of decreasing length (first-fit) keeps long sequences together and short
ones together: a 500-token answer never makes forty 20-token answers pad to 500. Every
micro-batch stays within ``token_budget`` padded tokens, except a single row longer than the
budget, which travels alone (it cannot be split without breaking the sequence).

ZeRO-2/3 reduce gradients during each backward pass, so every rank must run the same number of
micro-batches: `equalize_micro_batch_count` splits the largest micro-batches (and, when every
micro-batch is a single row, adds empty ones the trainer runs as zero-loss passes) until a rank
has as many as the busiest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "MicroBatch",
    "TrainRow",
    "collate",
    "equalize_micro_batch_count",
    "padded_tokens",
    "plan_micro_batches",
    "shard_groups",
]


@dataclass
class TrainRow:
    """One sample as the trainer sees it: prompt and response token ids, the response's
    per-token advantages, and the rollout engine's log-probabilities (for reference only:
    the importance ratio uses the trainer's own recomputed ones, like verl)."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantages: list[float]
    rollout_logprobs: list[float] | None = None
    old_logprobs: list[float] | None = None
    returns: list[float] | None = None  # PPO: value targets per response token
    old_values: list[float] | None = None  # PPO: the value head's outputs at rollout time
    # One turn of a multi-turn episode is part of a sequence, not one: the sequence-level loss
    # modes count ``sequence_share`` of a sequence for it (an episode's turns sum to 1) and
    # average its tokens over ``sequence_tokens`` (the episode's response tokens).
    sequence_tokens: int | None = None
    sequence_share: float = 1.0

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class MicroBatch:
    """Padded tensors for one forward/backward pass.

    ``input_ids``/``attention_mask``: ``[rows, longest]`` right-padded. Response-aligned tensors
    are ``[rows, longest_response]``: ``response_positions[i, j]`` is the index into the
    shifted logits (``logits[:, :-1]``) that scores response token ``j`` of row ``i``.
    """

    indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_positions: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    sequence_tokens: torch.Tensor | None = None  # [rows]: each row's sequence length (turns)

    @property
    def is_empty(self) -> bool:
        return not self.indices

    @property
    def response_tokens(self) -> int:
        return int(self.response_mask.sum().item())


def padded_tokens(lengths: Sequence[int]) -> int:
    return max(lengths, default=0) * len(lengths)


def plan_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped so that each group's ``rows x longest <= token_budget``.

    Deterministic: ties in length keep their input order.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        if groups:
            current = groups[-1]
            longest = lengths[current[0]]  # sorted: the first is the longest
            if longest * (len(current) + 1) <= token_budget:
                current.append(index)
                continue
        groups.append([index])
    return groups


def equalize_micro_batch_count(groups: list[list[int]], target: int) -> list[list[int]]:
    """Splits the largest groups (then adds empty ones) until there are ``target`` groups."""
    if len(groups) > target:
        raise ValueError(f"{len(groups)} micro-batches already exceed the target {target}")
    groups = [list(g) for g in groups]
    while len(groups) < target:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]), default=None)
        if largest is None or len(groups[largest]) < 2:
            groups.append([])
            continue
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def shard_groups(num_groups: int, rank: int, world_size: int) -> list[int]:
    """Which prompt groups a rank owns: round-robin, so every rank gets a mix of domains and
    a whole group stays on one rank (group statistics need all of its samples)."""
    return list(range(rank, num_groups, world_size))


def collate(
    rows: Sequence[TrainRow], indices: Sequence[int], pad_id: int, device: torch.device | str
) -> MicroBatch:
    """Right-padded tensors for ``rows[i] for i in indices`` (an empty index list gives a
    one-token dummy batch whose response mask is all zero)."""
    chosen = [rows[i] for i in indices]
    if not chosen:
        dummy = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
        zeros = torch.zeros((1, 1), dtype=torch.float32, device=device)
        return MicroBatch(
            indices=[],
            input_ids=dummy,
            attention_mask=torch.ones_like(dummy),
            response_positions=torch.zeros((1, 1), dtype=torch.long, device=device),
            response_ids=torch.full((1, 1), pad_id, dtype=torch.long, device=device),
            response_mask=zeros.clone(),
            advantages=zeros.clone(),
            old_logprobs=zeros.clone(),
            returns=zeros.clone(),
            old_values=zeros.clone(),
        )
    longest = max(row.length for row in chosen)
    longest_response = max(max(len(row.response_ids), 1) for row in chosen)
    count = len(chosen)
    input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((count, longest), dtype=torch.long)
    positions = torch.zeros((count, longest_response), dtype=torch.long)
    response_ids = torch.full((count, longest_response), pad_id, dtype=torch.long)
    response_mask = torch.zeros((count, longest_response), dtype=torch.float32)
    advantages = torch.zeros((count, longest_response), dtype=torch.float32)
    have_old = all(row.old_logprobs is not None for row in chosen)
    old = torch.zeros((count, longest_response), dtype=torch.float32) if have_old else None
    have_values = all(row.returns is not None and row.old_values is not None for row in chosen)
    returns = torch.zeros((count, longest_response)) if have_values else None
    old_values = torch.zeros((count, longest_response)) if have_values else None
    sequence_tokens = torch.tensor(
        [float(row.sequence_tokens or len(row.response_ids)) for row in chosen]
    )
    for i, row in enumerate(chosen):
        sequence = row.prompt_ids + row.response_ids
        input_ids[i, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[i, : len(sequence)] = 1
        n = len(row.response_ids)
        if n == 0:
            continue
        if len(row.advantages) != n:
            raise ValueError(f"row {indices[i]}: {len(row.advantages)} advantages for {n} tokens")
        start = len(row.prompt_ids) - 1  # logits at position p score token p + 1
        positions[i, :n] = torch.arange(start, start + n)
        response_ids[i, :n] = torch.tensor(row.response_ids, dtype=torch.long)
        response_mask[i, :n] = 1.0
        advantages[i, :n] = torch.tensor(row.advantages, dtype=torch.float32)
        if old is not None and row.old_logprobs is not None:
            old[i, :n] = torch.tensor(row.old_logprobs, dtype=torch.float32)
        if returns is not None and old_values is not None:
            returns[i, :n] = torch.tensor(row.returns, dtype=torch.float32)
            old_values[i, :n] = torch.tensor(row.old_values, dtype=torch.float32)
    return MicroBatch(
        indices=list(indices),
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        response_positions=positions.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
        advantages=advantages.to(device),
        old_logprobs=None if old is None else old.to(device),
        returns=None if returns is None else returns.to(device),
        old_values=None if old_values is None else old_values.to(device),
        sequence_tokens=sequence_tokens.to(device),
    )
