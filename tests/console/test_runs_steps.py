"""The step timeline: the steps page (picker, slowest steps) and one step's Gantt chart, as
pages and in the API, through the role matrix; where each rank waits; bad input. Real
PostgreSQL; timelines stored with the console Sink as a run sends them (`step.timeline`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.runs import services, steps
from console.runs.models import Attempt, Host, Run
from console.runs.sink import ConsoleSink
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS, attempt_create

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def span(stage: str, start: float, end: float, rank: int = 0, **extra: Any) -> dict[str, Any]:
    return {"stage": stage, "start_s": start, "end_s": end, "rank": rank, **extra}


def two_rank_step(step: int, step_s: float) -> dict[str, Any]:
    """Rank 1 finishes its rollout early and waits 2 s for rank 0 before the update."""
    return {
        "step": step,
        "step_s": step_s,
        "stages": [
            span("rollout", 0.0, 4.0, 0, busy_s=3.0, round=0),
            span("tools", 0.0, 4.0, 0, busy_s=1.0, round=0),
            span("reward", 4.0, 5.0, 0, round=0),
            span("rollout", 0.0, 2.0, 1, busy_s=2.0, round=0),
            span("reward", 2.0, 3.0, 1, round=0),
            span("train", 5.0, 7.0, 0),
            span("train", 5.0, 7.0, 1),
            span("weight_sync", 7.0, step_s, 0),
            span("weight_sync", 7.0, step_s, 1),
        ],
    }


@pytest.fixture
def attempt(people: Any, tmp_path: Path) -> Attempt:
    (tmp_path / "config.json").write_text("{}")
    version = services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )
    run = Run.objects.create(
        team=people.team,
        created_by=people.owner,
        name="timed",
        request={},
        spec={},
        pins={"domains": []},
        model_version=version,
    )
    host = Host.objects.create(name="gpu-host-1", cpu_slots=1)
    return attempt_create(run, host, state="running")


@pytest.fixture
def run(attempt: Attempt) -> Run:
    """Steps 1-3 with timelines (step 2 the slowest), and a chart event between them."""
    sink = ConsoleSink(attempt)
    sink.event("step.timeline", two_rank_step(1, 8.0))
    sink.event("step.timeline", two_rank_step(2, 12.5))
    sink.event("mix.weights_changed", {"step": 2, "old": {}, "new": {}})
    sink.event("step.timeline", two_rank_step(3, 7.5))
    return attempt.run


# --- the role matrix ------------------------------------------------------------------------

PAGES: dict[str, Callable[[Run], str]] = {
    "steps": lambda run: reverse("runs:step_list", args=[run.pk]),
    "steps_card": lambda run: reverse("runs:step_list", args=[run.pk]),
    "timeline": lambda run: reverse("runs:step_timeline", args=[run.pk, 2]),
}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("who", EVERYONE)
def test_step_pages_are_for_every_team_member(
    page: str, who: str, client_as: Callable[[str], Client], run: Run
) -> None:
    response = client_as(who).get(PAGES[page](run), **(HTMX if page == "steps_card" else {}))
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    elif who == OUTSIDER:
        assert response.status_code == 404
    else:
        assert who in READERS
        assert response.status_code == 200, who


API = [
    "/api/runs/{id}/steps/2/timeline",
    "/api/runs/{id}/steps/slowest",
]


@pytest.mark.parametrize("url", API)
@pytest.mark.parametrize("who", EVERYONE)
def test_step_api_follows_the_role_matrix(
    url: str, who: str, api_client_as: Callable[[str], Client], run: Run
) -> None:
    response = api_client_as(who).get(url.format(id=run.pk))
    expected = 200 if who in READERS else 401 if who == ANONYMOUS else 404
    assert response.status_code == expected, response.content


# --- the timeline ---------------------------------------------------------------------------


def test_the_timeline_shows_each_rank_on_its_host_and_which_rank_waits(
    owner_client: Client, run: Run
) -> None:
    timeline = steps.step_timeline(run, 1)
    assert timeline is not None
    assert [(row.host, row.rank) for row in timeline.ranks] == [
        ("gpu-host-1", 0),
        ("gpu-host-1", 1),
    ]
    rank0, rank1 = timeline.ranks
    assert [lane.stage for lane in rank0.lanes] == [
        "rollout",
        "tools",
        "reward",
        "train",
        "weight_sync",
    ]
    assert [lane.stage for lane in rank1.lanes] == ["rollout", "reward", "train", "weight_sync"]
    # Rank 1 is done scoring at 3 s and the update starts at 5 s: two idle seconds.
    assert rank0.gaps == [] and rank0.idle_s == 0
    assert rank1.gaps == [(3.0, 5.0)] and rank1.idle_s == pytest.approx(2.0)
    assert rank1.waits_most and not rank0.waits_most
    # Rollout and tools share their window; each counts its own busy seconds.
    assert {s["stage"]: s["seconds"] for s in timeline.stages}["rollout"] == pytest.approx(2.5)

    html = owner_client.get(reverse("runs:step_timeline", args=[run.pk, 1])).content.decode()
    assert "gpu-host-1 · rank 1" in html and "waits most" in html
    assert 'title="idle 2.000 s from 3.000 s"' in html
    # The rollout bar of rank 0 spans half of the 8 s step.
    assert 'class="bar stage-rollout" style="left:0.0%;width:50.0%"' in html
    assert "Tool calls" in html and "Weight sync" in html


def test_the_api_returns_the_spans_the_page_draws(
    api_client_as: Callable[[str], Client], run: Run
) -> None:
    body = api_client_as("owner").get(f"/api/runs/{run.pk}/steps/1/timeline").json()
    assert body["step"] == 1 and body["step_s"] == 8.0 and body["attempt"] == 1
    assert len(body["spans"]) == 9
    assert {
        "stage": "tools",
        "start_s": 0.0,
        "end_s": 4.0,
        "rank": 0,
        "host": "gpu-host-1",
        "busy_s": 1.0,
        "round": 0,
    } in body["spans"]
    assert [(r["rank"], r["idle_s"], r["gaps"]) for r in body["ranks"]] == [
        (0, 0.0, []),
        (1, 2.0, [[3.0, 5.0]]),
    ]
    missing = api_client_as("owner").get(f"/api/runs/{run.pk}/steps/9/timeline")
    assert missing.status_code == 404 and "no timeline" in missing.json()["detail"]


def test_slowest_steps_come_first_on_the_page_the_card_and_the_api(
    owner_client: Client, api_client_as: Callable[[str], Client], run: Run
) -> None:
    assert steps.slowest_steps(run) == [
        {"step": 2, "step_s": 12.5},
        {"step": 1, "step_s": 8.0},
        {"step": 3, "step_s": 7.5},
    ]
    card = owner_client.get(reverse("runs:step_list", args=[run.pk]), **HTMX).content.decode()
    assert card.lstrip().startswith('<section class="card" id="step-timelines">')
    linked = re.findall(r"/steps/(\d+)/timeline/", card)
    assert linked == ["2", "1", "3"]
    api = api_client_as("owner").get(f"/api/runs/{run.pk}/steps/slowest?limit=1").json()
    assert api == [{"step": 2, "step_s": 12.5}]


def test_the_step_picker_opens_a_step_and_explains_bad_input(
    owner_client: Client, run: Run
) -> None:
    url = reverse("runs:step_list", args=[run.pk])
    response = owner_client.get(url, {"step": "3"})
    assert response.status_code == 302
    assert response["Location"] == reverse("runs:step_timeline", args=[run.pk, 3])
    bad = owner_client.get(url, {"step": "three"})
    assert bad.status_code == 422
    assert "“three” is not a step number" in bad.content.decode()
    assert owner_client.get(reverse("runs:step_timeline", args=[run.pk, 4])).status_code == 404


def test_a_step_links_to_its_neighbours_and_its_trajectories(
    owner_client: Client, run: Run
) -> None:
    html = owner_client.get(reverse("runs:step_timeline", args=[run.pk, 2])).content.decode()
    assert reverse("runs:step_timeline", args=[run.pk, 1]) in html
    assert reverse("runs:step_timeline", args=[run.pk, 3]) in html
    assert reverse("runs:trajectory_list", args=[run.pk]) + "?step=2" in html


def test_the_run_page_and_the_explorers_step_views_lead_to_the_timeline(
    owner_client: Client, run: Run
) -> None:
    steps_url = reverse("runs:step_list", args=[run.pk])
    run_page = owner_client.get(reverse("runs:run_detail", args=[run.pk])).content.decode()
    assert f'hx-get="{steps_url}"' in run_page and f'href="{steps_url}"' in run_page
    timeline_url = reverse("runs:step_timeline", args=[run.pk, 2])
    listed = owner_client.get(reverse("runs:trajectory_list", args=[run.pk]), {"step": "2"})
    assert timeline_url in listed.content.decode()
    assert (
        timeline_url
        not in owner_client.get(reverse("runs:trajectory_list", args=[run.pk])).content.decode()
    )


def test_a_timeline_without_a_step_length_or_with_broken_spans_still_draws(
    attempt: Attempt,
) -> None:
    ConsoleSink(attempt).event(
        "step.timeline",
        {
            "step": 1,
            "stages": [
                span("rollout", 0.0, 2.0),
                {"stage": "train", "start_s": "soon", "end_s": 3.0, "rank": 0},
                span("reward", 3.0, 2.0),  # ends before it starts
                span("train", 2.5, 4.0),
            ],
        },
    )
    timeline = steps.step_timeline(attempt.run, 1)
    assert timeline is not None
    assert timeline.step_s == 4.0
    assert [lane.stage for lane in timeline.ranks[0].lanes] == ["rollout", "train"]
    assert timeline.ranks[0].gaps == [(2.0, 2.5)]
