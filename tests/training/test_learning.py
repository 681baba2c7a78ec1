"""Proof that the loop learns, on any seed and whatever the low bits: GRPO on the demo model
raises the held-out mean reward of a demo domain under that domain's own rubric; the same run
with the learning rate at 0 leaves it exactly where it started.

Domain: ``parity`` ("Is 4821 even or odd?", exact match on the boxed answer). Its warm-up
demonstrations have coin-flip labels, so the base model knows the answer format (and, from
other drills, how to read a number's last digit) but not the skill: whatever the held-out
reward rises to, only the rubric's signal through the loop can have taught it, and it must hold
on numbers the run never saw (held-out split). The held-out set has as many even numbers as odd
ones, so a model that gives one answer to everything scores exactly 0.5 and cannot pass for
one that learned.

Robustness: the spec is `training.presets.learning_run_dict`, measured to learn on every seed
tried (``bench/bench_learning.py``; bench/README.md). Each case here is another seed *and*
another micro-batch split, which changes the order of floating-point reductions as another
machine's kernels would; a spec that learned only on one trajectory fails here.

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
from training.presets import learning_run_dict


def held_out(outcome):
    (first_step, before), (last_step, after) = outcome.eval_history[0], outcome.eval_history[-1]
    assert first_step == 0 and last_step == outcome.step
    return before, after


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "micro_batch_tokens"), [(0, 4096), (1, 512), (2, 1536)], ids=["s0", "s1", "s2"]
)
def test_grpo_raises_held_out_parity_on_every_seed_and_micro_batch_split(seed, micro_batch_tokens):
    data = learning_run_dict("parity", algorithm="grpo", seed=seed)
    data["batch"]["micro_batch_tokens"] = micro_batch_tokens
    sink = ListSink()
    learned = run(RunSpec.from_dict(data), sink, StaticControl())
    assert learned.status == "completed", learned.error
    before, after = held_out(learned)
    # The base answers at chance on the balanced set: it knows the format, not the skill.
    assert 0.3 <= before["eval/reward/mean"] <= 0.7, before
    rise = after["eval/reward/mean"] - before["eval/reward/mean"]
    standard_error = math.hypot(before["eval/reward/sem"], after["eval/reward/sem"])
    assert rise > max(3 * standard_error, 0.25), (before, after)
    assert "run.collapsed" not in sink.event_kinds()


@pytest.mark.slow
def test_lr_zero_leaves_the_weights_and_the_held_out_reward_unchanged():
    from transformers import AutoModelForCausalLM

    from training.loop import _parameter_digest
    from training.models import ensure_demo_model

    data = learning_run_dict("parity", steps=3)
    data["lr"] = 0.0
    frozen_sink = ListSink()
    frozen = run(RunSpec.from_dict(data), frozen_sink, StaticControl())
    assert frozen.status == "completed", frozen.error
    before, after = held_out(frozen)
    assert after["eval/reward/mean"] == before["eval/reward/mean"]
    assert frozen_sink.metrics_at(1)["actor/grad_norm"] > 0  # gradients flowed; lr 0 kept them out
    base = _parameter_digest(AutoModelForCausalLM.from_pretrained(ensure_demo_model()))
    assert dict(frozen_sink.events)["run.completed"]["parameter_digests"] == [base]
