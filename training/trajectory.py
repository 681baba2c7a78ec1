"""The trajectory: what a run reports for each sample it scored, defined once.

`training.loop` builds a `Trajectory` per sample and hands sinks its plain-dict form
(`Trajectory.to_dict`), so `Sink.trajectories(items)` keeps receiving JSON-able dicts. The
JSON form (`to_json` / `from_json`) round-trips exactly, and `trajectory_json_schema` publishes
the same structure as JSON Schema (for the console's OpenAPI).

No torch or DeepSpeed here: the console imports this module.

Not to be confused with `training.agent.Episode`, the in-memory multi-turn episode (engine
outputs, token ids) that the loop turns into a trajectory once it is scored.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "FunctionCall",
    "Message",
    "Observation",
    "Provenance",
    "Reward",
    "DISCARD_REASONS",
    "ToolCall",
    "Trajectory",
    "trajectory_json_schema",
]


# Why a step did not train on a sample it generated (the sample is still reported):
# "zero_variance": its group's rewards were all equal and the algorithm drops such groups
# (``filter_zero_variance_groups``, DAPO), or dynamic sampling passed over it for that reason;
# "batch_full": dynamic sampling (``batch.max_generation_rounds`` > 1) drew it, but the batch
# already held enough groups with varied rewards.
DISCARD_REASONS = ("zero_variance", "batch_full")


class FunctionCall(msgspec.Struct, frozen=True):
    name: str
    arguments: str  # JSON text, as in OpenAI's chat format


class ToolCall(msgspec.Struct, frozen=True):
    """An assistant's call of a tool, OpenAI-style."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Message(msgspec.Struct, frozen=True):
    """One OpenAI-style chat message. Keys that a message does not carry are left out of its
    dict and JSON forms (UNSET), so a user message stays ``{"role", "content"}``. Other keys a
    task's messages may hold are not reported."""

    role: Literal["system", "user", "assistant", "tool"]
    # A task's own messages may carry content parts (a list), as the console's task sets allow.
    content: str | list[Any] | None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET


class Observation(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one tool call gave back."""

    tool: str
    stdout: str
    stderr: str
    exit_code: int | None  # None when the process did not exit on its own (killed, timed out)
    timed_out: bool
    wall_s: float


class Reward(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The rubric's verdict: ``breakdown`` is per criterion, ``details`` is the rubric's own."""

    total: float
    breakdown: dict[str, float]
    details: dict[str, Any]


class Provenance(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a sample came from.

    ``step`` counts steps completed including the one that produced the sample (1 for the
    first); ``policy_version`` is the weights version that sampled it (0 = the base model);
    ``group`` is the prompt's index within the step (a GRPO group); ``rubric_digest`` is
    ``"<spec version>:<sha256 prefix of the canonical spec>"`` (what the rubric was, whoever
    ran it); ``rubric_version`` is the console registry's version number of that rubric
    (`training.spec.DomainSpec.rubric_version`; None for a run not started from the registry).
    """

    run: str
    step: int
    policy_version: int
    domain: str
    group: int
    rubric_digest: str
    rubric_version: int | None
    sandbox_image: str | None


class Trajectory(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One scored sample, as a run reports it.

    ``messages`` is the OpenAI-style chat (without tools: the user turn and the answer);
    ``prompt`` the text given to the engine; ``completion`` the final response text;
    ``observations`` one per tool call (empty without tools); ``task_id`` is the task's
    ``metadata.task_id`` (the console puts its registry task id there), or None;
    ``discarded`` is why the step did not train on the sample (`DISCARD_REASONS`), None when
    it did (a group-relative estimator still trains on a zero-variance group, at advantage 0,
    unless the algorithm drops such groups).
    """

    messages: list[Message]
    prompt: str
    completion: str
    observations: list[Observation]
    reward: Reward
    finish_reason: Literal["stop", "length"]
    response_tokens: int
    task_id: str | int | None
    provenance: Provenance
    discarded: Literal["zero_variance", "batch_full"] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plain-dict form sinks receive (what ``json.loads(to_json())`` gives)."""
        result: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_builtin)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Checks ``data`` against the structure; raises `msgspec.ValidationError`."""
        return msgspec.convert(data, cls, strict=True)

    def to_json(self) -> bytes:
        return msgspec.json.encode(self, enc_hook=_builtin)

    @classmethod
    def from_json(cls, data: bytes | str) -> Trajectory:
        return msgspec.json.decode(data, type=cls)


def _builtin(value: Any) -> Any:
    """Rubric ``details`` may hold numpy values; they are reported as plain numbers/lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise NotImplementedError(f"cannot report a {type(value).__name__} in a trajectory")


def trajectory_json_schema() -> dict[str, Any]:
    """JSON Schema of a trajectory's JSON form, derived from `Trajectory` (``$defs`` holds the
    nested structures)."""
    schema: dict[str, Any] = msgspec.json.schema(Trajectory)
    return schema
