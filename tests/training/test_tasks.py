"""The task shape (training.tasks): one validator, the split names, messages-only tasks."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import tiny_spec
from training.demo.chat import user_prompt
from training.demo.domains import get_domain
from training.spec import RunSpec, SpecError
from training.tasks import (
    HELD_OUT,
    SPLITS,
    TaskError,
    task_problem,
    validate_task,
    with_engine_prompt,
)

MESSAGES_ONLY = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "ground_truth": "5"}


def test_prompt_and_messages_only_tasks_are_tasks_and_bad_ones_say_where():
    assert task_problem({"prompt": "p", "ground_truth": None}) is None
    assert task_problem({**MESSAGES_ONLY, "split": "held_out", "metadata": {"task_id": 7}}) is None
    assert task_problem({"prompt": "p"}) == "missing required field 'ground_truth'"
    assert task_problem({"ground_truth": 1}) == (
        'needs a "prompt" (text) or "messages" (a list of chat messages)'
    )
    assert task_problem({"messages": [{"content": "x"}], "ground_truth": 1}) == (
        "messages[0]: missing required field 'role'"
    )
    assert task_problem({"prompt": "p", "ground_truth": 1, "split": "test"}) == (
        "split: Invalid enum value 'test'"
    )
    with pytest.raises(TaskError, match="unknown field 'x'"):
        validate_task({"prompt": "p", "ground_truth": 1, "x": 1})
    assert SPLITS == ("train", "held_out")


def test_the_run_spec_checks_its_tasks_with_the_same_validator():
    domain = {
        "name": "a",
        "rubric_spec": {"version": 1, "criteria": [{"name": "c", "kind": "exact_match"}]},
    }
    spec = {"base_model": "demo", "domains": [{**domain, "tasks": [MESSAGES_ONLY]}]}
    assert RunSpec.from_dict(spec).domains[0].tasks == [MESSAGES_ONLY]
    spec["domains"][0]["tasks"] = [
        MESSAGES_ONLY,
        {"messages": [{"content": "x"}], "ground_truth": 1},
        {"prompt": "p"},
    ]
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict(spec)
    assert caught.value.errors == [
        "domains[0].tasks[1].messages[0]: missing required field 'role'",
        "domains[0].tasks[2]: missing required field 'ground_truth'",
    ]


def test_the_demo_held_out_split_is_called_held_out_and_never_shares_a_task():
    domain = get_domain("arithmetic")
    train = {t["metadata"]["task_id"] for t in domain.make_tasks(50, seed=0, split="train")}
    held = {t["metadata"]["task_id"] for t in domain.make_tasks(50, seed=0, split=HELD_OUT)}
    assert train and held and not train & held
    with pytest.raises(ValueError, match="split must be one of"):
        domain.make_tasks(1, seed=0, split="test")


def test_a_messages_only_task_is_rendered_by_the_chat_template_like_a_demo_prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = with_engine_prompt(dict(MESSAGES_ONLY), tokenizer)
    assert task["prompt"] == user_prompt("What is 2 + 3?")
    given = {"prompt": "as given", "ground_truth": 1}
    assert with_engine_prompt(given, tokenizer) is given


def test_a_run_trains_on_messages_only_tasks(tiny_model_dir, tmp_path):
    from training import ListSink, StaticControl, run

    arithmetic = get_domain("arithmetic").make_tasks(8, seed=0, split="train")
    tasks = [
        {
            "messages": [{"role": "user", "content": t["metadata"]["question"]}],
            "ground_truth": t["ground_truth"],
            "metadata": {"task_id": f"registry-{i}"},
        }
        for i, t in enumerate(arithmetic)
    ]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps({**t, "split": "train"}) + "\n" for t in tasks))
    data = tiny_spec(tiny_model_dir, tmp_path, max_steps=1)
    data["domains"][0]["tasks"] = tasks
    data["domains"][0].pop("eval_tasks")
    data["domains"][1].pop("tasks")
    data["domains"][1]["task_source"] = {"kind": "jsonl", "path": str(jsonl)}
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert outcome.step == 1 and "actor/pg_loss" in sink.metrics_at(1)
    assert sink.trajectory_items
    for trajectory in sink.trajectory_items:
        assert trajectory["task_id"].startswith("registry-")
        question = trajectory["messages"][0]
        assert question["role"] == "user" and trajectory["prompt"] == user_prompt(
            question["content"]
        )
        assert trajectory["messages"][-1]["role"] == "assistant"
