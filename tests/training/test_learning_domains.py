"""RL learns beyond parity: on json_format and code, GRPO and DAPO raise the held-out reward
under each domain's own rubric, each case on another seed and micro-batch split.

``json_format`` ("A basket holds 36 dates and 18 grapes. Reply with JSON giving left and
right."), scored by its rubric: well-formed JSON (0.1) and each field asked for, value exact
(``labelled_values``, 0.9). The warm-up's demonstrations have the right values under a naming
drawn at random, whatever the question asked for, so the base writes either naming and scores
about half of the fields' credit; writing the names the question asks for is what only the
rubric teaches.

``code`` ("Write a Python function f(x) that returns x times 7."), scored by the fraction of
five unit tests the function passes, run in a sandbox. The warm-up's demonstrations have the
constant asked for and an operator drawn at random, so the base writes well-formed functions
with any of the three operators (held-out 0.33); reading the operator word is what only the
tests teach.

Each held-out set has as many questions of each naming or operator, so a base that answers the
same way everywhere scores exactly its chance level.

Why these and not the older designs: with one naming and a total scored by exact match, the only
thing left to learn was the total, an addition the base gets right 17 % of the time and cannot
learn in a few dozen steps; code as first built (two operators, demonstrated right) was solved
by the base, and with every other shape or size of task the base never sampled a right answer
(bench/README.md, "Learning").

Margin: as ``test_learning.py``: rise > max(3 SE of the difference, 0.25), no ``run.collapsed``.
"""

from __future__ import annotations

import math

import pytest

from training import ListSink, RunSpec, StaticControl, run
from training.presets import learning_run_dict


@pytest.mark.slow
@pytest.mark.parametrize(
    ("domain", "algorithm", "seed", "micro_batch_tokens"),
    # Cases measured in bench/README.md ("Learning"): json_format 226 s and 137 s on the shared
    # 2-core box at load average 3-4 (12 minutes at 5-8); code DAPO seed 2, 246 s at load 8
    # (0.33 -> 0.63 at step 32, 1.00 from step 48).
    [
        ("json_format", "grpo", 0, 4096),
        ("json_format", "dapo", 1, 512),
        ("code", "dapo", 2, 4096),
    ],
    ids=["json_format-grpo-s0", "json_format-dapo-s1", "code-dapo-s2"],
)
def test_rl_raises_held_out_reward_on_seeds_and_micro_batch_splits(
    domain, algorithm, seed, micro_batch_tokens
):
    data = learning_run_dict(domain, algorithm=algorithm, seed=seed)
    data["batch"]["micro_batch_tokens"] = micro_batch_tokens
    sink = ListSink()
    learned = run(RunSpec.from_dict(data), sink, StaticControl())
    assert learned.status == "completed", learned.error
    (first_step, before), (last_step, after) = learned.eval_history[0], learned.eval_history[-1]
    assert first_step == 0 and last_step == learned.step
    rise = after["eval/reward/mean"] - before["eval/reward/mean"]
    standard_error = math.hypot(before["eval/reward/sem"], after["eval/reward/sem"])
    assert rise > max(3 * standard_error, 0.25), (before, after)
    assert "run.collapsed" not in sink.event_kinds()
