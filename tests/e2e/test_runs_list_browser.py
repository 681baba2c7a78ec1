"""The runs list and the compare page in a real browser against the real server: the list
gains progress while a run's sink commits steps (and keeps doing so after a filter change);
the compare page overlays two runs; the smoothing slider and the log-scale toggle change what
the charts draw, on the compare page and on a run's page. Screenshots: page-runs-list,
page-runs-compare.

As in test_runs_live_browser, the steps come from `ConsoleSink` called by the test (the job's
own writer), not from a trained run: the page cannot tell the difference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.broadcast import flush_soon
from console.runs.models import MetricRow, Run
from tests.e2e.conftest import login, model_version, run_of, screenshot, sink_on

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def metrics(step: int, scale: float = 1.0) -> dict[str, float]:
    return {
        "reward/mean": scale * (step % 3) / 4,
        "actor/kl": 0.001 * step * scale,
        "actor/entropy": 1.0 - step / 50,
        "timing_s/step": 1.0,
    }


def drag_on_reward_chart(page: Any, charts: str, first: int, last: int) -> None:
    """Drags the mouse across the reward chart (of `window.<charts>`) from step `first` to step
    `last`: uPlot's zoom."""
    over = page.locator("#chart-reward .u-over").bounding_box()
    xs = page.evaluate(
        f"(() => {{ const u = window.{charts}.plot('reward');"
        f" return [u.valToPos({first}, 'x'), u.valToPos({last}, 'x')]; }})()"
    )
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + xs[0], y)
    page.mouse.down()
    page.mouse.move(over["x"] + (xs[0] + xs[1]) / 2, y)
    page.mouse.move(over["x"] + xs[1], y)
    page.mouse.up()


def set_smoothing(page: Any, value: str) -> None:
    """Moves the smoothing slider to `value`, as a user's drag does (an `input` event)."""
    page.evaluate(
        "(() => { const s = document.getElementById('smoothing');"
        f" s.value = '{value}'; s.dispatchEvent(new Event('input')); }})()"
    )


