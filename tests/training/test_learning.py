"""Proof that the loop learns: GRPO on the demo model raises the held-out mean reward of a demo
domain under that domain's own rubric; the same run with the learning rate at 0 leaves it
exactly where it started.

Domain: ``parity`` ("Is 4821 even or odd?", exact match on the boxed answer). Its warm-up
demonstrations have coin-flip labels, so the base model knows the answer format but not the
skill: whatever the held-out reward rises to, only the rubric's signal through the loop can
have taught it, and it must hold on numbers the run never saw (held-out split). The held-out
set has as many even numbers as odd ones, so a model that gives one answer to everything scores
exactly 0.5 and cannot pass for one that learned.

Margin: the held-out set is 64 test-split tasks answered greedily. Its mean is a sample mean,
so the rise must exceed 3 standard errors of the difference of the two means
(sqrt(sem_before^2 + sem_after^2), an unpaired bound, larger than the paired one) *and* 0.25
absolute (half the way from chance to perfect), so that no wobble around chance counts as
learning. With lr = 0 the weights never change (checked through the parameter digest), so the
greedy held-out reward must be identical, not merely close.
"""

from __future__ import annotations

import math

import pytest

from training import ListSink, RunSpec, StaticControl, run

STEPS = 32
HELD_OUT = 64


def balanced_held_out(domain, n):
    """``n`` test-split tasks, half with each answer."""
    tasks = domain.make_tasks(4 * n, seed=0, split="test")
    by_answer = {
        answer: [t for t in tasks if t["ground_truth"] == answer] for answer in ("even", "odd")
    }
    return by_answer["even"][: n // 2] + by_answer["odd"][: n // 2]


def learning_spec(model_dir, lr, steps):
    from training.demo.domains import get_domain

    parity = get_domain("parity")
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
            # Hotter than 1: more groups hold both answers, so more of each batch teaches.
            "sampling": {"temperature": 1.2, "max_new_tokens": parity.max_new_tokens},
            "domains": [
                {
                    "name": "parity",
                    "rubric_spec": parity.rubric_spec,
                    "tasks": parity.make_tasks(512, seed=0, split="train"),
                    "eval_tasks": balanced_held_out(parity, HELD_OUT),
                }
            ],
            "eval": {"tasks_per_domain": HELD_OUT, "greedy": True},
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
    learned = run(learning_spec(model_dir, 1e-3, steps=STEPS), ListSink(), StaticControl())
    assert learned.status == "completed", learned.error
    before, after = held_out(learned)
    # The base answers at chance on the balanced set: it knows the format, not the skill.
    assert 0.3 <= before["eval/reward/mean"] <= 0.7, before
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
