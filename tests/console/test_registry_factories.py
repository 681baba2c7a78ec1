"""Registry objects for tests, built through the real services (so every test object passed the
same checks and audit path a user's would). Imported by the other test_registry_* modules."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
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


@dataclass
class Registry:
    """One team's registry: a domain with tasks, a rubric with a published v1 and a draft v2,
    an image with a draft v1."""

    domain: Domain
    rubric: Rubric
    image: SandboxImage


def build_registry(people: Any) -> Registry:
    """Each test module wraps this in a `registry` fixture."""
    rubric = make_rubric(team=people.team, user=people.owner)
    services.rubric_version_publish(actor=people.owner, version=rubric.versions.get())
    services.rubric_save_draft(
        actor=people.owner, rubric=rubric, source=VALID_YAML, source_format="yaml"
    )
    image = make_image(team=people.team, user=people.owner)
    domain = make_domain(team=people.team, user=people.owner, rubric=rubric, sandbox_image=image)
    services.domain_upload_tasks(
        actor=people.owner,
        domain=domain,
        stream=io.BytesIO(jsonl(task_rows(30))),
        filename="t.jsonl",
        held_out_fraction=0.2,
        split_seed=0,
    )
    domain.refresh_from_db()
    return Registry(domain=domain, rubric=rubric, image=image)
