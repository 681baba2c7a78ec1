"""training.algorithms: every estimator, loss and aggregation against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from training.algorithm_config import ADVANTAGE_ESTIMATOR_NAMES
from training.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHM_PRESETS,
    LOSS_AGGREGATIONS,
    AlgorithmConfig,
    actor_loss,
    advantage_metrics,
    aggregate_loss,
    apply_kl_in_reward,
    compute_advantages,
    entropy_from_logits,
    filter_zero_variance_groups,
    kl_estimate,
    masked_whiten,
    policy_loss,
    token_level_rewards,
    token_logprobs_from_logits,
    value_loss,
    zero_variance_group_fraction,
)

SQRT_HALF = math.sqrt(0.5)


def full_mask(rows: int, tokens: int) -> torch.Tensor:
    return torch.ones(rows, tokens)


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    expected_tensor = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.detach().double(), expected_tensor, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------- rewards


def test_outcome_rewards_land_on_the_last_response_token_of_each_row():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = token_level_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    expected = torch.tensor([[0, 0, 2.0, 0], [3.0, 0, 0, 0], [0, 0, 0, 0]])
    assert torch.equal(out, expected)


def test_token_level_rewards_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="token-level rewards have shape"):
        token_level_rewards(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="rewards must be"):
        token_level_rewards(torch.zeros(3), torch.ones(2, 4))


# --------------------------------------------------------------------------------- GRPO family


def test_grpo_normalises_within_each_group_by_the_unbiased_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0])
    mask = full_mask(5, 3)
    mask[1, 2] = 0
    adv, returns = compute_advantages(
        "grpo", rewards=rewards, response_mask=mask, group_index=["a", "a", "b", "b", "c"]
    )
    # Group a: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / sqrt(0.5) = +-sqrt(0.5).
    assert adv[0].tolist() == pytest.approx([SQRT_HALF] * 3, abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-SQRT_HALF, -SQRT_HALF, 0.0], abs=1e-5)
    # Group b: all rewards equal -> zero advantage, not NaN.
    assert adv[2:4].abs().max() == 0
    # A group of one keeps its raw reward (mean 0, std 1, as in verl).
    assert adv[4].tolist() == pytest.approx([5.0] * 3, abs=1e-4)
    assert torch.equal(adv, returns)


def test_dr_grpo_only_subtracts_the_group_mean():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    groups = [0, 0, 1, 1]
    for name, kwargs in (("dr_grpo", {}), ("grpo", {"norm_by_std": False})):
        adv, _ = compute_advantages(
            name, rewards=rewards, response_mask=full_mask(4, 2), group_index=groups, **kwargs
        )
        assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_dr_grpo_ignores_a_request_to_normalise_by_std():
    adv, _ = compute_advantages(
        "dr_grpo",
        rewards=torch.tensor([1.0, 0.0]),
        response_mask=full_mask(2, 1),
        group_index=[0, 0],
        norm_by_std=True,
    )
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5])


def test_dapo_advantage_is_the_grpo_advantage():
    kwargs = {
        "rewards": torch.tensor([1.0, 0.0, 0.5, 0.2]),
        "response_mask": full_mask(4, 3),
        "group_index": [7, 7, 9, 9],
    }
    assert torch.equal(
        compute_advantages("dapo", **kwargs)[0], compute_advantages("grpo", **kwargs)[0]
    )


def test_group_ids_may_be_a_tensor_and_groups_may_be_interleaved():
    rewards = torch.tensor([1.0, 3.0, 0.0, 5.0])
    adv, _ = compute_advantages(
        "dr_grpo",
        rewards=rewards,
        response_mask=full_mask(4, 1),
        group_index=torch.tensor([10, 20, 10, 20]),
    )
    assert adv[:, 0].tolist() == pytest.approx([0.5, -1.0, -0.5, 1.0])


def test_token_level_rewards_are_summed_per_row_by_group_estimators():
    rewards = torch.tensor([[0.5, 0.5, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, _ = compute_advantages("dr_grpo", rewards=rewards, response_mask=mask, group_index=[0, 0])
    # The 9.0 sits on padding and must not count: row sums are 1.0 and 0.0.
    assert adv[0, :2].tolist() == pytest.approx([0.5, 0.5])
    assert adv[1].tolist() == pytest.approx([-0.5] * 3)


def test_rloo_subtracts_the_mean_of_the_other_samples():
    rewards = torch.tensor([1.0, 0.0, 0.0, 4.0])
    adv, returns = compute_advantages(
        "rloo", rewards=rewards, response_mask=full_mask(4, 2), group_index=["x", "x", "x", "y"]
    )
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; the lone sample keeps its reward.
    assert adv[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5, 4.0])
    assert torch.equal(adv, returns)


def test_reinforce_plus_plus_whitens_discounted_returns_over_the_batch():
    adv, returns = compute_advantages(
        "reinforce_plus_plus", rewards=torch.tensor([1.0, 0.0]), response_mask=full_mask(2, 2)
    )
    assert returns.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    # Entries 1,1,0,0: mean 0.5, unbiased variance 1/3 -> +-0.5 * sqrt(3).
    half_root3 = 0.5 * math.sqrt(3)
    assert_values(adv, [[half_root3, half_root3], [-half_root3, -half_root3]])


def test_reinforce_plus_plus_discounts_with_gamma_and_stops_at_padding():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    _, returns = compute_advantages(
        "reinforce_plus_plus", rewards=torch.tensor([1.0, 2.0]), response_mask=mask, gamma=0.5
    )
    assert_values(returns, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens_globally():
    adv, _ = compute_advantages(
        "reinforce_plus_plus_baseline",
        rewards=torch.tensor([1.0, 0.0, 3.0, 1.0]),
        response_mask=full_mask(4, 1),
        group_index=[0, 0, 1, 1],
    )
    centred = torch.tensor([0.5, -0.5, 1.0, -1.0])
    std = math.sqrt((0.25 + 0.25 + 1 + 1) / 3)
    assert adv[:, 0].tolist() == pytest.approx((centred / std).tolist(), abs=1e-5)


def test_gae_matches_the_hand_computed_recursion():
    values = torch.tensor([[0.5, 0.8], [0.1, 0.2]])
    adv, returns = compute_advantages(
        "gae",
        rewards=torch.tensor([1.0, 0.0]),
        response_mask=full_mask(2, 2),
        values=values,
        gamma=0.9,
        lam=0.5,
    )
    # Row 0: delta_1 = 1 - 0.8 = 0.2, A_1 = 0.2; delta_0 = 0.9 * 0.8 - 0.5 = 0.22,
    # A_0 = 0.22 + 0.9 * 0.5 * 0.2 = 0.31. Row 1: delta_1 = -0.2; delta_0 = 0.9 * 0.2 - 0.1
    # = 0.08, A_0 = 0.08 - 0.45 * 0.2 = -0.01.
    raw = torch.tensor([[0.31, 0.2], [-0.01, -0.2]])
    assert_values(returns, raw + values, atol=1e-6)
    assert_values(adv, masked_whiten(raw, full_mask(2, 2)))


def test_gae_skips_padding_as_if_it_were_not_there():
    values = torch.tensor([[0.5, 9.0, 0.8]])
    _, padded = compute_advantages(
        "gae",
        rewards=torch.tensor([[0.0, 7.0, 1.0]]),
        response_mask=torch.tensor([[1, 0, 1]]),
        values=values,
        gamma=0.9,
        lam=0.5,
    )
    _, dense = compute_advantages(
        "gae",
        rewards=torch.tensor([1.0]),
        response_mask=full_mask(1, 2),
        values=torch.tensor([[0.5, 0.8]]),
        gamma=0.9,
        lam=0.5,
    )
    assert padded[0, [0, 2]].tolist() == pytest.approx(dense[0].tolist())
    assert padded[0, 1] == 0


def test_empty_responses_get_zero_advantage_from_every_estimator():
    mask = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1]])
    for name in ADVANTAGE_ESTIMATORS:
        adv, returns = compute_advantages(
            name,
            rewards=torch.tensor([1.0, 1.0, 0.0, 0.5]),
            response_mask=mask,
            group_index=[0, 0, 0, 1],
            values=torch.full((4, 2), 0.3),
        )
        assert torch.isfinite(adv).all(), name
        assert adv[1].abs().sum() == 0, name
        assert returns[1].abs().sum() == 0, name


def test_advantages_carry_no_gradient():
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    values = torch.zeros(2, 2, requires_grad=True)
    for name in ADVANTAGE_ESTIMATORS:
        adv, returns = compute_advantages(
            name, rewards=rewards, response_mask=full_mask(2, 2), group_index=[0, 0], values=values
        )
        assert not adv.requires_grad and not returns.requires_grad, name


def test_bad_estimator_inputs_get_clear_errors():
    mask = full_mask(2, 2)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        compute_advantages("nope", rewards=torch.zeros(2), response_mask=mask)
    with pytest.raises(ValueError, match="needs group_index"):
        compute_advantages("grpo", rewards=torch.zeros(2), response_mask=mask)
    with pytest.raises(ValueError, match="group_index has 3 entries"):
        compute_advantages(
            "rloo", rewards=torch.zeros(2), response_mask=mask, group_index=[0, 0, 1]
        )
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages("gae", rewards=torch.zeros(2), response_mask=mask)
    with pytest.raises(ValueError, match="response_mask must be"):
        compute_advantages(
            "grpo", rewards=torch.zeros(2), response_mask=torch.ones(2), group_index=[0, 0]
        )


def test_advantage_metrics_use_verl_names_and_ignore_padding():
    adv = torch.tensor([[1.0, 100.0], [-2.0, 0.5]])
    mask = torch.tensor([[1, 0], [1, 1]])
    metrics = advantage_metrics(adv, adv, mask)
    assert metrics["critic/advantages/max"] == 1.0
    assert metrics["critic/advantages/min"] == -2.0
    assert metrics["critic/returns/mean"] == pytest.approx(-0.5 / 3)


# ------------------------------------------------------------------------- DAPO filtering


def test_zero_variance_and_single_sample_groups_are_filtered():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0, 0.3, 0.3])
    groups = ["a", "a", "b", "b", "c", "d", "d"]
    keep = filter_zero_variance_groups(rewards, groups)
    assert keep.tolist() == [True, True, False, False, False, False, False]
    assert zero_variance_group_fraction(rewards, groups) == pytest.approx(3 / 4)


def test_filtering_tolerates_float_noise_only_when_asked():
    rewards = torch.tensor([0.3, 0.3 + 1e-6])
    assert filter_zero_variance_groups(rewards, [0, 0]).tolist() == [True, True]
    assert filter_zero_variance_groups(rewards, [0, 0], tolerance=1e-5).tolist() == [False, False]


# ------------------------------------------------------------------------------ aggregation


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected", "kwargs"),
    [
        ("token-mean", 10 / 4, {}),
        ("seq-mean-token-sum", (6 + 4) / 2, {}),
        ("seq-mean-token-mean", (2 + 4) / 2, {}),
        ("seq-mean-token-sum-norm", 10 / (2 * 4), {"constant_normalizer": 4}),
        ("seq-mean-token-sum-norm", 10 / (2 * 3), {}),
    ],
)
def test_aggregation_modes_match_hand_values(mode, expected, kwargs):
    assert float(aggregate_loss(LOSS, MASK, mode, **kwargs)) == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_rows_with_empty_responses_do_not_count(mode):
    loss = torch.cat([LOSS, torch.tensor([[50.0, 50.0, 50.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    kwargs = {"constant_normalizer": 4}
    assert float(aggregate_loss(loss, mask, mode, **kwargs)) == pytest.approx(
        float(aggregate_loss(LOSS, MASK, mode, **kwargs))
    )


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_a_batch_with_no_response_tokens_has_zero_loss(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(2, 3), mode)
    assert float(out.detach()) == 0.0
    out.backward()
    assert loss.grad is not None and loss.grad.abs().sum() == 0


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_micro_batch_shares_sum_to_the_whole_batch_loss(mode):
    torch.manual_seed(0)
    loss = torch.randn(5, 6)
    mask = (torch.rand(5, 6) > 0.3).int()
    mask[2] = 0
    whole = aggregate_loss(loss, mask, mode, constant_normalizer=8)
    totals = {
        "global_tokens": float(mask.sum()),
        "global_sequences": float((mask.sum(-1) > 0).sum()),
        "constant_normalizer": 8,
    }
    parts = [
        aggregate_loss(loss[rows], mask[rows], mode, **totals)
        for rows in (slice(0, 2), slice(2, 3), slice(3, 5))
    ]
    assert float(sum(parts)) == pytest.approx(float(whole), abs=1e-6)


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(LOSS, MASK, "mean")


# ------------------------------------------------------------------------------ policy loss


def test_ppo_clip_takes_the_pessimistic_branch_per_token():
    # Tokens: A>0 ratio 1.5 (clipped at 1.2); A<0 ratio 0.5 (clipped at 0.8);
    # A>0 ratio 0.5 (not clipped); A<0 ratio 1.1 (inside the range).
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.1]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, metrics = policy_loss(
        "ppo",
        logprobs=ratios.log(),
        old_logprobs=torch.zeros(1, 4),
        advantages=advantages,
        response_mask=full_mask(1, 4),
    )
    assert float(loss) == pytest.approx((-1.2 + 0.8 - 0.5 + 1.1) / 4)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/pg_loss"] == pytest.approx(float(loss))
    assert metrics["actor/ppo_kl"] == pytest.approx(float(-ratios.log().mean()))


def test_clip_higher_lets_positive_advantage_tokens_rise_further():
    ratio = torch.tensor([[1.25]])
    kwargs = {
        "logprobs": ratio.log(),
        "old_logprobs": torch.zeros(1, 1),
        "advantages": torch.ones(1, 1),
        "response_mask": full_mask(1, 1),
    }
    symmetric, m1 = policy_loss("ppo", clip_low=0.2, clip_high=0.2, **kwargs)
    higher, m2 = policy_loss("ppo", clip_low=0.2, clip_high=0.28, **kwargs)
    assert float(symmetric) == pytest.approx(-1.2) and m1["actor/pg_clipfrac"] == 1.0
    assert float(higher) == pytest.approx(-1.25) and m2["actor/pg_clipfrac"] == 0.0


def test_dual_clip_caps_the_loss_of_negative_advantages():
    ratio = torch.tensor([[4.0, 4.0]])
    kwargs = {
        "logprobs": ratio.log(),
        "old_logprobs": torch.zeros(1, 2),
        "advantages": torch.tensor([[-1.0, 1.0]]),
        "response_mask": full_mask(1, 2),
    }
    plain, _ = policy_loss("ppo", **kwargs)
    capped, metrics = policy_loss("ppo", dual_clip=3.0, **kwargs)
    assert float(plain) == pytest.approx((4.0 - 1.2) / 2)
    assert float(capped) == pytest.approx((3.0 - 1.2) / 2)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.5)


def test_vanilla_policy_gradient_is_minus_advantage_times_logprob():
    logprobs = torch.tensor([[-1.0, -2.0]])
    loss, _ = policy_loss(
        "vanilla_pg",
        logprobs=logprobs,
        old_logprobs=logprobs,
        advantages=torch.tensor([[2.0, -1.0]]),
        response_mask=full_mask(1, 2),
    )
    assert float(loss) == pytest.approx((2.0 - 2.0) / 2)


def test_ppo_gradient_at_ratio_one_is_the_policy_gradient():
    logprobs = torch.tensor([[-0.7, -1.3, -0.2]], requires_grad=True)
    advantages = torch.tensor([[1.0, -2.0, 0.5]])
    loss, _ = policy_loss(
        "ppo",
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        advantages=advantages,
        response_mask=full_mask(1, 3),
    )
    loss.backward()
    assert_values(logprobs.grad, -advantages / 3)


def test_bad_policy_loss_arguments_are_refused():
    kwargs = {
        "logprobs": torch.zeros(1, 2),
        "old_logprobs": torch.zeros(1, 2),
        "advantages": torch.zeros(1, 2),
        "response_mask": full_mask(1, 2),
    }
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss("gspo2", **kwargs)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss("ppo", dual_clip=0.5, **kwargs)
    with pytest.raises(ValueError, match="clip_low must be < 1"):
        policy_loss("ppo", clip_low=1.5, **kwargs)
    with pytest.raises(ValueError, match="old_logprobs has shape"):
        policy_loss("ppo", **{**kwargs, "old_logprobs": torch.zeros(1, 3)})


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_gradients_reach_only_response_tokens(mode):
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    logprobs = (torch.randn(3, 4) - 1).requires_grad_(True)
    logits = torch.randn(3, 4, 11, requires_grad=True)
    config = AlgorithmConfig(loss_aggregation=mode, kl_coef=0.1, entropy_coef=0.01)
    loss, metrics = actor_loss(
        config,
        logprobs=logprobs,
        old_logprobs=logprobs.detach() + 0.1,
        advantages=torch.randn(3, 4),
        response_mask=mask,
        ref_logprobs=torch.randn(3, 4) - 1,
        entropy=entropy_from_logits(logits),
    )
    loss.backward()
    padding = mask == 0
    assert logprobs.grad[padding].abs().sum() == 0
    assert logits.grad[padding].abs().sum() == 0
    assert logprobs.grad[~padding].abs().sum() > 0
    assert logits.grad[~padding].abs().sum() > 0
    assert {"actor/pg_clipfrac", "actor/kl", "actor/entropy", "actor/ppo_kl"} <= set(metrics)


# -------------------------------------------------------------------------------- value loss


def test_value_loss_is_clipped_around_the_old_values():
    loss, metrics = value_loss(
        values=torch.tensor([[1.5, 0.9]]),
        old_values=torch.tensor([[1.0, 1.0]]),
        returns=torch.tensor([[2.0, 0.0]]),
        response_mask=full_mask(1, 2),
        clip_range=0.2,
    )
    # Token 0: unclipped (1.5-2)^2 = 0.25, clipped value 1.2 -> 0.64, take 0.64.
    # Token 1: inside the range -> 0.81.
    assert float(loss) == pytest.approx(0.5 * (0.64 + 0.81) / 2)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.2)


def test_unclipped_value_loss_is_half_the_squared_error():
    loss, _ = value_loss(
        values=torch.tensor([[3.0]]),
        old_values=torch.tensor([[0.0]]),
        returns=torch.tensor([[1.0]]),
        response_mask=full_mask(1, 1),
        clip_range=None,
    )
    assert float(loss) == pytest.approx(2.0)


# ----------------------------------------------------------------------------------------- KL


def test_kl_estimators_match_hand_values():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    log_ratio = math.log(2)
    assert float(kl_estimate("k1", logp, ref)) == pytest.approx(log_ratio)
    assert float(kl_estimate("kl", logp, ref)) == pytest.approx(log_ratio)
    assert float(kl_estimate("abs", ref, logp)) == pytest.approx(log_ratio)
    assert float(kl_estimate("k2", logp, ref)) == pytest.approx(0.5 * log_ratio**2)
    assert float(kl_estimate("mse", logp, ref)) == pytest.approx(0.5 * log_ratio**2)
    assert float(kl_estimate("k3", logp, ref)) == pytest.approx(0.5 - 1 + log_ratio)
    assert float(kl_estimate("low_var_kl", logp, ref)) == pytest.approx(0.5 - 1 + log_ratio)


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    generator = torch.Generator().manual_seed(0)
    p_logits = torch.randn(8, generator=generator)
    # A reference near the policy, as in training: k3's clamp at 10 (verl's) only bites when
    # q/p exceeds 11 somewhere, which would bias it.
    q_logits = p_logits + 0.5 * torch.randn(8, generator=generator)
    logp, logq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    true_kl = float((logp.exp() * (logp - logq)).sum())
    samples = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=generator)
    for kind in ("k1", "k3"):
        estimate = float(kl_estimate(kind, logp[samples], logq[samples]).mean())
        assert estimate == pytest.approx(true_kl, rel=0.03), kind
    k3 = kl_estimate("k3", logp[samples], logq[samples])
    assert (k3 >= 0).all()


def test_k3_stays_finite_for_extreme_log_ratios():
    out = kl_estimate("k3", torch.tensor([0.0, -200.0]), torch.tensor([-200.0, 0.0]))
    assert torch.isfinite(out).all() and (out <= 10).all()


def test_unknown_kl_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate("k4", torch.zeros(1), torch.zeros(1))


def test_kl_folded_into_the_reward_penalises_every_response_token():
    mask = torch.tensor([[1, 1, 0]])
    rewards, metrics = apply_kl_in_reward(
        torch.tensor([1.0]),
        logprobs=torch.tensor([[-1.0, -1.0, -1.0]]),
        ref_logprobs=torch.tensor([[-1.5, -0.5, -9.0]]),
        response_mask=mask,
        coef=0.1,
        kind="k1",
    )
    assert_values(rewards, [[-0.05, 1.0 + 0.05, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.0)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1


# ----------------------------------------------------------------------------------- entropy


def test_entropy_of_a_uniform_distribution_is_log_vocab():
    out = entropy_from_logits(torch.zeros(2, 3, 50))
    assert out.shape == (2, 3)
    assert_values(out, [[math.log(50)] * 3] * 2)


def test_chunked_entropy_and_logprobs_match_the_direct_computation_and_gradient():
    torch.manual_seed(2)
    logits = torch.randn(3, 7, 31, dtype=torch.float64)
    labels = torch.randint(0, 31, (3, 7))
    direct_logits = logits.clone().requires_grad_(True)
    direct_entropy = torch.distributions.Categorical(logits=direct_logits).entropy()
    direct_logprobs = direct_logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (direct_entropy.sum() + direct_logprobs.sum()).backward()

    chunked_logits = logits.clone().requires_grad_(True)
    entropy = entropy_from_logits(chunked_logits, chunk_tokens=4)
    logprobs = token_logprobs_from_logits(chunked_logits, labels, chunk_tokens=5)
    (entropy.sum() + logprobs.sum()).backward()

    assert entropy.dtype == torch.float32
    assert_values(entropy, direct_entropy)
    assert_values(logprobs, direct_logprobs)
    assert torch.allclose(chunked_logits.grad, direct_logits.grad, atol=1e-5)


def test_logprobs_need_aligned_labels():
    with pytest.raises(ValueError, match="expected labels == logits.shape"):
        token_logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


# -------------------------------------------------------------------------------- actor loss


def _actor_inputs():
    logprobs = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    return {
        "logprobs": logprobs,
        "old_logprobs": logprobs.detach(),
        "advantages": torch.tensor([[1.0, 1.0]]),
        "response_mask": full_mask(1, 2),
        "ref_logprobs": torch.tensor([[-1.5, -1.5]]),
        "entropy": torch.tensor([[2.0, 2.0]]),
    }


def test_actor_loss_adds_kl_in_the_loss_and_subtracts_the_entropy_bonus():
    config = AlgorithmConfig(kl_estimator="k1", kl_coef=0.1, entropy_coef=0.01)
    loss, metrics = actor_loss(config, **_actor_inputs())
    assert float(loss.detach()) == pytest.approx(-1.0 + 0.1 * 0.5 - 0.01 * 2.0)
    assert metrics["actor/kl"] == pytest.approx(0.5)
    assert metrics["actor/kl_loss"] == pytest.approx(0.5)
    assert metrics["actor/entropy"] == pytest.approx(2.0)


def test_actor_loss_leaves_kl_out_when_it_is_in_the_reward_and_honours_live_overrides():
    in_reward = AlgorithmConfig(kl_estimator="k1", kl_coef=0.1, kl_in_reward=True)
    loss, metrics = actor_loss(in_reward, **_actor_inputs())
    assert float(loss.detach()) == pytest.approx(-1.0)
    assert metrics["actor/kl"] == pytest.approx(0.5)
    in_loss = AlgorithmConfig(kl_estimator="k1", kl_coef=0.1)
    loss, metrics = actor_loss(in_loss, kl_coef=1.0, **_actor_inputs())
    assert float(loss.detach()) == pytest.approx(-1.0 + 0.5)
    assert metrics["actor/kl_coef"] == 1.0


def test_actor_loss_refuses_kl_without_a_reference():
    inputs = _actor_inputs()
    inputs.pop("ref_logprobs")
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        actor_loss(AlgorithmConfig(kl_coef=0.1), **inputs)


# ---------------------------------------------------------------------------- configuration


def test_every_preset_builds_and_names_a_registered_estimator():
    for name in ALGORITHM_PRESETS:
        config = AlgorithmConfig.preset(name)
        assert config.advantage_estimator in ADVANTAGE_ESTIMATORS
    dapo = AlgorithmConfig.preset("dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.filter_zero_variance_groups) == (0.2, 0.28, True)
    assert AlgorithmConfig.preset("ppo").needs_value_head
    assert not AlgorithmConfig.preset("dr_grpo").norm_by_std


def test_config_round_trips_and_presets_take_overrides():
    config = AlgorithmConfig.from_dict({"algorithm": "grpo", "kl_coef": 0.05})
    assert config.kl_coef == 0.05 and config.loss_aggregation == "seq-mean-token-mean"
    assert AlgorithmConfig.from_dict(config.to_dict()) == config


def test_config_errors_name_every_bad_field():
    with pytest.raises(ValueError) as excinfo:
        AlgorithmConfig.from_dict(
            {"advantage_estimator": "ppo2", "clip_low": 1.5, "loss_aggregation": "x"}
        )
    message = str(excinfo.value)
    for field in ("advantage_estimator", "clip_low", "loss_aggregation"):
        assert field in message
    with pytest.raises(ValueError, match="colour: unknown field"):
        AlgorithmConfig.from_dict({"colour": "red"})
    with pytest.raises(ValueError, match="unknown algorithm 'ppo3'"):
        AlgorithmConfig.preset("ppo3")


def test_the_torch_free_config_knows_every_registered_estimator():
    # training.algorithm_config validates names without importing torch; the registry and its
    # list of names must agree or a spec could name an estimator that does not exist.
    assert set(ADVANTAGE_ESTIMATORS) == ADVANTAGE_ESTIMATOR_NAMES
