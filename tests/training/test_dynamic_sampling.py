"""DAPO's dynamic sampling: a step keeps drawing prompts until enough groups carry signal
(rewards that differ), trains on those alone, and says when the rounds ran out."""

from __future__ import annotations

import pytest

from tests.training.conftest import tiny_spec
from training import ListSink, RunSpec, StaticControl, run
from training.presets import learning_run_dict


def test_rounds_run_out_when_no_group_has_signal_and_the_step_says_so(tiny_model_dir, tmp_path):
    # Greedy sampling gives every sample of a group the same answer: every group is flat, so
    # every round is used.
    data = tiny_spec(tiny_model_dir, tmp_path, max_steps=2)
    data["sampling"]["temperature"] = 0.0
    data["algorithm"] = {"algorithm": "dapo"}
    data["batch"]["max_generation_rounds"] = 3
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    for step in (1, 2):
        metrics = sink.metrics_at(step)
        assert metrics["batch/generation_rounds"] == 3
        assert metrics["batch/varied_groups"] == 0
    short = [p for kind, p in sink.events if kind == "batch.short"]
    assert [p["step"] for p in short] == [1, 2] and short[0]["wanted"] == 4
    # Every generated sample is still a trajectory: 3 rounds x 4 prompts x 2 samples a step,
    # each saying why the step did not train on it.
    assert len(sink.trajectory_items) == 2 * 3 * 4 * 2
    assert {t["discarded"] for t in sink.trajectory_items} == {"zero_variance"}
    assert sink.metrics_at(1)["batch/discarded_fraction"] == 1.0


def test_without_dynamic_sampling_dapo_reports_the_flat_groups_it_drops(tiny_model_dir, tmp_path):
    data = tiny_spec(tiny_model_dir, tmp_path, max_steps=1)
    data["sampling"]["temperature"] = 0.0  # every group flat
    data["algorithm"] = {"algorithm": "dapo"}
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert len(sink.trajectory_items) == 4 * 2
    assert {t["discarded"] for t in sink.trajectory_items} == {"zero_variance"}
    assert sink.metrics_at(1)["batch/discarded_fraction"] == 1.0


def test_grpo_trains_on_flat_groups_so_nothing_is_discarded(tiny_model_dir, tmp_path):
    # GRPO keeps a flat group (its advantages are 0): not a discarded sample.
    data = tiny_spec(tiny_model_dir, tmp_path, max_steps=1)
    data["sampling"]["temperature"] = 0.0
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert {t["discarded"] for t in sink.trajectory_items} == {None}
    assert sink.metrics_at(1)["batch/discarded_fraction"] == 0.0


@pytest.mark.slow
def test_more_prompts_are_drawn_until_the_batch_is_full_of_varied_groups():
    # Groups of two on parity at chance are flat half the time, so one round of 8 prompts
    # seldom holds 8 varied groups; the rounds fill the batch, and only varied groups train.
    data = learning_run_dict("parity", algorithm="dapo", steps=4)
    data["batch"].update(prompts_per_step=8, group_size=2, max_generation_rounds=6)
    data["eval"]["every_steps"] = 0
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    rounds = [sink.metrics_at(step)["batch/generation_rounds"] for step in range(1, 5)]
    assert sum(rounds) > 4, rounds  # one round for all four steps: (1/2^8)^4 by chance
    for step in range(1, 5):
        metrics = sink.metrics_at(step)
        if metrics["batch/varied_groups"] >= 8:
            assert metrics["batch/kept_fraction"] == 1.0  # nothing flat reached the update
    assert len(sink.trajectory_items) == sum(rounds) * 8 * 2
    # What was not trained on is reported with its reason: flat groups as zero_variance,
    # varied groups beyond the 8 the batch holds as batch_full; 8 groups a step trained.
    for step in range(1, 5):
        groups: dict[int, list[dict]] = {}
        for item in sink.trajectory_items:
            if item["provenance"]["step"] == step:
                groups.setdefault(item["provenance"]["group"], []).append(item)
        reasons = {g: {t["discarded"] for t in items} for g, items in groups.items()}
        assert all(len(r) == 1 for r in reasons.values()), reasons
        for g, items in groups.items():
            flat = len({t["reward"]["total"] for t in items}) == 1
            if flat:
                assert reasons[g] == {"zero_variance"}
            else:
                assert reasons[g] in ({None}, {"batch_full"})
        trained = [g for g, r in reasons.items() if r == {None}]
        varied = sink.metrics_at(step)["batch/varied_groups"]
        assert len(trained) == min(varied, 8)
        discarded = sum(len(groups[g]) for g in groups if g not in trained)
        assert sink.metrics_at(step)["batch/discarded_fraction"] == discarded / (len(groups) * 2)


def test_the_spec_refuses_zero_rounds():
    from training.spec import SpecError

    data = learning_run_dict("parity")
    data["batch"]["max_generation_rounds"] = 0
    with pytest.raises(SpecError, match="batch.max_generation_rounds"):
        RunSpec.from_dict(data)
