"""The demo's model: the small demo model (built once with `training.models`, with progress
shown) registered as the team's model ``demo``. Idempotent."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from console.accounts.models import Team
from console.runs import services
from console.runs.models import ModelVersion

DEMO_MODEL_SLUG = "demo"


def seed_models(*, team: Team, user: Any, log: Any = None) -> ModelVersion:
    from training.models import ensure_demo_model

    path = ensure_demo_model(settings.MODELS_ROOT / "demo", log=log)
    existing = (
        ModelVersion.objects.filter(model__team=team, model__slug=DEMO_MODEL_SLUG, path=str(path))
        .order_by("-number")
        .first()
    )
    if existing is not None:
        return existing
    return services.model_register(
        actor=user,
        team=team,
        slug=DEMO_MODEL_SLUG,
        title="Demo model",
        path=str(path),
        description="A small chat model built on this machine for the demo domains.",
    )
