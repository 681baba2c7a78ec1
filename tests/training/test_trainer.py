"""The DeepSpeed trainer: updates move the policy the advantages' way, token-budget
micro-batching gives the same update as one batch, and ZeRO stages agree."""

from __future__ import annotations

import pytest
import torch

from training.algorithms import AlgorithmConfig
from training.batching import TrainRow
from training.trainer import Trainer, build_deepspeed_config


def rows_for(tokenizer, n=6):
    prompt = tokenizer.encode("What is 2 + 3?")
    rows = []
    for i in range(n):
        response = tokenizer.encode(" 5" if i % 2 == 0 else " nine and more words" * (1 + i % 3))
        advantage = 1.0 if i % 2 == 0 else -1.0
        rows.append(TrainRow(prompt, response, [advantage] * len(response)))
    return rows


def parameters(trainer):
    return {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}


def make_trainer(model_dir, stage=1, budget=4096, lr=1e-2, autocast="off"):
    return Trainer(
        model_dir,
        {"zero_optimization": {"stage": stage}, "gradient_clipping": 1.0},
        lr,
        reference=True,
        micro_batch_tokens=budget,
        autocast=autocast,
    )


def test_a_small_step_raises_the_advantage_weighted_logprob(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, lr=1e-4)
    rows = rows_for(trainer.tokenizer)

    def objective(logprobs):
        return sum(row.advantages[0] * sum(lp) for row, lp in zip(rows, logprobs, strict=True))

    before = objective(trainer.logprobs(rows))
    metrics = trainer.train_step(rows, AlgorithmConfig.preset("grpo"))
    assert objective(trainer.logprobs(rows)) > before
    assert metrics["actor/grad_norm"] > 0
    assert metrics["actor/lr"] == pytest.approx(1e-4)
    assert {"actor/pg_loss", "actor/entropy", "actor/pg_clipfrac"} <= set(metrics)


def test_bf16_autocast_scores_near_fp32_keeps_fp32_weights_and_still_moves_the_policy(
    tiny_model_dir,
):
    exact = make_trainer(tiny_model_dir, lr=1e-4)
    mixed = make_trainer(tiny_model_dir, lr=1e-4, autocast="bf16")
    rows = rows_for(exact.tokenizer)
    reference = exact.logprobs(rows)
    scored = mixed.logprobs(rows)
    # bf16 keeps 8 bits of mantissa: log-probabilities agree to a few hundredths, not bits.
    for a, b in zip(reference, scored, strict=True):
        assert b == pytest.approx(a, abs=0.1)

    def objective(logprobs):
        return sum(row.advantages[0] * sum(lp) for row, lp in zip(rows, logprobs, strict=True))

    mixed.train_step(rows, AlgorithmConfig.preset("grpo"))
    assert objective(mixed.logprobs(rows)) > objective(scored)
    assert {p.dtype for p in mixed.module.parameters()} == {torch.float32}


@pytest.mark.parametrize("preset", ["dapo", "grpo", "dr_grpo"])  # token-, seq-, constant-norm
def test_many_small_micro_batches_give_the_same_update_as_one(tiny_model_dir, preset):
    results = []
    for budget in (10_000, 24):  # one micro-batch vs one row each
        trainer = make_trainer(tiny_model_dir, budget=budget)
        rows = rows_for(trainer.tokenizer)
        ref = trainer.logprobs(rows, reference=True)
        metrics = trainer.train_step(
            rows, AlgorithmConfig.preset(preset), kl_coef=0.1, ref_logprobs=ref
        )
        results.append((metrics, parameters(trainer)))
    (one, params_one), (many, params_many) = results
    assert many["perf/micro_batches"] > one["perf/micro_batches"] == 1
    assert many["actor/pg_loss"] == pytest.approx(one["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert many["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], rel=1e-4)
    # Adam's first step is lr * g / (|g| + eps): where a gradient is as small as eps (a token
    # barely in the batch) the micro-batches' summation order moves it by up to ~1e-4 of the
    # weight; a wrong update would be of the order of lr = 1e-2.
    for name, tensor in params_one.items():
        torch.testing.assert_close(params_many[name], tensor, rtol=1e-4, atol=2e-4)


@pytest.mark.slow
def test_zero_stages_0_to_3_make_the_same_update(tiny_model_dir):
    updated = {}
    for stage in (0, 1, 2, 3):
        trainer = make_trainer(tiny_model_dir, stage=stage)
        trainer.train_step(rows_for(trainer.tokenizer), AlgorithmConfig.preset("grpo"))
        updated[stage] = dict(trainer.named_tensors())  # gathered in full under ZeRO-3
    # one Adam step moves weights by ~lr = 1e-2; ZeRO-3's reduce-scatter sums in another
    # order, which shows up around 1e-6: a wrong update would be four orders larger
    for stage in (1, 2, 3):
        for name, tensor in updated[0].items():
            torch.testing.assert_close(updated[stage][name], tensor, rtol=1e-4, atol=1e-5)


