"""The set-up the console benchmarks share: private PostgreSQL and Redis with Django migrated on
them, and the rows a run needs (user, team, published model version, host).

Django is imported inside the functions: a bench's own subprocesses (and `python -m bench`)
import this module before any settings exist.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def console(
    prefix: str,
    *,
    env: Callable[[Path], dict[str, str]] | None = None,
    own_var_dir: bool = True,
) -> Iterator[tuple[Path, dict[str, str]]]:
    """Start a private PostgreSQL and Redis in a fresh `var/<prefix>*` folder, set up Django
    on them and migrate; yield (that folder, the environment for subprocesses); stop both.

    `env(folder)`: more variables, set before Django reads its settings. `own_var_dir=False`:
    CONSOLE_VAR_DIR is not pointed at the servers' folder (so the console's VAR_DIR stays the
    default var/, or the caller's CONSOLE_VAR_DIR: where the demo model is built once)."""
    from console.devservers import PrivateServices

    (ROOT / "var").mkdir(exist_ok=True)  # a fresh checkout has none
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=ROOT / "var"))
    services = PrivateServices(work / "servers", persistent=False)
    environment = services.start(dict(os.environ))
    environment.update(env(work) if env else {})
    if not own_var_dir:
        environment.pop("CONSOLE_VAR_DIR", None)
    os.environ.update(environment)
    try:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield work, environment
    finally:
        services.stop()


class Fixture(NamedTuple):
    user: Any
    team: Any
    version: Any  # a published ModelVersion of the team's model "m"
    host: Any


def fixture(*, username: str = "bench", host: str = "bench", role: str | None = None) -> Fixture:
    """The bench user and team (the user a member with `role` when given), a published model
    version and a host."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from console.accounts.models import Membership, Team
    from console.runs.models import Host, ModelVersion, RegisteredModel

    user = get_user_model().objects.create_user(username=username)
    team = Team.objects.create(slug="bench", name="Bench")
    if role is not None:
        Membership.objects.create(user=user, team=team, role=role)
    model = RegisteredModel.objects.create(team=team, slug="m", title="m", created_by=user)
    version = ModelVersion.objects.create(
        model=model, number=1, path="/m", status="published", created_by=user,
        published_at=timezone.now(), published_by=user,
    )  # fmt: skip
    return Fixture(user, team, version, Host.objects.create(name=host))


def running_attempt(fx: Fixture, *, attempt_started_at: Any = None, **run: Any) -> Any:
    """A new run (name "b" unless `run` names it; `run` sets its other fields) with attempt 1
    running on the fixture's host."""
    from console.runs.models import Attempt, Run

    fields = {"name": "b", "request": {}, "spec": {}, "pins": {}, **run}
    row = Run.objects.create(team=fx.team, created_by=fx.user, model_version=fx.version, **fields)
    return Attempt.objects.create(
        run=row, number=1, host=fx.host, state="running", started_at=attempt_started_at
    )
