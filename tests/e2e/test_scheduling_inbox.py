"""An admin works the preemption inbox with the keyboard in a real browser: a request filed
while the page is open appears without a reload (its websocket rings, the page re-reads its
part); j/k move between pending requests, a approves the selected one, r puts the cursor in
its reason box (Enter rejects). The requests are real: a full fleet and higher-class runs,
through the scheduler service (no workers needed for what the page shows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from console.registry.demo import seed_demo_domain
from console.runs import services as runs_services
from console.runs.launch import default_document
from console.runs.models import Attempt, AttemptState, Host, Run, RunState
from console.scheduling import services
from console.scheduling.models import PreemptionRequest, PriorityClass
from tests.e2e.conftest import login, screenshot
from training.demo.domains import get_domain

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _launch(people: Any, name: str, **options: Any) -> Run:
    document = default_document(model="base", domains=[("parity", 1.0)])
    document.update(name=name, max_steps=4)
    return runs_services.run_launch(
        actor=people.owner, team=people.team, document=document, **options
    )


def test_an_admin_approves_and_rejects_from_the_keyboard(
    page: Any, people: Any, live_server_url: str, tmp_path: Path, settings: Any
) -> None:
    settings.RUNS_ROOT = tmp_path / "runs"
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({"model_type": "demo"}))
    runs_services.model_register(
        actor=people.owner, team=people.team, slug="base", title="Base",
        path=str(tmp_path / "base"),
    )  # fmt: skip
    seed_demo_domain(team=people.team, user=people.owner, demo=get_domain("parity"), image=None)
    for name in ("cpu-a", "cpu-b"):
        Host.objects.create(name=name, cpu_slots=1, heartbeat_at=timezone.now())
    victims = [_launch(people, f"victim-{i}") for i in range(2)]
    services.schedule_pass()
    Attempt.objects.filter(run__in=victims).update(
        state=AttemptState.RUNNING, started_at=timezone.now()
    )
    Run.objects.filter(pk__in=[v.pk for v in victims]).update(state=RunState.RUNNING)
    PriorityClass.objects.create(name="urgent", value=1000, can_preempt=True, preemptible=False)
    for i in range(2):
        _launch(people, f"urgent-{i}", priority_class="urgent")
    services.schedule_pass()  # the policy plans one preemption per team and pool per pass
    (first,) = PreemptionRequest.objects.all()

    login(page, people.teammate_admin)
    page.goto("/scheduling/preemptions/")
    page.locator(f"#preemption-{first.pk}").wait_for()
    page.wait_for_function("window.schedulingLiveOpen === true")
    services.schedule_pass()  # files the second request while the page is open
    second = PreemptionRequest.objects.exclude(pk=first.pk).get()
    assert first.state == second.state == "pending"
    page.locator(f"#preemption-{second.pk}").wait_for()  # no reload
    assert page.evaluate("window.schedulingLiveSeq") >= 1
    screenshot(page, "page-preemption-inbox")
    page.keyboard.press("j")  # the second request
    page.keyboard.press("a")
    page.get_by_text(f"Request #{second.pk} approved").wait_for()
    second.refresh_from_db()
    first.refresh_from_db()
    assert (second.state, first.state) == ("approved", "pending")

    page.keyboard.press("r")  # the only pending one left
    page.keyboard.type("the victim is ")
    # A live re-read whose answer lands while the reason is being typed (it was on its way
    # when r was pressed) must not swap a fresh, empty box in under the typing.
    kept = page.evaluate(
        """() => new Promise((done) => {
            const typing = document.activeElement;
            const inbox = document.getElementById("inbox");
            inbox.addEventListener("htmx:afterRequest",
                () => done(typing.isConnected && document.activeElement === typing),
                {once: true});
            htmx.trigger(inbox, "live-changed");
        })"""
    )
    assert kept, "the reason box was replaced while the admin typed in it"
    page.keyboard.type("a paper run")
    page.keyboard.press("Enter")
    page.get_by_text(f"Request #{first.pk} rejected").wait_for()
    first.refresh_from_db()
    assert first.state == "rejected" and first.rejection_reason == "the victim is a paper run"
