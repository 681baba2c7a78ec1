"""Helpers for the rewards tests: build one-criterion rubrics and score text with them."""

from __future__ import annotations

from typing import Any

import pytest

from rewards import Rubric, Sample


def one_criterion(kind: str, params: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    criterion = {"name": "c", "kind": kind, "weight": 1, "params": params or {}, **extra}
    return {"version": 1, "criteria": [criterion]}


def sample(completion: str, ground_truth: Any = None, **fields: Any) -> Sample:
    return Sample(
        domain=fields.pop("domain", "test"),
        prompt=fields.pop("prompt", "the task"),
        completion=completion,
        ground_truth=ground_truth,
        **fields,
    )


class Scorer:
    """``scorer(kind, params)(completion, ground_truth)`` → (score, details)."""

    def __init__(self, kind: str, params: dict[str, Any] | None = None, **extra: Any) -> None:
        self.rubric = Rubric.from_spec(one_criterion(kind, params, **extra))

    def __call__(self, completion: str, ground_truth: Any = None, **fields: Any):
        result = self.rubric.score(sample(completion, ground_truth, **fields))
        return result.breakdown["c"], result.details["c"]


@pytest.fixture
def scorer():
    made: list[Scorer] = []

    def make(kind: str, params: dict[str, Any] | None = None, **extra: Any) -> Scorer:
        made.append(Scorer(kind, params, **extra))
        return made[-1]

    yield make
    for item in made:
        item.rubric.close()
