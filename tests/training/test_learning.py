"""Proof that the loop learns: GRPO on the demo model raises the held-out mean reward; the same
run with the learning rate at 0 leaves it exactly where it started.

Reward: the demo arithmetic prompts with a rubric that prefers answers containing the digit 7
(TRL's style of end-to-end check: a preference the base model shows on some samples, so every
group has a spread to learn from). The demo domains' own correctness rubrics are too sparse for
a 1.4M-parameter model to move measurably in the minutes a test may take (bench/README.md,
"training: learning", has the measurements).

Margin: the held-out set is 48 test-split prompts answered greedily. Its mean is a sample
mean, so the rise must exceed 3 standard errors of the difference of the two means
(sqrt(sem_before^2 + sem_after^2), an unpaired bound, larger than the paired one) *and* 0.25
absolute, so that a base rate of exactly 0 (sem 0) cannot make any wobble count as learning.
With lr = 0 the weights never change (checked through the parameter digest), so the greedy
held-out reward must be identical, not merely close.
"""

from __future__ import annotations

import math

import pytest

from training import ListSink, RunSpec, StaticControl, run

PREFERS_SEVEN = {
    "version": 1,
    "criteria": [
        {"name": "seven", "kind": "regex_match", "weight": 1.0, "params": {"pattern": "7"}}
    ],
}


def learning_spec(model_dir, lr, steps):
    from training.demo.domains import get_domain

    arithmetic = get_domain("arithmetic")
    return RunSpec.from_dict(
        {
            "name": f"learn-lr{lr}",
            "base_model": str(model_dir),
            "seed": 0,
            "max_steps": steps,
            "lr": lr,
            "algorithm": {"algorithm": "grpo"},
            "kl": {"coef": 0.0, "reference": False},
            "batch": {"prompts_per_step": 16, "group_size": 8, "micro_batch_tokens": 4096},
            "sampling": {"temperature": 1.0, "max_new_tokens": 16},
            "domains": [
                {
                    "name": "arithmetic",
                    "rubric_spec": PREFERS_SEVEN,
                    "tasks": arithmetic.make_tasks(512, seed=0, split="train"),
                    "eval_tasks": arithmetic.make_tasks(48, seed=0, split="test"),
                }
            ],
            "eval": {"tasks_per_domain": 48, "greedy": True},
            "deepspeed": {"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0},
            "rollout": {"engine": "hf"},
            "checkpoint": {"save_final": False, "resume": "none"},
        }
    )


def held_out(outcome):
    (first_step, before), (last_step, after) = outcome.eval_history[0], outcome.eval_history[-1]
    assert first_step == 0 and last_step == outcome.step
    return before, after


@pytest.mark.slow
def test_grpo_raises_held_out_reward_and_lr_zero_does_not():
    from training.models import ensure_demo_model

    model_dir = ensure_demo_model()
    learned = run(learning_spec(model_dir, 5e-4, steps=5), ListSink(), StaticControl())
    assert learned.status == "completed", learned.error
    before, after = held_out(learned)
    rise = after["eval/reward/mean"] - before["eval/reward/mean"]
    standard_error = math.hypot(before["eval/reward/sem"], after["eval/reward/sem"])
    assert rise > max(3 * standard_error, 0.25), (before, after)

    frozen_sink = ListSink()
    frozen = run(learning_spec(model_dir, 0.0, steps=3), frozen_sink, StaticControl())
    assert frozen.status == "completed", frozen.error
    before, after = held_out(frozen)
    assert after["eval/reward/mean"] == before["eval/reward/mean"]
    assert frozen_sink.metrics_at(1)["actor/grad_norm"] > 0  # gradients flowed; lr 0 kept them out
    from transformers import AutoModelForCausalLM

    from training.loop import _parameter_digest

    base = _parameter_digest(AutoModelForCausalLM.from_pretrained(model_dir))
    assert dict(frozen_sink.events)["run.completed"]["parameter_digests"] == [base]
