"""Collapse becomes an event: a policy that stopped exploring while still wrong, or spread out
until every answer failed, is reported (``run.collapsed``), one that solved its tasks is not,
and one that comes back says so."""

from __future__ import annotations

import functools

import pytest

import training.loop
from tests.training.conftest import tiny_spec
from training.control import StaticControl
from training.loop import run
from training.metrics import CollapseDetector
from training.sink import ListSink
from training.spec import RunSpec


def step_metrics(entropy, flat, pass_rate):
    return {
        "actor/entropy": entropy,
        "frac_reward_zero_std": flat,
        "pass_rate": pass_rate,
        "reward/mean": pass_rate,
    }


def observe_all(detector, rows):
    return [detector.observe(step, step_metrics(*row)) for step, row in enumerate(rows, 1)]


def test_entropy_gone_flat_groups_and_half_wrong_for_three_steps_is_a_collapse():
    changes = observe_all(
        CollapseDetector(),
        [
            (0.13, 0.0, 0.5),
            (0.05, 0.5, 0.5),
            (0.01, 0.95, 0.5),
            (0.01, 1.0, 0.5),
            (0.007, 1.0, 0.5),
        ],
    )
    assert changes[:4] == [None, None, None, None]
    kind, payload = changes[4]
    assert kind == "run.collapsed"
    assert payload["step"] == 5 and payload["steps"] == 3
    assert payload["initial_entropy"] == 0.13 and payload["frac_reward_zero_std"] == 1.0


def test_entropy_blown_up_with_every_group_at_zero_is_a_collapse_too():
    """Parity seed 0 on the recipe-7 base with an entropy bonus: one update broke the answer
    format, then the bonus alone spread the policy (these are that run's figures)."""
    changes = observe_all(
        CollapseDetector(),
        [
            (0.126, 0.0, 0.5),
            (0.138, 0.25, 0.43),
            (0.268, 1.0, 0.06),
            (0.396, 1.0, 0.0),
            (0.655, 1.0, 0.0),
            (0.764, 1.0, 0.0),
        ],
    )
    assert changes[:5] == [None] * 5
    kind, payload = changes[5]
    assert kind == "run.collapsed"
    assert payload["cause"] == "entropy_rose" and payload["steps"] == 3
    low = observe_all(CollapseDetector(), [(0.13, 0.0, 0.5)] + [(0.005, 1.0, 0.5)] * 3)
    assert low[3][1]["cause"] == "entropy_fell"


def test_it_is_reported_once_and_its_recovery_is_reported_too():
    detector = CollapseDetector()
    rows = [(0.13, 0.0, 0.5)] + [(0.005, 1.0, 0.5)] * 6 + [(0.05, 0.4, 0.6)]
    kinds = [change[0] for change in observe_all(detector, rows) if change]
    assert kinds == ["run.collapsed", "run.collapse_recovered"]


@pytest.mark.parametrize(
    "rows",
    [
        # Solved: low entropy and flat groups, but every group passes.
        [(0.13, 0.0, 0.5)] + [(0.005, 1.0, 1.0)] * 5,
        # Flat groups at a healthy entropy: the prompts are too easy or too hard, not a collapse.
        [(0.13, 0.0, 0.5)] + [(0.12, 1.0, 0.5)] * 5,
        # Spreading out while the groups still differ: exploring, with a gradient to follow.
        [(0.13, 0.0, 0.5)] + [(0.6, 0.2, 0.5)] * 5,
        # Collapsing for two steps, then exploring again: shorter than the patience.
        [(0.13, 0.0, 0.5), (0.005, 1.0, 0.5), (0.005, 1.0, 0.5), (0.1, 0.3, 0.5)] * 2,
    ],
    ids=["solved", "flat-but-exploring", "spreading-with-signal", "brief"],
)
def test_what_is_not_a_collapse(rows):
    assert [c for c in observe_all(CollapseDetector(), rows) if c] == []


def test_the_run_loop_sends_the_event_to_the_sink(tiny_model_dir, tmp_path, monkeypatch):
    # Thresholds every step meets, so the tiny run "collapses" at its second step: this checks
    # the loop's wiring, the detector's judgement is checked above.
    lenient = functools.partial(
        CollapseDetector, entropy_share=1e9, flat_fraction=0.0, pass_rate_below=2.0, patience=2
    )
    monkeypatch.setattr(training.loop, "CollapseDetector", lenient)
    sink = ListSink()
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=3))
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    collapsed = [payload for kind, payload in sink.events if kind == "run.collapsed"]
    assert [p["step"] for p in collapsed] == [2]
