"""A researcher launches a run from the new-run page and watches it reach completed: the real
server, a real control worker and host agent, the demo model trained by a real job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.registry.demo import seed_demo_domain
from console.runs.demo import seed_models
from console.runs.models import Run, TrajectoryRecord
from tests.console.runs_cluster import Cluster, wait_for
from tests.e2e.conftest import login, screenshot
from training.demo.domains import get_domain

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path, settings: Any) -> Any:
    settings.RUNS_ROOT = tmp_path / "runs"
    cluster = Cluster(tmp_path)
    cluster.start_control()
    cluster.start_agent("browser-host")
    yield cluster
    cluster.stop()


def test_a_run_launched_from_the_new_run_page_reaches_completed(
    page: Any, people: Any, live_server_url: str, cluster: Any
) -> None:
    seed_models(team=people.team, user=people.owner)
    parity = seed_demo_domain(
        team=people.team, user=people.owner, demo=get_domain("parity"), image=None
    )
    login(page, people.owner)
    page.goto("/runs/new/")
    page.get_by_label("Name", exact=True).fill("parity-from-the-browser")
    page.locator(f"input[name=use_{parity.pk}]").check()
    page.get_by_label("Steps", exact=True).fill("4")
    page.get_by_label("Prompts per step").fill("4")
    page.get_by_label("Group size").fill("4")
    screenshot(page, "page-run-new-filled")
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url("**/runs/*/")
    run = Run.objects.get(name="parity-from-the-browser")
    # While it trains, the open page's charts gain points and its trajectory feed grows, pushed
    # over the run's websocket (the page opened before the job had written anything).
    points = "Number(document.getElementById('live-charts').dataset.points || 0)"
    feed = "document.querySelectorAll('#live-feed li').length"
    page.wait_for_function(f"{points} > 0 && {feed} > 0", timeout=600_000)
    first_points, first_feed = page.evaluate(f"[{points}, {feed}]")
    page.wait_for_function(f"{points} > {first_points} && {feed} > {first_feed}", timeout=600_000)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).is_terminal, timeout=600, what="the run to end",
        cluster=cluster,
    )  # fmt: skip
    run.refresh_from_db()
    assert run.state == "completed", f"{run.state_reason}\n{run.error}\n{cluster.logs()}"
    # The open page polls its state; once the run has ended it reloads itself whole, so the
    # checkpoints, events and logs are there too, without the user reloading it.
    page.locator("#run-state .badge.state-completed").wait_for(timeout=30_000)
    page.get_by_text("run.completed").first.wait_for(timeout=30_000)
    assert page.get_by_text("Cancel…").count() == 0  # a finished run offers no cancel
    screenshot(page, "page-run-completed")
    assert TrajectoryRecord.objects.filter(run=run).count() == 4 * 4 * 4
    assert "completed" in page.locator("#run-live").inner_text().lower()
    # Drill into one sample from the feed: its chat, reward breakdown and provenance.
    page.locator("#live-feed li a.feed-head").first.click()
    page.wait_for_url(f"**/runs/{run.pk}/trajectories/*/*/")
    page.locator("#chat").wait_for()
    assert page.locator("#breakdown").count() == 1
    assert "Policy version" in page.locator("#provenance").inner_text()
