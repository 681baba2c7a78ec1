"""Registry objects for tests, built through the real services (so every test object passed the
same checks and audit path a user's would). Imported by the other test_registry_* modules."""

from __future__ import annotations

import json
from typing import Any

from console.registry import services
from console.registry.models import Domain, Rubric, SandboxImage

VALID_SPEC: dict[str, Any] = {
    "version": 1,
    "criteria": [
        {"name": "correct", "kind": "math_equivalence", "weight": 1.0},
        {"name": "format", "kind": "regex_match", "weight": 0.1, "params": {"pattern": "boxed"}},
    ],
    "aggregate": "weighted_sum",
}
VALID_SOURCE = json.dumps(VALID_SPEC, indent=2)
VALID_YAML = """\
version: 1
criteria:
  - name: correct
    kind: exact_match
    weight: 1
"""


def make_rubric(*, team: Any, user: Any, slug: str = "math-rubric", **extra: Any) -> Rubric:
    return services.rubric_create(
        actor=user,
        team=team,
        slug=slug,
        title=extra.pop("title", "Math rubric"),
        source=extra.pop("source", VALID_SOURCE),
        source_format=extra.pop("source_format", "json"),
        **extra,
    )


def make_image(*, team: Any, user: Any, slug: str = "python-bwrap", **values: Any) -> SandboxImage:
    return services.sandbox_image_create(
        actor=user, team=team, slug=slug, title=values.pop("title", "Python in bwrap"), **values
    )


def make_domain(*, team: Any, user: Any, slug: str = "math", **extra: Any) -> Domain:
    return services.domain_create(
        actor=user, team=team, slug=slug, title=extra.pop("title", "Math"), **extra
    )


def jsonl(rows: list[Any]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def task_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"prompt": f"What is {n} + {n}?", "ground_truth": str(2 * n), "metadata": {"n": n}}
        for n in range(start, start + count)
    ]