def test_the_run_owns_batch_size_and_accumulation_keys():
    config = build_deepspeed_config(
        {"optimizer": {"type": "AdamW", "params": {"lr": 9.0}}, "zero_optimization": {"stage": 2}},
        lr=1e-4,
    )
    assert config["optimizer"]["params"]["lr"] == 1e-4
    assert config["managed_gradient_accumulation"] is False
    assert config["gradient_accumulation_steps"] == 1


def test_an_entropy_bonus_alone_moves_the_policy_and_raises_its_entropy(tiny_model_dir):
    # Zero advantages: the two runs differ only by the bonus, so any difference is its own
    # doing (it was once computed on detached logits and did nothing).
    entropies = {}
    for coef in (0.0, 1.0):
        trainer = make_trainer(tiny_model_dir, lr=1e-3)
        rows = [
            TrainRow(r.prompt_ids, r.response_ids, [0.0] * len(r.response_ids))
            for r in rows_for(trainer.tokenizer)
        ]
        algorithm = AlgorithmConfig.preset("grpo", entropy_coef=coef)
        trainer.train_step(rows, algorithm)
        entropies[coef] = trainer.train_step(rows, algorithm)["actor/entropy"]
    assert entropies[1.0] > entropies[0.0]


@pytest.mark.parametrize("stage", [0, 1])
def test_a_step_with_no_rows_leaves_the_weights_alone(tiny_model_dir, stage):
    # DAPO drops every group whose rewards are all equal; a step can end up with no rows.
    # Stepping anyway moved ZeRO-0 weights by Adam momentum (7e-3) and crashed ZeRO-1.
    trainer = make_trainer(tiny_model_dir, stage=stage)
    trainer.train_step(rows_for(trainer.tokenizer), AlgorithmConfig.preset("dapo"))
    before = parameters(trainer)
    metrics = trainer.train_step([], AlgorithmConfig.preset("dapo"))
    assert metrics["train/skipped"] == 1.0 and metrics["perf/train_tokens"] == 0.0
    after = parameters(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"])
def test_an_episode_split_into_turns_weighs_what_it_weighs_in_one_piece(
    tiny_model_dir, aggregation
):
    # Cut a response in two "turns" whose second context is the first turn (no observation):
    # the tokens and their log-probs are the same, so the update must be too. Counting each
    # turn as a sequence gave a 3-turn episode three times a 1-turn episode's weight.
    results = []
    for split in (False, True):
        trainer = make_trainer(tiny_model_dir)
        whole = rows_for(trainer.tokenizer, n=4)
        long = whole[1]  # several tokens
        rows = [r for r in whole if r is not long]
        if split:
            cut = len(long.response_ids) // 2
            first, second = long.response_ids[:cut], long.response_ids[cut:]
            n = len(long.response_ids)
            rows += [
                TrainRow(
                    long.prompt_ids,
                    first,
                    long.advantages[:cut],
                    sequence_tokens=n,
                    sequence_share=0.5,
                ),
                TrainRow(
                    long.prompt_ids + first,
                    second,
                    long.advantages[cut:],
                    sequence_tokens=n,
                    sequence_share=0.5,
                ),
            ]
        else:
            rows.append(long)
        config = AlgorithmConfig.from_dict(
            {**AlgorithmConfig.preset("grpo").to_dict(), "loss_aggregation": aggregation}
        )
        metrics = trainer.train_step(rows, config)
        results.append((metrics, parameters(trainer)))
    (one, params_one), (turns, params_turns) = results
    assert turns["actor/pg_loss"] == pytest.approx(one["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert turns["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], rel=1e-4)
    for name, tensor in params_one.items():
        torch.testing.assert_close(params_turns[name], tensor, rtol=1e-4, atol=2e-4)


def test_a_row_without_a_response_scores_as_nothing(tiny_model_dir):
    # A tool episode that ended before its first turn (the prompt filled the token budget)
    # has no prompt or response ids; scoring it crashed the reference pass of the whole step.
    trainer = make_trainer(tiny_model_dir)
    [row] = rows_for(trainer.tokenizer, n=1)
    assert trainer.logprobs([TrainRow([], [], [])], reference=True) == [[]]
    scored = trainer.logprobs([TrainRow([], [], []), row], reference=True)
    assert scored[0] == [] and len(scored[1]) == len(row.response_ids)