def test_the_runs_list_gains_progress_while_a_run_trains(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    version = model_version(people, tmp_path)
    done = run_of(people, version, "finished-run", "completed")
    MetricRow.objects.bulk_create(
        MetricRow(run=done, step=s, values=metrics(s)) for s in range(1, 21)
    )
    Run.objects.filter(pk=done.pk).update(last_step=20)
    training = run_of(people, version, "training-run", "running")
    sink = sink_on(training, "list-host")

    login(page, people.owner)
    page.goto("/runs/")
    row = page.locator(f"#run-row-{training.pk}")
    assert "0/20" in row.locator(".run-step").inner_text()
    page.wait_for_function("window.runListSeq === 1")  # the socket's snapshot came
    for step in (1, 2, 3):
        sink.metrics(step, metrics(step))
    flush_soon()
    page.wait_for_function(f"document.getElementById('run-row-{training.pk}').dataset.step === '3'")
    assert row.locator(".run-step").inner_text() == "3/20"
    assert row.locator(".run-reward").inner_text() == "0.000"  # step 3: 3 % 3 = 0
    assert row.locator("svg.sparkline polyline").count() == 1
    assert page.locator(f"#run-row-{done.pk} svg.sparkline polyline").count() == 1
    screenshot(page, "page-runs-list")

    # Filtered to running runs: the finished one leaves, the live one keeps moving.
    page.select_option("#filter-state", "running")
    page.wait_for_function(f"!document.getElementById('run-row-{done.pk}')")
    page.wait_for_function("window.runListSeq === 1 && window.runListOpen")
    sink.metrics(4, metrics(4))
    flush_soon()
    page.wait_for_function(f"document.getElementById('run-row-{training.pk}').dataset.step === '4'")

    # Pick both from the list and compare them.
    page.goto("/runs/")
    page.check(f"#run-row-{training.pk} input[type=checkbox]")
    page.check(f"#run-row-{done.pk} input[type=checkbox]")
    page.click("#compare-selected")
    page.wait_for_function("window.runCompare && window.runCompare.chart('reward')")
    assert page.evaluate("window.runCompare.chart('reward').series") == 2


def test_the_compare_page_overlays_two_runs_with_smoothing_and_a_log_scale(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    version = model_version(people, tmp_path)
    first = run_of(people, version, "lr-1e-6", "completed")
    second = run_of(people, version, "lr-3e-6", "completed")
    for run, scale in ((first, 1.0), (second, 2.0)):
        MetricRow.objects.bulk_create(
            MetricRow(run=run, step=s, values=metrics(s, scale)) for s in range(1, 21)
        )
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(last_step=20)

    login(page, people.owner)
    page.goto(f"/runs/compare/?ids={first.pk},{second.pk}")
    page.locator("#chart-reward canvas").first.wait_for()
    reward = page.evaluate("window.runCompare.chart('reward')")
    assert reward["series"] == 2  # one line per run
    assert page.locator("#compare-runs tr.compare-run").count() == 2
    screenshot(page, "page-runs-compare")

    # Zoom: steps 5 to 10 dragged on the reward chart, the KL chart follows; a double-click
    # on it resets both.
    drag_on_reward_chart(page, "runCompare", 5, 10)
    low, high = page.evaluate("window.runCompare.chart('kl').x")
    assert 4 < low < 6 and 9 < high < 11
    page.locator("#chart-kl .u-over").dblclick()
    assert page.evaluate("window.runCompare.chart('reward').x") == [1, 20]

    # Smoothing: each run gets its smoothed line beside the faint raw one, and it is smoother.
    set_smoothing(page, "0.9")
    smoothed = page.evaluate("window.runCompare.chart('reward')")
    assert smoothed["series"] == 4
    raw, smooth = smoothed["data"][1], smoothed["data"][2]
    assert max(raw) - min(raw) > max(smooth[5:]) - min(smooth[5:])
    assert page.locator("#smoothing-value").inner_text() == "0.90"

    # The log scale of one chart only.
    assert page.evaluate("window.runCompare.chart('kl').distr") == 1
    page.locator("#chart-kl .log-toggle").check()
    assert page.evaluate("window.runCompare.chart('kl').distr") == 3
    assert page.evaluate("window.runCompare.chart('entropy').distr") == 1

    # Live: a step and a checkpoint of the first run arrive over its stream, as a point on
    # the chart and a marker, without a reload.
    page.wait_for_function("window.runCompare.live()")
    assert page.evaluate("window.runCompare.events()") == 0
    before = int(page.locator("#chart-kl").get_attribute("data-points") or 0)
    sink = sink_on(first, "compare-host")
    sink.metrics(21, metrics(21))
    sink.checkpoint({"step": 21, "path": "/c/21", "reason": "periodic"})
    flush_soon()
    page.wait_for_function(
        f"Number(document.getElementById('chart-kl').dataset.points) === {before + 1}"
    )
    page.wait_for_function("window.runCompare.events() === 1")
    row = page.locator(f"#compare-runs tr.compare-run[data-run='{first.pk}'] td.num")
    assert row.inner_text() == "21/20"


def test_the_run_page_charts_smooth_and_switch_to_a_log_scale(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    version = model_version(people, tmp_path)
    run = run_of(people, version, "one-run", "running")
    sink = sink_on(run, "run-host")
    for step in range(1, 11):
        sink.metrics(step, metrics(step))
    flush_soon()

    login(page, people.owner)
    page.goto(f"/runs/{run.pk}/")
    page.locator("#chart-kl canvas").first.wait_for()
    assert page.evaluate("window.runLive.chart('reward').series") == 1
    set_smoothing(page, "0.6")
    assert page.evaluate("window.runLive.chart('reward').series") == 2
    page.locator("#chart-kl .log-toggle").check()
    assert page.evaluate("window.runLive.chart('kl').distr") == 3
    # New points still arrive into the rebuilt charts.
    sink.metrics(11, metrics(11))
    flush_soon()
    page.wait_for_function("document.getElementById('chart-kl').dataset.points === '11'")

    # A zoom (steps 3 to 6 dragged on the reward chart) stays while new points arrive.
    drag_on_reward_chart(page, "runLive", 3, 6)
    low, high = page.evaluate("window.runLive.chart('kl').x")
    assert 2 < low < 4 and 5 < high < 7
    for step in (12, 13):
        sink.metrics(step, metrics(step))
    flush_soon()
    page.wait_for_function("document.getElementById('chart-kl').dataset.points === '13'")
    for chart in ("reward", "kl"):
        low, high = page.evaluate(f"window.runLive.chart('{chart}').x")
        assert 2 < low < 4 and 5 < high < 7, chart
    page.locator("#chart-kl .u-over").dblclick()
    assert page.evaluate("window.runLive.chart('reward').x") == [1, 13]
