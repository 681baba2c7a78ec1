"""Checkpoints on disk: a re-save never leaves a moment without a complete checkpoint, pruning
never removes what was just written, a resumed run's timeline wins over an abandoned one, and a
checkpoint refuses a different world size by name."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import tiny_spec
from training.checkpoint import find_latest, list_checkpoints, load_checkpoint, save_checkpoint
from training.control import StaticControl
from training.loop import run
from training.sink import ListSink
from training.spec import RunSpec
from training.trainer import Trainer


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return Trainer(tiny_model_dir, {"zero_optimization": {"stage": 1}}, 1e-3)


def names(root):
    return [p.name for p in list_checkpoints(root)]


def test_a_save_that_dies_while_replacing_a_step_leaves_the_old_one_whole(
    trainer, tmp_path, monkeypatch
):
    save_checkpoint(trainer, tmp_path, 4, {"step": 4}, keep_last=1)

    def dies(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(trainer, "save_pretrained", dies)
    with pytest.raises(OSError):
        save_checkpoint(trainer, tmp_path, 4, {"step": 4}, keep_last=1)
    monkeypatch.undo()
    assert find_latest(tmp_path) == tmp_path / "step_00000004"
    assert load_checkpoint(trainer, tmp_path / "step_00000004")["step"] == 4
    # the next save clears the dead one's staging directory and replaces the step
    path = save_checkpoint(trainer, tmp_path, 4, {"step": 4, "again": True}, keep_last=1)
    assert names(tmp_path) == ["step_00000004"]
    assert json.loads((path / "run_state.json").read_text())["again"] is True
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.replaced"))


def test_pruning_keeps_the_newest_and_never_what_was_just_written(trainer, tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(trainer, tmp_path, step, {"step": step}, keep_last=2)
    assert names(tmp_path) == ["step_00000002", "step_00000003"]
    # a run resumed from step 2 saves step 3 again, then 4: its own timeline stays
    root = tmp_path / "timelines"
    for step in (2, 5):
        save_checkpoint(trainer, root, step, {"step": step}, keep_last=1)
    path = save_checkpoint(trainer, root, 3, {"step": 3}, keep_last=1)
    assert path.is_dir() and names(root) == ["step_00000003"]
    assert find_latest(root) == path


def test_a_save_that_does_not_prune_leaves_every_checkpoint_to_its_caller(trainer, tmp_path):
    # The console's jobs (`prune: false`): what goes is decided by what its database accepted.
    for step in (2, 6, 4):
        save_checkpoint(trainer, tmp_path, step, {"step": step}, keep_last=None)
    assert names(tmp_path) == ["step_00000002", "step_00000004", "step_00000006"]


def test_a_checkpoint_from_another_world_size_is_refused_by_name(trainer, tmp_path):
    path = save_checkpoint(trainer, tmp_path, 2, {"step": 2}, keep_last=1)
    state_file = path / "run_state.json"
    state = json.loads(state_file.read_text())
    assert state["world_size"] == 1
    state_file.write_text(json.dumps({**state, "world_size": 2}))
    with pytest.raises(ValueError, match="written by 2 rank.* this run has 1"):
        load_checkpoint(trainer, path)


def test_a_resumed_run_stopped_before_its_next_save_reports_the_checkpoint_it_holds(
    tiny_model_dir, tmp_path
):
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=3))
    first = run(spec, ListSink(), StaticControl(preempt_at=1))
    assert first.status == "preempted" and first.checkpoint
    again = run(spec, ListSink(), StaticControl(cancel_at=1))
    assert again.status == "cancelled" and again.checkpoint == first.checkpoint
