"""A step's stages (`training.step`) on fixed inputs, checked against the formulas they
implement, the named quantities the trainer reduces over ranks, and the metric and timeline
names a step reports (the console reads them; pinned from the loop before it was split into
stages)."""

from __future__ import annotations

import math
import os

import pytest

from tests.training.conftest import tiny_spec
from training.algorithm_config import AlgorithmConfig
from training.batching import TrainRow
from training.control import StaticControl
from training.loop import run
from training.sink import ListSink
from training.spec import RunSpec
from training.step import (
    Recomputed,
    Sample,
    UpdateResult,
    build_update_batch,
    compute_step_advantages,
)
from training.trainer import MetricSums, MiniBatchTotals

NOTHING = Recomputed(ref_logprobs=None, old_logprobs=None, values=None)


def sample(group, reward, response_ids, **fields):
    return Sample(
        domain="d",
        group=group,
        task={"prompt": "p"},
        prompt_ids=[1, 2],
        response_ids=list(response_ids),
        logprobs=[-1.0] * len(response_ids),
        text="",
        finish_reason="stop",
        policy_version=0,
        reward=reward,
        **fields,
    )


def two_groups():
    """Group 0 rewards 1 and 0 (2 and 3 tokens), group 1 flat at 0.5 (1 and 2 tokens)."""
    return [
        sample(0, 1.0, [5, 6]),
        sample(0, 0.0, [5, 6, 7]),
        sample(1, 0.5, [8]),
        sample(1, 0.5, [8, 9]),
    ]


def test_grpo_advantages_are_the_group_normalised_reward_on_every_response_token():
    samples = two_groups()
    result = compute_step_advantages(samples, NOTHING, AlgorithmConfig.preset("grpo"), 0.0)
    # (r - mean) / (unbiased std + eps): group 0 is +-0.5 / (sqrt(0.5) + 1e-6)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert result.advantages.shape == (4, 3)
    assert result.advantages[0].tolist() == pytest.approx([expected, expected, 0.0])
    assert result.advantages[1].tolist() == pytest.approx([-expected] * 3)
    assert result.advantages[2:].abs().sum() == 0  # a flat group carries no signal
    assert result.keep == [True] * 4  # GRPO trains on every group (zero advantage)
    assert result.metrics["batch/kept_fraction"] == 1.0
    # token mean over the 8 response tokens: 2 up, 3 down
    assert result.metrics["critic/advantages/mean"] == pytest.approx(-expected / 8)


def test_dapo_drops_flat_groups_from_the_rows():
    samples = two_groups()
    algorithm = AlgorithmConfig.preset("dapo")
    result = compute_step_advantages(samples, NOTHING, algorithm, 0.0)
    assert result.keep == [True, True, False, False]
    assert result.metrics["batch/kept_fraction"] == 0.5
    batch = build_update_batch(samples, result, NOTHING, reuse=False)
    assert [r.response_ids for r in batch.rows] == [[5, 6], [5, 6, 7]]
    assert batch.ref_logprobs is None


def test_the_kl_in_the_reward_compares_recomputed_log_probs_with_the_reference():
    samples = two_groups()  # rollout log-probs are -1 everywhere: they must not count
    algorithm = AlgorithmConfig.preset("reinforce_plus_plus")
    ref = [[-2.0] * len(s.response_ids) for s in samples]
    for shift, kl in ((0.0, 0.0), (0.5, 0.5)):  # k1: log p - log ref
        recomputed = Recomputed(
            ref_logprobs=ref,
            old_logprobs=[[x + shift for x in row] for row in ref],
            values=None,
        )
        result = compute_step_advantages(samples, recomputed, algorithm, 0.1)
        assert result.metrics["actor/reward_kl_penalty"] == pytest.approx(kl)
        assert result.metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)


def test_an_episode_trains_as_one_row_per_turn_with_its_slice_of_everything():
    turns = [([1, 2], [5, 6], [-0.1, -0.2]), ([1, 2, 5, 6, 40], [7], [-0.3])]
    episode = sample(0, 1.0, [5, 6, 7], turns=turns)
    other = sample(0, 0.0, [9])
    samples = [episode, other]
    recomputed = Recomputed(
        ref_logprobs=[[-1.0, -2.0, -3.0], [-4.0]],
        old_logprobs=[[-0.5, -0.6, -0.7], [-0.8]],
        values=None,
    )
    advantages = compute_step_advantages(samples, recomputed, AlgorithmConfig.preset("grpo"), 0)
    up = advantages.advantages[0, 0].item()
    for reuse in (False, True):
        batch = build_update_batch(samples, advantages, recomputed, reuse=reuse)
        first, second, single = batch.rows
        assert (first.prompt_ids, first.response_ids) == ([1, 2], [5, 6])
        assert (second.prompt_ids, second.response_ids) == ([1, 2, 5, 6, 40], [7])
        assert first.advantages == pytest.approx([up, up]) and second.advantages == [
            pytest.approx(up)
        ]
        assert first.rollout_logprobs == [-0.1, -0.2]
        assert (first.sequence_tokens, first.sequence_share) == (3, 0.5)
        assert (single.sequence_tokens, single.sequence_share) == (1, 1.0)
        assert batch.ref_logprobs == [[-1.0, -2.0], [-3.0], [-4.0]]
        # One pass over the batch is on-policy: the trainer takes its own log-probs.
        old = [r.old_logprobs for r in batch.rows]
        assert old == ([[-0.5, -0.6], [-0.7], [-0.8]] if reuse else [None, None, None])


