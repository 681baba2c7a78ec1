"""The task: one shape for every layer that reads tasks, and the split names.

A task is one JSON object::

    {"prompt": "...",                                   # the text given to the engine, or
     "messages": [{"role": "user", "content": "..."}],  # OpenAI-style chat (prompt or messages)
     "ground_truth": ...,                               # required (null allowed): what rubrics
                                                        # compare against
     "metadata": {...},                                 # optional; see below
     "split": "train" | "held_out"}                     # optional; which split it belongs to

``metadata`` keys the loop reads: ``task_id`` (the trajectory's ``task_id``: the console puts
its registry task id here), ``question`` (the user turn shown in a trajectory), ``tools`` (tool
names, with ``tools.enabled``), ``max_new_tokens`` (a per-task budget, capped by the run's).

`task_problem` is the one validator: the run spec (``tasks``/``eval_tasks``), JSONL task
sources and the console's task-set upload all call it, so a task one layer accepts every layer
accepts. msgspec checks the shape in C (a 100,000-line upload costs well under a second).

A task with only ``messages`` is rendered into the engine's prompt text by the model's chat
template (`engine_prompt`, ``add_generation_prompt=True``), as the demo tasks' prompts are.

Splits: ``train`` (what the run trains on) and ``held_out`` (what it evaluates on): `SPLITS`.
No torch and no Django here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "HELD_OUT",
    "SPLITS",
    "TASK_KEYS",
    "TRAIN",
    "Split",
    "TaskError",
    "engine_prompt",
    "task_problem",
    "validate_task",
    "with_engine_prompt",
]

Split = Literal["train", "held_out"]
SPLITS: tuple[str, ...] = get_args(Split)
TRAIN, HELD_OUT = "train", "held_out"
TASK_KEYS = ("prompt", "messages", "ground_truth", "metadata", "split")


class _Message(msgspec.Struct):
    # Other OpenAI message fields (name, tool_calls, tool_call_id, ...) pass through unchecked.
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None | list[Any]


class _Task(msgspec.Struct, forbid_unknown_fields=True):
    ground_truth: Any
    prompt: Annotated[str, msgspec.Meta(min_length=1)] | UnsetType = UNSET
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)] | UnsetType = UNSET
    metadata: dict[str, Any] = {}
    split: Split | UnsetType = UNSET


class TaskError(ValueError):
    """A task that does not have the task shape; the message says what is wrong and where."""


def _describe(error: msgspec.ValidationError) -> str:
    """msgspec's message with its `$.a.b` location turned into the `a.b: ...` form."""
    text = str(error)
    message, _, where = text.partition(" - at `$")
    path = where.rstrip("`").lstrip(".")
    if message.startswith("Object contains unknown field"):
        name = message.removeprefix("Object contains unknown field ").strip("`")
        message = f"unknown field '{name}'; allowed fields: {', '.join(TASK_KEYS)}"
    elif message.startswith("Object missing required field"):
        name = message.removeprefix("Object missing required field ").strip("`")
        message = f"missing required field '{name}'"
    elif message == "Expected `object`, got `array`" and not path:
        message = "each line must be a JSON object, got an array"
    elif message.startswith("Expected `object`, got") and not path:
        message = "each line must be a JSON object" + message.removeprefix("Expected `object`")
    return f"{path}: {message}" if path else message


def task_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a task (``"messages[0]: missing required field 'role'"``),
    or None for a task. msgspec stops at a task's first problem: one line per task."""
    try:
        msgspec.convert(value, _Task)
    except msgspec.ValidationError as exc:
        return _describe(exc)
    if "prompt" not in value and "messages" not in value:
        return 'needs a "prompt" (text) or "messages" (a list of chat messages)'
    return None


def validate_task(value: Any) -> dict[str, Any]:
    """``value`` if it is a task; raises `TaskError` saying what is wrong otherwise."""
    problem = task_problem(value)
    if problem is not None:
        raise TaskError(problem)
    return value  # type: ignore[no-any-return]


def engine_prompt(messages: Sequence[Mapping[str, Any]], tokenizer: Any) -> str:
    """The prompt text for a chat: the tokenizer's chat template with the assistant's cue."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TaskError(
            "a task with only 'messages' needs a model whose tokenizer has a chat template"
        )
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
    )
    return str(text)


def with_engine_prompt(task: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The task with its ``prompt``: as given, or rendered from its ``messages``."""
    if isinstance(task.get("prompt"), str) and task["prompt"]:
        return task
    return {**task, "prompt": engine_prompt(task["messages"], tokenizer)}
