"""RL learns beyond parity: on json_format, GRPO and DAPO raise the held-out reward under the
domain's own rubric, each on another seed and micro-batch split.

Domain: ``json_format`` ("A basket holds 36 dates and 18 grapes. Reply with JSON giving left
and right."), scored by its rubric: well-formed JSON (0.1) and each field asked for, value
exact (``labelled_values``, 0.9). The warm-up's demonstrations have the right values under a
naming drawn at random, whatever the question asked for, so the base writes either naming and
scores about half of the fields' credit; writing the names the question asks for is what only
the rubric teaches. The held-out set has as many questions of each naming, so a base that
writes one naming everywhere scores exactly its chance level.

Why this and not the older designs: with one naming and a total scored by exact match, the only
thing left to learn was the total, an addition the base gets right 17 % of the time and cannot
learn in a few dozen steps. With the two namings and a total (recipe 6), the total was right
2 % of the time before and after RL, so a third of the fields' credit was out of reach: the
reachable rise was about 0.28, and on a machine whose base already named fields right more
often than chance a run that learned the naming rose 0.23 (bench/README.md, "Learning").

Margin: as ``test_learning.py``: rise > max(3 SE of the difference, 0.25), no ``run.collapsed``.
"""

from __future__ import annotations

import math

import pytest

from training import ListSink, RunSpec, StaticControl, run
from training.presets import learning_run_dict


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "seed", "micro_batch_tokens"),
    # Two cases (226 s and 137 s on the shared 2-core box at load average 3-4; 12 minutes at
    # 5-8): the seeds measured in bench/README.md ("Learning").
    [("grpo", 0, 4096), ("dapo", 1, 512)],
    ids=["grpo-s0", "dapo-s1"],
)
def test_rl_raises_held_out_json_format_on_seeds_and_micro_batch_splits(
    algorithm, seed, micro_batch_tokens
):
    data = learning_run_dict("json_format", algorithm=algorithm, seed=seed)
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
