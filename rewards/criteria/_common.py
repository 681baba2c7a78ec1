"""Helpers the criteria share: where the expected answer comes from, and schema fragments."""

from __future__ import annotations

from typing import Any

from rewards.types import CriterionError, Sample

EXPECTED_SCHEMA: dict[str, Any] = {
    "description": "the expected answer; defaults to the sample's ground_truth",
}


def expected_value(params: dict[str, Any], sample: Sample, key: str = "expected") -> Any:
    """``params[key]`` when the rubric fixes it, else the sample's ground truth."""
    if key in params:
        return params[key]
    truth = sample.ground_truth
    if isinstance(truth, dict) and key in truth:
        return truth[key]
    if truth is None:
        raise CriterionError("no expected answer: the sample has no ground_truth")
    return truth


def as_choices(value: Any) -> list[str]:
    """An expected answer as a list of acceptable strings."""
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]
