"""The step timeline in a real browser: a step of two ranks on two hosts drawn as a Gantt
chart (a lane group per host and rank, each stage a bar, the idle gaps hatched, the rank that
waits most marked), reached from the run's steps page. Screenshot: page-run-timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import login, model_version, run_of, screenshot, sink_on

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def span(stage: str, start: float, end: float, rank: int, host: str) -> dict[str, Any]:
    return {"stage": stage, "start_s": start, "end_s": end, "rank": rank, "host": host}


def test_a_step_timeline_shows_each_host_and_rank_and_who_waits(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    run = run_of(people, model_version(people, tmp_path), "gantt-run", "running")
    sink = sink_on(run, "gpu-a")
    stages = []
    for rank, where, rollout_end in ((0, "gpu-a", 2.0), (1, "gpu-b", 1.2)):
        stages += [
            span("rollout", 0.0, rollout_end, rank, where),
            span("reward", rollout_end, rollout_end + 0.3, rank, where),
            # Rank 1 finishes its rollout early and waits for rank 0 before the passes.
            span("logprobs", 2.4, 2.7, rank, where),
            span("train", 2.7, 3.6, rank, where),
            span("weight_sync", 3.6, 3.8, rank, where),
        ]
    stages.append(span("checkpoint", 3.8, 4.4, 0, "gpu-a"))
    sink.event("step.timeline", {"step": 1, "step_s": 3.8, "stages": stages})

    login(page, people.owner)
    page.goto(f"/runs/{run.pk}/steps/")
    page.locator(f"a[href='/runs/{run.pk}/steps/1/timeline/']").first.click()
    page.locator("#step-gantt").wait_for()
    heads = page.locator(".gantt-rank-head .gantt-label").all_inner_texts()
    assert heads == ["gpu-a · rank 0", "gpu-b · rank 1"]
    lanes = page.locator(".gantt-rank[data-rank='0'] .gantt-row[data-stage]")
    assert [lanes.nth(i).get_attribute("data-stage") for i in range(lanes.count())] == [
        "rollout", "reward", "logprobs", "train", "weight_sync", "checkpoint",
    ]  # fmt: skip
    assert page.locator(".gantt-rank[data-rank='1']").get_attribute("class") == (
        "gantt-rank waits-most"
    )
    assert page.locator(".gantt-rank[data-rank='1'] .bar.idle").count() >= 1
    assert "Ref/old log-probs" in page.locator("#step-stages").inner_text()
    assert "Checkpoint" in page.locator("#step-stages").inner_text()
    screenshot(page, "page-run-timeline")
