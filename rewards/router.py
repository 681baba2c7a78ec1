"""Routing samples to their domain's rubric, as verl routes by ``data_source``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rewards.rubric import Rubric
from rewards.types import RewardResult, Sample


class RubricRouter:
    """Scores each sample with the rubric of its ``domain`` (or ``default``).

    ``score_batch`` groups the samples by domain, scores each group with its rubric's own
    bounded pool, and returns the results in the input order. A domain with no rubric and
    no default is an error naming the domain, raised before anything is scored.
    """

    def __init__(self, rubrics: Mapping[str, Rubric], default: Rubric | None = None) -> None:
        self.rubrics = dict(rubrics)
        self.default = default

    @classmethod
    def from_specs(
        cls,
        specs: Mapping[str, dict[str, Any]],
        default: dict[str, Any] | None = None,
        *,
        resources: dict[str, Any] | None = None,
    ) -> RubricRouter:
        built: dict[str, Rubric] = {}
        try:
            for domain, spec in specs.items():
                built[domain] = Rubric.from_spec(spec, resources=resources)
            fallback = Rubric.from_spec(default, resources=resources) if default else None
        except Exception:
            for rubric in built.values():
                rubric.close()
            raise
        return cls(built, fallback)

    def rubric_for(self, domain: str) -> Rubric:
        rubric = self.rubrics.get(domain, self.default)
        if rubric is None:
            known = ", ".join(sorted(self.rubrics)) or "none"
            raise KeyError(f"no rubric for domain {domain!r} (rubrics: {known})")
        return rubric

    def score(self, sample: Sample | dict[str, Any]) -> RewardResult:
        if not isinstance(sample, Sample):
            sample = Sample.from_dict(sample)
        return self.rubric_for(sample.domain).score(sample)

    def score_batch(
        self, samples: Iterable[Sample | dict[str, Any]], max_workers: int | None = None
    ) -> list[RewardResult]:
        batch = [s if isinstance(s, Sample) else Sample.from_dict(s) for s in samples]
        groups: dict[int, tuple[Rubric, list[int]]] = {}
        for index, sample in enumerate(batch):
            rubric = self.rubric_for(sample.domain)
            groups.setdefault(id(rubric), (rubric, []))[1].append(index)
        results: list[RewardResult | None] = [None] * len(batch)
        for rubric, indexes in groups.values():
            scored = rubric.score_batch([batch[i] for i in indexes], max_workers=max_workers)
            for index, result in zip(indexes, scored, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    def close(self) -> None:
        for rubric in {id(r): r for r in [*self.rubrics.values(), self.default] if r}.values():
            rubric.close()

    def __enter__(self) -> RubricRouter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
