"""Token-budget micro-batches: within budget, long and short apart, equal counts across ranks."""

from __future__ import annotations

import random

import pytest

from training.batching import (
    TrainRow,
    collate,
    equalize_micro_batch_count,
    padded_tokens,
    plan_micro_batches,
    shard_groups,
)


def test_every_micro_batch_stays_within_the_budget_and_every_row_is_placed_once():
    rng = random.Random(0)
    lengths = [rng.choice([rng.randint(5, 20), rng.randint(200, 400)]) for _ in range(200)]
    groups = plan_micro_batches(lengths, 1024)
    placed = sorted(i for g in groups for i in g)
    assert placed == list(range(len(lengths)))
    for group in groups:
        assert padded_tokens([lengths[i] for i in group]) <= 1024


def test_long_and_short_sequences_do_not_pad_each_other():
    lengths = [400, 10, 12, 390, 11, 9, 380, 10]
    groups = plan_micro_batches(lengths, 1200)
    for group in groups:
        kinds = {lengths[i] > 100 for i in group}
        assert len(kinds) == 1, group
    # the padding waste is far below one batch padded to the longest row
    waste = sum(padded_tokens([lengths[i] for i in g]) for g in groups) - sum(lengths)
    assert waste < padded_tokens(lengths) - sum(lengths)


def test_a_row_longer_than_the_budget_travels_alone():
    groups = plan_micro_batches([5000, 10, 10], 100)
    assert [0] in groups and sorted(i for g in groups for i in g) == [0, 1, 2]


def test_equalizing_splits_the_largest_groups_then_adds_empty_ones():
    assert equalize_micro_batch_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert equalize_micro_batch_count([[0]], 3) == [[0], [], []]
    with pytest.raises(ValueError):
        equalize_micro_batch_count([[0], [1]], 1)


def test_groups_are_sharded_round_robin_and_completely():
    shards = [shard_groups(7, rank, 3) for rank in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(7))
    assert shards[0] == [0, 3, 6]


def test_collate_aligns_response_positions_with_shifted_logits():
    rows = [
        TrainRow(prompt_ids=[1, 2, 3], response_ids=[4, 5], advantages=[0.5, 0.5]),
        TrainRow(prompt_ids=[1], response_ids=[6, 7, 8], advantages=[1.0, 1.0, 1.0]),
    ]
    batch = collate(rows, [0, 1], pad_id=0, device="cpu")
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 7, 8, 0]]
    assert batch.response_positions[0, :2].tolist() == [2, 3]
    assert batch.response_positions[1].tolist() == [0, 1, 2]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    # the token a position scores is the next input token
    for i in range(2):
        for j in range(int(batch.response_mask[i].sum())):
            pos = batch.response_positions[i, j]
            assert batch.input_ids[i, pos + 1] == batch.response_ids[i, j]


def test_an_empty_micro_batch_is_a_masked_dummy():
    batch = collate([], [], pad_id=0, device="cpu")
    assert batch.is_empty and batch.response_tokens == 0
