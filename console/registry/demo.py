"""Demo registry for `make demo`: the training library's demo domains (arithmetic, JSON format,
code) with their task sets and published rubrics, and a published bubblewrap sandbox image.

`seed_registry` is idempotent: what already exists (by slug) is left as it is, so a second
`make demo` keeps whatever the user changed.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from django.db import transaction

from console.accounts.models import Team
from console.registry import services, specs
from console.registry.models import Domain, Rubric, SandboxImage, VersionStatus

logger = logging.getLogger(__name__)

TRAIN_TASKS = 400
HELD_OUT_TASKS = 100
IMAGE_SLUG = "python-bwrap"
IMAGE_LIMITS: dict[str, Any] = {
    "driver": "bwrap",
    "image_ref": "",
    "setup_script": "",
    "cpu": 1.0,
    "memory_mb": 512,
    "pids": 64,
    "disk_mb": 256,
    "timeout_s": 10,
    "network": "none",
}


def _taskset(domain: Any) -> bytes:
    """The domain's tasks as JSONL, with the training library's own train/held-out split kept."""
    lines = []
    for split, count in (("train", TRAIN_TASKS), ("held_out", HELD_OUT_TASKS)):
        for task in domain.make_tasks(count, seed=0, split=split):
            row = {**task, "split": split}
            lines.append(json.dumps(row, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def _image(team: Team, user: Any) -> SandboxImage:
    image = SandboxImage.objects.filter(team=team, slug=IMAGE_SLUG).first()
    if image is None:
        image = services.sandbox_image_create(
            actor=user,
            team=team,
            slug=IMAGE_SLUG,
            title="Python in bubblewrap",
            description="The host's Python, read-only root, no network; for code criteria.",
            **IMAGE_LIMITS,
        )
        services.sandbox_image_version_publish(actor=user, version=image.versions.get())
    return image


def _rubric(team: Team, user: Any, demo: Any) -> Rubric | None:
    slug = f"{demo.name.replace('_', '-')}-rubric"
    rubric = Rubric.objects.filter(team=team, slug=slug).first()
    if rubric is not None:
        return rubric
    source = specs.render_source(demo.rubric_spec, "yaml")
    _, issues = specs.check_rubric_source(source, "yaml")
    if issues:
        # The rewards library may not know every kind the demo uses yet; the domain is still
        # useful without a rubric, and says so in the log rather than failing the demo.
        logger.warning("demo rubric %s skipped: %s", slug, "; ".join(map(str, issues)))
        return None
    rubric = services.rubric_create(
        actor=user,
        team=team,
        slug=slug,
        title=f"{demo.name.replace('_', ' ').capitalize()} rubric",
        description=demo.description,
        source=source,
        source_format="yaml",
    )
    version = rubric.versions.get()
    if version.status == VersionStatus.DRAFT:
        services.rubric_version_publish(actor=user, version=version)
    return rubric


def seed_demo_domain(*, team: Team, user: Any, demo: Any, image: SandboxImage | None) -> Domain:
    """One demo domain (`training.demo.domains`) with its published rubric and task set."""
    slug = demo.name.replace("_", "-")
    domain = Domain.objects.filter(team=team, slug=slug).first()
    if domain is not None:
        return domain
    domain = services.domain_create(
        actor=user,
        team=team,
        slug=slug,
        title=demo.name.replace("_", " ").capitalize(),
        description=demo.description,
        default_mix_weight=1.0,
        rubric=_rubric(team, user, demo),
        sandbox_image=image,
    )
    result = services.domain_upload_tasks(
        actor=user,
        domain=domain,
        stream=io.BytesIO(_taskset(demo)),
        filename=f"{slug}.jsonl",
        held_out_fraction=HELD_OUT_TASKS / (TRAIN_TASKS + HELD_OUT_TASKS),
        split_seed=0,
    )
    if not result.stored:
        raise RuntimeError(f"demo task set for {slug} was refused: {result.errors[:3]}")
    domain.refresh_from_db()
    return domain


@transaction.atomic
def seed_registry(*, team: Team, user: Any) -> list[Domain]:
    """Create the demo domains, rubrics and sandbox image in `team` (as `user`) if missing."""
    from training.demo.domains import demo_domains  # the training library, only needed here

    image = _image(team, user)
    return [
        seed_demo_domain(team=team, user=user, demo=demo, image=image) for demo in demo_domains()
    ]
