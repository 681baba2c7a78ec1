"""The trajectory explorer in a browser: filtering swaps the table and keeps the filters in the
URL, then list → sample → group; screenshots of the three pages at desktop and phone width,
none wider than the screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.runs.models import Allocation, Attempt, Host, Run
from console.runs.sink import ConsoleSink
from tests.console.factories import attempt_create
from tests.console.test_runs_explorer import observation, trajectory
from tests.e2e.conftest import UI_TIMEOUT_MS, login, model_version, screenshot

WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


@pytest.fixture
def run(people: Any, tmp_path: Path) -> Run:
    version = model_version(people, tmp_path)
    run = Run.objects.create(
        team=people.team, created_by=people.owner, name="explored", request={}, spec={},
        pins={"domains": [{"slug": "parity", "domain_id": 1, "rubric_version": 3,
                           "taskset_version": 1},
                          {"slug": "tools", "domain_id": 2, "rubric_version": 3,
                           "taskset_version": 1}]},
        model_version=version,
    )  # fmt: skip
    host = Host.objects.create(name="h", cpu_slots=1)
    # Written while running (the sink writes for the run's live attempt only), then ended.
    attempt = attempt_create(run, host, state="running")
    sink = ConsoleSink(attempt)
    long = "Let me think. " * 40 + "\\boxed{even}"
    for step in (1, 2, 3):
        sink.trajectories(
            [
                trajectory(step, group, (group + sample) % 2 * 1.0, task_id=str(group),
                           completion=long if sample == 0 else "<b>odd</b>",
                           breakdown={"answer": (group + sample) % 2 * 1.0, "format": 0.5},
                           details={"answer": {"expected": "even", "got": "odd"}})
                for group in range(3)
                for sample in range(4)
            ]
        )  # fmt: skip
    messages = [
        {"role": "user", "content": "Compute 2+2 with python."},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "python", "arguments": '{"code": "print(2+2)"}'}}]},
        {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "python"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]  # fmt: skip
    sink.trajectories(
        [
            trajectory(4, 0, reward, domain="tools", task_id="t", messages=messages,
                       observations=[observation(stdout="4\n" * 3, stderr="a long warning " * 20)])
            for reward in (0.0, 1.0, 0.5)
        ]
    )  # fmt: skip
    Attempt.objects.filter(pk=attempt.pk).update(state="completed")
    Allocation.objects.filter(attempt=attempt).update(state="exited")
    return run


def _too_wide(page: Any) -> int:
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


def test_filter_then_drill_down_from_list_to_sample_to_group(
    page: Any, people: Any, live_server_url: str, run: Run
) -> None:
    login(page, people.owner)
    page.goto(f"/runs/{run.pk}/")
    page.locator("#explore-trajectories").click()
    page.wait_for_url(f"**/runs/{run.pk}/trajectories/")
    assert page.locator("table.trajectories tbody tr").count() == 39
    page.locator("select[name=domain]").select_option("tools")
    page.wait_for_url("**domain=tools**", timeout=UI_TIMEOUT_MS)
    rows = page.locator("table.trajectories tbody tr")
    rows.nth(2).wait_for()
    page.wait_for_function(
        "document.querySelectorAll('table.trajectories tbody tr').length === 3",
        timeout=UI_TIMEOUT_MS,
    )
    page.locator("table.trajectories tbody tr").first.get_by_role("link").first.click()
    page.wait_for_url(f"**/runs/{run.pk}/trajectories/4/0/")
    page.get_by_text("tool result for call_1").wait_for()
    assert page.locator(".observation").count() == 1
    page.locator("#sample-facts").get_by_role("link").click()
    page.wait_for_url(f"**/runs/{run.pk}/steps/4/groups/0/")
    assert page.locator("#group-table tbody tr").count() == 3
    page.get_by_text("recomputed here").wait_for()


def test_the_explorer_pages_at_desktop_and_phone_width(
    page: Any, people: Any, live_server_url: str, run: Run
) -> None:
    login(page, people.teammate_annotator)
    pages = {
        "trajectories": f"/runs/{run.pk}/trajectories/",
        "trajectory-group": f"/runs/{run.pk}/steps/3/groups/1/",
        "trajectory-detail": f"/runs/{run.pk}/trajectories/4/1/",
    }
    problems = []
    for width_name, viewport in WIDTHS.items():
        page.set_viewport_size(viewport)
        for name, url in pages.items():
            response = page.goto(url)
            assert response is not None and response.status == 200, url
            overflow = _too_wide(page)
            if overflow > 1:
                problems.append(f"{name} {width_name}: {overflow} px too wide")
            screenshot(page, f"page-{name}-{width_name}")
    assert not problems, "\n".join(problems)
