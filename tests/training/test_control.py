"""Control: static decisions, a live-edited control file, signals turned into preemption."""

from __future__ import annotations

import os
import signal

import pytest

from training.control import FileControl, Overrides, SignalControl, StaticControl


def test_static_control_preempts_from_its_step_and_hands_overrides_once():
    control = StaticControl(preempt_at=3, overrides_at={2: {"kl_coef": 0.1}})
    assert not control.poll(1).preempt
    assert control.poll(2).overrides.kl_coef == 0.1
    assert control.poll(3).preempt
    assert control.poll(4).overrides.is_empty()


def test_overrides_are_validated():
    with pytest.raises(ValueError, match="domain_weights.a"):
        Overrides.from_dict({"domain_weights": {"a": -1}})
    with pytest.raises(ValueError, match="unknown override"):
        Overrides.from_dict({"learning_rate": 1})
    assert Overrides.from_dict({"temperature": 0.5}).to_dict() == {"temperature": 0.5}


def test_file_control_follows_edits_and_survives_a_broken_file(tmp_path):
    path = tmp_path / "control.json"
    control = FileControl(path)
    assert control.poll(0) == control.poll(0)  # no file: carry on
    path.write_text('{"overrides": {"domain_weights": {"a": 2}}}')
    assert control.poll(1).overrides.domain_weights == {"a": 2.0}
    assert control.poll(2).overrides.is_empty()  # handed out once per change
    path.write_text('{"preempt": tru')
    decision = control.poll(3)
    assert not decision.preempt and control.last_error
    path.write_text('{"preempt": true}')
    assert control.poll(4).preempt and control.last_error is None
    assert control.poll(5).preempt  # stays requested


def test_sigterm_becomes_a_preempt_request():
    control = SignalControl(StaticControl())
    try:
        assert not control.poll(0).preempt
        os.kill(os.getpid(), signal.SIGTERM)
        decision = control.poll(1)
        assert decision.preempt and decision.reason == "signal SIGTERM"
    finally:
        control.restore()