def test_a_critic_s_values_become_each_row_s_old_values_and_returns():
    samples = two_groups()[:2]
    recomputed = Recomputed(ref_logprobs=None, old_logprobs=None, values=[[0.1, 0.2], [0, 0, 0]])
    algorithm = AlgorithmConfig.preset("ppo", gamma=1.0, lam=1.0)
    advantages = compute_step_advantages(samples, recomputed, algorithm, 0.0)
    rows = build_update_batch(samples, advantages, recomputed, reuse=False).rows
    assert rows[0].old_values == pytest.approx([0.1, 0.2])
    assert rows[0].returns == pytest.approx([1.0, 1.0])  # gamma = lam = 1: the final reward
    assert rows[1].returns == pytest.approx([0.0, 0.0, 0.0])


def test_no_samples_make_no_rows_and_no_advantage_metrics():
    result = compute_step_advantages([], NOTHING, AlgorithmConfig.preset("grpo"), 0.0)
    assert result.metrics == {} and result.keep == []
    assert build_update_batch([], result, NOTHING, reuse=True).rows == []


def test_update_result_averages_over_optimiser_steps_but_keeps_the_last_learning_rate():
    result = UpdateResult()
    assert result.skipped  # no optimiser step at all
    result.add({"actor/pg_loss": 1.0, "actor/lr": 1e-3, "train/skipped": 0.0})
    result.add({"actor/pg_loss": 3.0, "actor/lr": 2e-3, "train/skipped": 1.0})
    assert not result.skipped
    assert result.metrics() == {"actor/pg_loss": 2.0, "actor/lr": 2e-3, "train/skipped": 0.5}


# ------------------------------------------------------------------ what the trainer reduces


def rows_with_an_episode():
    return [
        TrainRow([1], [5, 6], [1.0, 1.0]),
        TrainRow([1], [5, 6], [0.5, 0.5], sequence_tokens=5, sequence_share=0.5),
        TrainRow([1, 5, 6], [7, 8, 9], [0.5] * 3, sequence_tokens=5, sequence_share=0.5),
        TrainRow([], [], []),  # an episode that ended before its first turn
    ]


def test_mini_batch_totals_name_what_the_losses_are_normalised_by():
    totals = MiniBatchTotals.of(rows_with_an_episode(), micro_batches=3).across_ranks(1)
    assert totals == MiniBatchTotals(
        micro_batches=3, longest_response=5.0, response_tokens=7.0, sequences=2.0
    )
    assert (totals.loss_tokens, totals.loss_sequences) == (7.0, 2.0)
    empty = MiniBatchTotals.of([TrainRow([], [], [])], micro_batches=0).across_ranks(1)
    assert (empty.micro_batches, empty.loss_tokens, empty.loss_sequences) == (0, 1.0, 1.0)
    # seq-mean-token-sum-norm divides by one constant: the mini-batch's longest response
    assert totals.fill_constant_normalizer(
        AlgorithmConfig.preset("dr_grpo", constant_normalizer=None)
    ).constant_normalizer == pytest.approx(5.0)
    named = AlgorithmConfig.preset("dr_grpo", constant_normalizer=64.0)
    assert totals.fill_constant_normalizer(named).constant_normalizer == 64.0
    grpo = AlgorithmConfig.preset("grpo")
    assert totals.fill_constant_normalizer(grpo).constant_normalizer is None


def test_metric_sums_add_loss_shares_and_token_weigh_the_rest():
    sums = MetricSums()
    sums.add({"actor/pg_loss": 0.25, "actor/ppo_kl": 0.1}, tokens=2.0, has_rows=True)
    sums.add({"actor/pg_loss": 0.5, "actor/ppo_kl": 0.4}, tokens=6.0, has_rows=True)
    sums.add({"actor/pg_loss": 0.0, "actor/ppo_kl": 9.0}, tokens=0.0, has_rows=False)
    sums.shares["ewc/penalty"] = 0.3
    reduced = sums.across_ranks(1)
    assert reduced["actor/pg_loss"] == pytest.approx(0.75)
    assert reduced["actor/ppo_kl"] == pytest.approx((0.1 * 2 + 0.4 * 6) / 8)
    assert reduced["ewc/penalty"] == pytest.approx(0.3)


