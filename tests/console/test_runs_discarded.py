"""Discarded samples: the groups a step generated but did not train on (zero variance, or the
surplus of dynamic sampling) are stored with their reason, listed by the explorer's filter,
shown on the sample and group pages, and their per-step fraction is a chart series. Real
PostgreSQL; stored with the console Sink as a run stores them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.runs import explorer, live
from console.runs.models import Attempt, Run, TrajectoryRecord
from console.runs.sink import ConsoleSink
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS
from tests.console.test_runs_explorer import attempt, trajectory  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def sample(step: int, group: int, reward: float, discarded: str | None) -> dict[str, Any]:
    return {**trajectory(step, group, reward), "discarded": discarded}


@pytest.fixture
def run(attempt: Attempt) -> Run:  # noqa: F811
    """Step 1: group 0 trained on, group 1 flat (zero variance), group 2 varied but beyond
    the batch (batch full). Step 2: everything trained on. A sample from a loop that did not
    report the field yet (no key) counts as trained on."""
    sink = ConsoleSink(attempt)
    sink.trajectories(
        [
            sample(1, 0, 0.0, None),
            sample(1, 0, 1.0, None),
            sample(1, 1, 1.0, "zero_variance"),
            sample(1, 1, 1.0, "zero_variance"),
            sample(1, 2, 0.0, "batch_full"),
            sample(1, 2, 1.0, "batch_full"),
        ]
    )
    sink.trajectories([sample(2, 0, 0.0, None), trajectory(2, 0, 1.0)])
    sink.metrics(1, {"frac_reward_zero_std": 1 / 3, "batch/discarded_fraction": 4 / 6})
    sink.metrics(2, {"frac_reward_zero_std": 0.0, "batch/discarded_fraction": 0.0})
    return attempt.run


def listed(run: Run, **query: str) -> list[tuple[int, int]]:
    rows = explorer.trajectory_page(run, explorer.Filters.from_query(query)).rows
    return [(row.step, row.index) for row in rows]


def test_the_sink_stores_each_samples_reason(run: Run) -> None:
    stored = {(r.step, r.index): r.discarded for r in TrajectoryRecord.objects.filter(run=run)}
    assert stored == {
        (1, 0): "",
        (1, 1): "",
        (1, 2): "zero_variance",
        (1, 3): "zero_variance",
        (1, 4): "batch_full",
        (1, 5): "batch_full",
        (2, 0): "",
        (2, 1): "",
    }


def test_the_explorer_lists_discarded_samples_by_reason(run: Run) -> None:
    assert listed(run, discarded="yes") == [(1, 2), (1, 3), (1, 4), (1, 5)]
    assert listed(run, discarded="zero_variance") == [(1, 2), (1, 3)]
    assert listed(run, discarded="batch_full") == [(1, 4), (1, 5)]
    assert listed(run, discarded="no") == [(2, 0), (2, 1), (1, 0), (1, 1)]
    assert len(listed(run)) == 8
    # A value it does not know is named and left out (the list is not emptied).
    filters = explorer.Filters.from_query({"discarded": "bored"})
    assert filters.ignored == ("discarded",) and filters.discarded == ""


@pytest.mark.parametrize("who", EVERYONE)
def test_the_discarded_list_is_for_every_team_member(
    who: str, client_as: Callable[[str], Client], run: Run
) -> None:
    url = reverse("runs:trajectory_list", args=[run.pk]) + "?discarded=yes"
    response = client_as(who).get(url)
    if who == ANONYMOUS:
        assert response.status_code == 302
    elif who == OUTSIDER:
        assert response.status_code == 404
    else:
        assert who in READERS
        assert response.status_code == 200
        html = response.content.decode()
        assert html.count('<span class="badge warn">zero_variance</span>') == 2
        assert html.count('<span class="badge warn">batch_full</span>') == 2
        assert '<option value="yes" selected>' in html


def test_the_sample_and_group_pages_say_why_it_was_not_trained_on(
    owner_client: Client, run: Run
) -> None:
    html = owner_client.get(reverse("runs:trajectory_detail", args=[run.pk, 1, 2])).content.decode()
    assert "no: discarded" in html and "zero variance (the group&#x27;s rewards" in html
    kept = owner_client.get(reverse("runs:trajectory_detail", args=[run.pk, 1, 0]))
    assert "no: discarded" not in kept.content.decode()
    group = owner_client.get(reverse("runs:trajectory_group", args=[run.pk, 1, 2])).content
    assert group.decode().count('<span class="badge warn">batch_full</span>') == 2


def test_the_run_page_links_the_discarded_samples_and_charts_their_fraction(
    owner_client: Client, run: Run
) -> None:
    html = owner_client.get(reverse("runs:run_detail", args=[run.pk])).content.decode()
    assert reverse("runs:trajectory_list", args=[run.pk]) + "?discarded=yes" in html
    series = live.downsampled_series(run.pk)  # what the snapshot draws
    assert series["batch/discarded_fraction"] == [[1, pytest.approx(4 / 6)], [2, 0.0]]
