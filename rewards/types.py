"""The plain values that flow through a rubric: samples in, results out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

_SAMPLE_FIELDS = ("domain", "prompt", "messages", "completion", "ground_truth", "metadata")


@dataclass
class Sample:
    """One thing to score: what the model was asked and what it answered.

    ``completion`` is the model's answer as text; a chat trajectory may instead give
    ``messages`` (OpenAI-style dicts), whose last assistant message is then the answer.
    ``metadata`` carries whatever else a criterion needs (a live sandbox for terminal tasks,
    dataset columns for user functions, a token count for efficiency criteria).
    """

    domain: str
    prompt: Any
    messages: list[dict[str, Any]] | None = None
    completion: str | None = None
    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def response(self) -> str:
        """The text being scored: ``completion``, or the last assistant message's text."""
        if self.completion is not None:
            return self.completion
        for message in reversed(self.messages or []):
            if message.get("role") == "assistant":
                return message_text(message)
        return ""

    @property
    def prompt_text(self) -> str:
        """The prompt as text (chat prompts are joined message contents)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if isinstance(self.prompt, list):
            return "\n".join(message_text(m) for m in self.prompt if isinstance(m, dict))
        return "" if self.prompt is None else str(self.prompt)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Builds a sample from a JSON object; unknown keys are an error naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"a sample must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_SAMPLE_FIELDS))
        if unknown:
            raise ValueError(
                f"unknown sample field(s) {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(_SAMPLE_FIELDS)} (put extra columns under 'metadata')"
            )
        if "prompt" not in data:
            raise ValueError("a sample needs a 'prompt'")
        if data.get("completion") is None and data.get("messages") is None:
            raise ValueError("a sample needs a 'completion' or 'messages'")
        if data.get("completion") is not None and not isinstance(data["completion"], str):
            raise ValueError("'completion' must be a string")
        if data.get("messages") is not None and not isinstance(data["messages"], list):
            raise ValueError("'messages' must be a list of chat messages")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' must be an object")
        return cls(
            domain=str(data.get("domain") or "default"),
            prompt=data["prompt"],
            messages=data.get("messages"),
            completion=data.get("completion"),
            ground_truth=data.get("ground_truth"),
            metadata=dict(metadata),
        )


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of typed parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


@dataclass(frozen=True)
class RewardResult:
    """A rubric's verdict on one sample.

    ``total`` is the aggregated, clipped reward; ``breakdown`` maps each criterion's name to
    its own score; ``details`` maps each criterion's name to what it found (per-test results,
    extracted answers, the reason for a zero) and ``"_aggregate"`` to how the total was formed.
    """

    total: float
    breakdown: dict[str, float]
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "breakdown": dict(self.breakdown), "details": self.details}


@dataclass(frozen=True)
class Outcome:
    """What one criterion returns: a score and the evidence for it."""

    score: float
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.score, int | float) or isinstance(self.score, bool):
            raise TypeError(f"a criterion score must be a number, got {self.score!r}")
        if math.isnan(self.score) or math.isinf(self.score):
            raise ValueError(f"a criterion score must be finite, got {self.score!r}")


class CriterionError(Exception):
    """A criterion could not judge this sample; it scores 0 and the message is kept."""