def _reduce_on_rank(rank: int, store_file: str, out: dict) -> None:
    import torch.distributed as dist

    # A file store: a TCP port picked beforehand could be taken before rank 0 binds it.
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    try:
        rows = rows_with_an_episode() if rank == 0 else [TrainRow([1], [5] * 4, [0.0] * 4)]
        totals = MiniBatchTotals.of(rows, micro_batches=3 if rank == 0 else 1).across_ranks(2)
        sums = MetricSums()
        sums.add(
            {"actor/pg_loss": 0.25 + rank, "actor/ppo_kl": 0.1 * (rank + 1)},
            tokens=4.0,
            has_rows=True,
        )
        sums.shares["ewc/penalty"] = 0.3  # the same weights on every rank: the same penalty
        out[rank] = (totals, sums.across_ranks(2))
    finally:
        dist.destroy_process_group()


def test_two_ranks_agree_on_maxima_sums_and_token_means(tmp_path):
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    manager = mp.get_context("spawn").Manager()
    out = manager.dict()
    mp.start_processes(
        _reduce_on_rank, args=(str(tmp_path / "store"), out), nprocs=2, start_method="spawn"
    )
    (totals_0, metrics_0), (totals_1, metrics_1) = out[0], out[1]
    assert (
        totals_0
        == totals_1
        == MiniBatchTotals(
            micro_batches=3, longest_response=5.0, response_tokens=11.0, sequences=3.0
        )
    )
    assert metrics_0 == metrics_1
    assert metrics_0["actor/pg_loss"] == pytest.approx(0.25 + 1.25)  # shares add up
    assert metrics_0["actor/ppo_kl"] == pytest.approx((0.1 * 4 + 0.2 * 4) / 8)
    assert metrics_0["ewc/penalty"] == pytest.approx(0.3)  # not twice the penalty


# ------------------------------------------------------------------ what a step reports

# Every metric a GRPO step (KL in the loss, two domains) reported before the step was split
# into stages (plus batch/discarded_fraction, added with the discarded samples' page):
# dashboards, the collapse detector and the console read them by name.
GRPO_STEP_METRICS = {
    "batch/discarded_fraction",
    *("actor/entropy", "actor/grad_norm", "actor/kl", "actor/kl_coef", "actor/kl_loss"),
    *("actor/lr", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/pg_loss"),
    *("actor/ppo_kl", "batch/kept_fraction", "critic/advantages/mean", "critic/score/mean"),
    *("frac_reward_zero_std", "kl_coef", "policy_version", "sampling/temperature"),
    *("mix/arith_b/prompts", "mix/arith_b/weight", "mix/arithmetic/prompts"),
    *("mix/arithmetic/weight", "pass_rate", "pass_rate/arith_b", "pass_rate/arithmetic"),
    *("perf/cpu_threads", "perf/micro_batches", "perf/num_tokens", "perf/train_tokens"),
    *("perf/throughput", "perf/rollout_tokens_per_s", "train/skipped"),
    *("response_length/clip_ratio", "response_length/mean", "reward/mean", "reward/std"),
    *("reward/arith_b/mean", "reward/arith_b/std", "reward/arithmetic/mean"),
    *("reward/arithmetic/std", "reward/arith_b/correct/mean", "reward/arith_b/correct/std"),
    *("reward/arith_b/digit/mean", "reward/arith_b/digit/std"),
    *("reward/arithmetic/correct/mean", "reward/arithmetic/correct/std"),
    *("reward/arithmetic/digit/mean", "reward/arithmetic/digit/std"),
    *("timing_s/rollout", "timing_s/tools", "timing_s/reward", "timing_s/train"),
    *("timing_s/weight_sync", "timing_s/step"),
}


def test_a_step_reports_the_metrics_and_stages_it_always_did(tiny_model_dir, tmp_path):
    sink = ListSink()
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=1))
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    metrics = sink.metrics_at(1)
    assert set(metrics) == GRPO_STEP_METRICS
    assert metrics["actor/grad_norm"] > 0 and metrics["train/skipped"] == 0.0
    [timeline] = [p for kind, p in sink.events if kind == "step.timeline"]
    stages = [s["stage"] for s in timeline["stages"]]
    assert stages == ["rollout", "reward", "logprobs", "train", "weight_sync"]
