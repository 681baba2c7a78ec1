"""The trajectory, defined once: its dict and JSON forms, its checks and its JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import numpy as np
import pytest

from tests.training.conftest import tiny_spec
from training.trajectory import Trajectory, trajectory_json_schema


def _tool_use_trajectory() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "What is 2**10?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "python", "arguments": '{"code": "print(2**10)"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "1024\n"},
            {"role": "assistant", "content": "\\boxed{1024}"},
        ],
        "prompt": "<|user|>\nWhat is 2**10?",
        "completion": "\\boxed{1024}",
        "observations": [
            {
                "tool": "python",
                "stdout": "1024\n",
                "stderr": "",
                "exit_code": 0,
                "timed_out": False,
                "wall_s": 0.12,
            }
        ],
        "reward": {"total": 1.0, "breakdown": {"correct": 1.0}, "details": {"correct": "1024"}},
        "finish_reason": "stop",
        "response_tokens": 17,
        "task_id": "pow-10",
        "discarded": None,
        "provenance": {
            "run": "tiny",
            "step": 1,
            "policy_version": 0,
            "domain": "arithmetic",
            "group": 0,
            "rubric_digest": "1:abc123",
            "rubric_version": 4,
            "sandbox_image": None,
        },
    }


def test_the_dict_form_is_what_the_loop_always_sent_and_json_round_trips_exactly():
    data = _tool_use_trajectory()
    trajectory = Trajectory.from_dict(data)
    assert trajectory.to_dict() == data
    assert Trajectory.from_json(trajectory.to_json()) == trajectory
    assert json.loads(trajectory.to_json()) == data
    jsonschema.validate(data, trajectory_json_schema())


def test_a_message_keeps_only_the_keys_it_carries():
    [user, *_] = Trajectory.from_dict(_tool_use_trajectory()).to_dict()["messages"]
    assert user == {"role": "user", "content": "What is 2**10?"}


def test_a_drifted_or_missing_key_is_refused():
    drifted = _tool_use_trajectory()
    drifted["provenance"]["tag"] = "nothing sends this"
    with pytest.raises(msgspec.ValidationError, match="tag"):
        Trajectory.from_dict(drifted)
    missing = _tool_use_trajectory()
    del missing["reward"]["breakdown"]
    with pytest.raises(msgspec.ValidationError, match="breakdown"):
        Trajectory.from_dict(missing)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(drifted, trajectory_json_schema())


def test_a_discard_reason_is_one_the_loop_knows_and_may_be_left_out():
    older = _tool_use_trajectory()
    del older["discarded"]  # what a loop sent before it reported discarded samples
    assert Trajectory.from_dict(older).discarded is None
    dropped = {**_tool_use_trajectory(), "discarded": "zero_variance"}
    assert Trajectory.from_dict(dropped).to_dict() == dropped
    jsonschema.validate(dropped, trajectory_json_schema())
    with pytest.raises(msgspec.ValidationError, match="discarded"):
        Trajectory.from_dict({**dropped, "discarded": "bored"})


def test_numpy_values_in_rubric_details_are_reported_as_plain_numbers():
    data = _tool_use_trajectory()
    data["reward"]["details"] = {"scores": np.array([0.5, 1.0])}
    reported = Trajectory.from_dict(data).to_dict()
    assert reported["reward"]["details"] == {"scores": [0.5, 1.0]}
    json.dumps(reported)


def test_trajectories_from_a_tiny_run_validate_against_the_schema(tiny_model_dir, tmp_path):
    from training import ListSink, RunSpec, StaticControl, run

    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=1))
    sink = ListSink()
    assert run(spec, sink, StaticControl()).status == "completed"
    assert sink.trajectory_items
    schema = trajectory_json_schema()
    for item in sink.trajectory_items:
        jsonschema.validate(item, schema)
        assert Trajectory.from_json(json.dumps(item)).to_dict() == item


def test_a_tasks_message_with_content_parts_is_reported_as_is():
    data = _tool_use_trajectory()
    data["messages"][0] = {"role": "user", "content": [{"type": "text", "text": "2**10?"}]}
    assert Trajectory.from_dict(data).to_dict() == data
    jsonschema.validate(data, trajectory_json_schema())


def test_the_schema_is_published_by_the_package_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, training; training.trajectory_json_schema(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
