"""The runs list, live (`/runs/`, `/ws/runs/`, `GET /api/runs`) and comparing runs
(`/runs/compare/`, `GET /api/runs/compare`): the role matrix for the pages, the socket and the
API; progress with an ETA, the newest reward and a downsampled sparkline; the filters; rows
pushed after the sink commits; bad input answered with what is wrong. Real PostgreSQL and the
real channel layer (Redis)."""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.asgi import application
from console.broadcast import flush_soon
from console.runs import selectors, services
from console.runs.models import Attempt, Host, MetricRow, Run
from console.runs.sink import ConsoleSink
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, OWNER, READERS, attempt_create

pytestmark = pytest.mark.django_db(transaction=True)


PIN = {"slug": "parity", "weight": 1.0, "domain_id": 1, "rubric_version": 2}


def make_run(people: Any, version: Any, name: str, state: str = "running", **kw: Any) -> Run:
    fields = {
        "team": people.team,
        "created_by": people.owner,
        "name": name,
        "request": {},
        "spec": {"kl": {"coef": 0.02}, "sampling": {"temperature": 0.9}},
        "pins": {"domains": [PIN]},
        "model_version": version,
        "state": state,
        "max_steps": 100,
        **kw,
    }
    return Run.objects.create(**fields)


@pytest.fixture
def version(people: Any, tmp_path: Path) -> Any:
    (tmp_path / "config.json").write_text("{}")
    return services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )


@pytest.fixture
def attempt(people: Any, version: Any) -> Attempt:
    run = make_run(people, version, "live-parity")
    host = Host.objects.create(name="gpu-7", cpu_slots=1)
    started = timezone.now() - dt.timedelta(hours=1)
    return attempt_create(run, host, state="running", started_at=started)


def paced_metrics(run: Run, steps: int, seconds_apart: int) -> None:
    """`steps` metric rows written `seconds_apart` apart, ending now; reward/mean = step/100."""
    now = timezone.now()
    for step in range(1, steps + 1):
        MetricRow.objects.create(run=run, step=step, values={"reward/mean": step / 100})
        MetricRow.objects.filter(run=run, step=step).update(
            updated_at=now - dt.timedelta(seconds=(steps - step) * seconds_apart)
        )
    Run.objects.filter(pk=run.pk).update(last_step=steps)


def headers(client: Client, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    result = [(b"host", b"testserver"), (b"origin", origin.encode())]
    cookie = client.cookies.get(django_settings.SESSION_COOKIE_NAME)
    if cookie:
        result.append((b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie.value}".encode()))
    return result


def list_socket(client: Client, query: str = "", **kw: Any) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, f"/ws/runs/{query}", headers=headers(client, **kw))


# --- the page -----------------------------------------------------------------------------------


def test_the_list_shows_progress_eta_newest_reward_and_a_sparkline_to_the_team_only(
    client_as: Any, attempt: Attempt
) -> None:
    paced_metrics(attempt.run, steps=10, seconds_apart=30)
    for who in EVERYONE:
        response = client_as(who).get(reverse("runs:run_list"))
        if who == ANONYMOUS:
            assert response.status_code == 302 and "/accounts/login/" in response["Location"]
            continue
        assert response.status_code == 200, who
        content = response.content.decode()
        assert ("live-parity" in content) == (who in READERS), who
        if who in READERS:
            # 90 steps left at 30 s a step.
            assert "10/100" in content and "ETA 45 min" in content
            assert ">0.100<" in content  # reward/mean of step 10
            assert 'class="sparkline"' in content and "<polyline" in content


def test_the_sparkline_is_downsampled_in_the_database_to_bucket_means(
    people: Any, version: Any
) -> None:
    run = make_run(people, version, "long", state="completed", last_step=3999)
    MetricRow.objects.bulk_create(
        MetricRow(run=run, step=step, values={"reward/mean": step / 4000}) for step in range(4000)
    )
    (summary,) = selectors.run_list_summaries([run])
    spark = summary.sparkline  # type: ignore[attr-defined]
    assert len(spark) == selectors.SPARK_BUCKETS
    # Bucket i holds steps 100 i .. 100 i + 99 (sampled every 13th step): its mean is near
    # its middle, and the sparkline rises as the series does.
    for i, (step, value) in enumerate(spark):
        assert 100 * i <= step < 100 * i + 13
        assert value == pytest.approx((100 * i + 50) / 4000, abs=8 / 4000)
    assert summary.latest_reward == 3999 / 4000  # type: ignore[attr-defined]
    assert summary.eta_s is None  # type: ignore[attr-defined]  # not training


def test_eta_counts_only_the_current_attempts_pace(people: Any, attempt: Attempt) -> None:
    run = attempt.run
    paced_metrics(run, steps=10, seconds_apart=30)
    # Resumed 100 s ago: the steps before it were written by the lost attempt.
    Attempt.objects.filter(pk=attempt.pk).update(state="lost")
    attempt_create(
        run, attempt.host, number=2, state="running",
        started_at=timezone.now() - dt.timedelta(seconds=100),
    )  # fmt: skip
    now = timezone.now()
    MetricRow.objects.filter(run=run, step__gte=7).update(updated_at=now)
    MetricRow.objects.filter(run=run, step=10).update(updated_at=now + dt.timedelta(seconds=60))
    (summary,) = selectors.run_list_summaries([Run.objects.get(pk=run.pk)])
    # Steps 7..10 in 60 s: 20 s a step, 90 steps left.
    assert summary.eta_s == pytest.approx(1800)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("?state=running", {"live-parity"}),
        ("?state=completed", {"done-arith"}),
        ("?q=PARITY", {"live-parity"}),  # part of the name, any case
        ("?q=arithmetic", {"done-arith"}),  # a pinned domain's slug
        ("?launched_by=teammate_researcher", {"done-arith"}),
        ("?launched_by=nobody", set()),
        ("?state=bogus", {"live-parity", "done-arith"}),  # an unknown state filters nothing
    ],
)
def test_the_filters(
    query: str, shown: set[str], client_as: Any, people: Any, version: Any, attempt: Attempt
) -> None:
    make_run(
        people, version, "done-arith", state="completed", created_by=people.teammate_researcher,
        pins={"domains": [{"slug": "arithmetic", "weight": 1.0}]},
    )  # fmt: skip
    response = client_as(OWNER).get(reverse("runs:run_list") + query, HTTP_HX_REQUEST="true")
    content = response.content.decode()
    assert {name for name in ("live-parity", "done-arith") if name in content} == shown


# --- the socket -------------------------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
def test_the_list_socket_shows_the_team_its_runs_and_nothing_to_others(
    who: str, client_as: Any, people: Any, attempt: Attempt
) -> None:
    client = client_as(who)
    sink = ConsoleSink(attempt)

    async def scenario() -> tuple[bool, Any, Any, Any]:
        communicator = list_socket(client)
        connected, code = await communicator.connect(timeout=10)
        if not connected:
            return connected, code, None, None
        first = await communicator.receive_json_from(timeout=10)
        await sync_to_async(sink.metrics)(5, {"reward/mean": 0.75})
        await sync_to_async(flush_soon)()
        if who == OUTSIDER:
            update = None if await communicator.receive_nothing(timeout=2) else "something"
        else:
            update = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return connected, code, first, update

    connected, code, first, update = async_to_sync(scenario)()
    if who == ANONYMOUS:
        assert (connected, code) == (False, 4401)
        return
    assert connected and first["type"] == "snapshot" and first["seq"] == 1
    names = [row["html"] for row in first["rows"]]
    if who == OUTSIDER:
        assert first["rows"] == [] and update is None  # their own team's list: empty
        return
    assert [row["id"] for row in first["rows"]] == [attempt.run_id] and "live-parity" in names[0]
    assert update["type"] == "rows" and update["seq"] == 2
    (row,) = update["rows"]
    assert (row["id"], row["last_step"], row["latest_reward"]) == (attempt.run_id, 5, 0.75)
    assert row["sparkline"] == [[5, 0.75]] and "5/100" in row["html"]


def test_another_teams_list_and_a_foreign_origin_are_refused(
    client_as: Any, people: Any, attempt: Attempt
) -> None:
    async def connect(client: Client, query: str = "", **kw: Any) -> tuple[bool, Any]:
        communicator = list_socket(client, query, **kw)
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected, code

    outsider = client_as(OUTSIDER)
    owner = client_as(OWNER)
    assert async_to_sync(connect)(outsider, f"?team={people.team.pk}") == (False, 4404)
    connected, _ = async_to_sync(connect)(owner, origin="http://evil.example")
    assert connected is False
    assert async_to_sync(connect)(owner, f"?team={people.team.pk}")[0] is True


def test_the_list_socket_keeps_the_pages_filters(
    client_as: Any, people: Any, version: Any, attempt: Attempt
) -> None:
    """A page filtered to queued runs hears of a queued run being cancelled: it leaves."""
    queued = make_run(people, version, "waiting", state="queued")
    client = client_as(OWNER)

    def cancel() -> None:
        services.run_command(actor=people.owner, run=Run.objects.get(pk=queued.pk), kind="cancel")

    async def scenario() -> tuple[Any, Any]:
        communicator = list_socket(client, "?state=queued")
        assert (await communicator.connect(timeout=10))[0]
        first = await communicator.receive_json_from(timeout=10)
        await sync_to_async(cancel)()
        update = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return first, update

    first, update = async_to_sync(scenario)()
    assert [row["id"] for row in first["rows"]] == [queued.pk]
    assert update["rows"] == [] and update["removed"] == [queued.pk]


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
def test_the_api_list_has_progress_reward_and_sparkline_for_the_team_only(
    who: str, api_client_as: Any, attempt: Attempt
) -> None:
    paced_metrics(attempt.run, steps=10, seconds_apart=30)
    response = api_client_as(who).get("/api/runs?q=parity&state=running")
    if who == ANONYMOUS:
        assert response.status_code == 401
        return
    assert response.status_code == 200
    items = response.json()["items"]
    if who == OUTSIDER:
        assert items == []
        return
    (item,) = items
    assert item["name"] == "live-parity" and item["last_step"] == 10
    assert item["latest_reward"] == 0.1 and item["eta_seconds"] == pytest.approx(2700)
    assert item["sparkline"][-1] == [10, 0.1] and len(item["sparkline"]) == 10


def test_the_api_list_refuses_an_unknown_state(api_client_as: Any, attempt: Attempt) -> None:
    response = api_client_as(OWNER).get("/api/runs?state=bogus")
    assert response.status_code == 422 and "unknown state 'bogus'" in response.json()["detail"]


# --- comparing runs -----------------------------------------------------------------------------


@pytest.fixture
def pair(people: Any, version: Any) -> tuple[Run, Run]:
    first = make_run(people, version, "lr-1e-6", state="completed")
    second = make_run(people, version, "lr-3e-6", state="completed")
    for run, scale in ((first, 1.0), (second, 2.0)):
        MetricRow.objects.bulk_create(
            MetricRow(
                run=run, step=step,
                values={"reward/mean": scale * step, "actor/kl": 0.1, "mix/parity/weight": 1.0},
            )
            for step in range(1, 6)
        )  # fmt: skip
    return first, second


@pytest.mark.parametrize("who", EVERYONE)
def test_the_compare_page_and_api_follow_the_role_matrix(
    who: str, client_as: Any, api_client_as: Any, pair: tuple[Run, Run]
) -> None:
    ids = f"{pair[0].pk},{pair[1].pk}"
    page = client_as(who).get(reverse("runs:run_compare") + f"?ids={ids}")
    api = api_client_as(who).get(f"/api/runs/compare?ids={ids}")
    if who == ANONYMOUS:
        assert page.status_code == 302 and api.status_code == 401
        return
    if who == OUTSIDER:
        assert page.status_code == 404 and api.status_code == 404
        return
    assert page.status_code == 200 and api.status_code == 200
    content = page.content.decode()
    assert "lr-1e-6" in content and "lr-3e-6" in content and 'id="compare-data"' in content
    runs = api.json()["runs"]
    assert [run["name"] for run in runs] == ["lr-1e-6", "lr-3e-6"]
    assert runs[1]["series"]["reward/mean"] == [[s, 2.0 * s] for s in range(1, 6)]
    assert "mix/parity/weight" not in runs[0]["series"]  # not a chart metric


def test_the_compare_api_keeps_only_the_keys_asked_for(
    api_client_as: Any, pair: tuple[Run, Run]
) -> None:
    ids = f"{pair[0].pk},{pair[1].pk}"
    runs = api_client_as(OWNER).get(f"/api/runs/compare?ids={ids}&metrics=actor/kl").json()["runs"]
    assert [sorted(run["series"]) for run in runs] == [["actor/kl"], ["actor/kl"]]


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        ("{a}", "pick two or more runs to compare"),
        ("{a},x", "'x' is not a run id"),
        ("{a},{a}", "pick two or more runs to compare"),
        ("1,2,3,4,5,6,7,8,9", "at most 8 runs can be compared at once"),
    ],
)
def test_bad_compare_ids_are_answered_with_what_is_wrong(
    ids: str, problem: str, client_as: Any, api_client_as: Any, pair: tuple[Run, Run]
) -> None:
    query = ids.format(a=pair[0].pk)
    page = client_as(OWNER).get(reverse("runs:run_compare") + f"?ids={query}")
    assert page.status_code == 400 and html.escape(problem) in page.content.decode()
    api = api_client_as(OWNER).get(f"/api/runs/compare?ids={query}")
    assert api.status_code == 422 and api.json()["detail"] == problem


def test_a_run_of_another_team_cannot_be_compared(
    client_as: Any, api_client_as: Any, people: Any, pair: tuple[Run, Run], tmp_path: Path
) -> None:
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "config.json").write_text("{}")
    theirs = services.model_register(
        actor=people.outsider, team=people.other_team, slug="o", title="O",
        path=str(tmp_path / "o"),
    )  # fmt: skip
    foreign = Run.objects.create(
        team=people.other_team, created_by=people.outsider, name="theirs", request={}, spec={},
        pins={}, model_version=theirs, state="completed",
    )  # fmt: skip
    ids = f"{pair[0].pk},{foreign.pk}"
    assert client_as(OWNER).get(reverse("runs:run_compare") + f"?ids={ids}").status_code == 404
    assert api_client_as(OWNER).get(f"/api/runs/compare?ids={ids}").status_code == 404


def test_the_compare_page_without_ids_offers_the_teams_runs(
    client_as: Any, pair: tuple[Run, Run]
) -> None:
    url = reverse("runs:run_compare") + f"?with={pair[1].pk}"
    content = client_as(OWNER).get(url).content.decode()
    assert "lr-1e-6" in content and 'name="ids"' in content
    # Coming from a run's page, that run is ticked, the other is not.
    assert f'value="{pair[1].pk}" checked' in content
    assert f'value="{pair[0].pk}" checked' not in content


# --- the run page's header ----------------------------------------------------------------------


def test_the_run_header_shows_attempt_hosts_policy_version_and_the_values_in_force(
    client_as: Any, people: Any, attempt: Attempt
) -> None:
    run = attempt.run
    sink = ConsoleSink(attempt)
    paced_metrics(run, steps=10, seconds_apart=30)
    sink.trajectories(
        [
            {
                "messages": [], "prompt": "p", "completion": "c", "observations": [],
                "reward": {"total": 1.0, "breakdown": {}, "details": {}},
                "finish_reason": "stop", "response_tokens": 1, "task_id": "1",
                "provenance": {"step": 10, "policy_version": 10, "domain": "parity", "group": 0},
            }
        ]
    )  # fmt: skip
    url = reverse("runs:run_detail", args=[run.pk])
    content = client_as(OWNER).get(url).content.decode()
    assert "#1" in content and "gpu-7" in content
    assert 'id="run-policy-version">10<' in content
    assert "KL coef 0.02" in content and "temperature 0.9" in content and "ETA 45 min" in content
    assert 'placeholder="now 0.02"' in content and 'placeholder="now 0.9"' in content
    # A live edit: asked for, then the job applies one value and refuses another.
    services.run_command(
        actor=people.owner, run=run, kind="overrides",
        payload={"kl_coef": 0.05, "temperature": 0.7}, reason="cooler",
    )  # fmt: skip
    sink.event("kl.coef_changed", {"step": 11, "old": 0.02, "new": 0.05})
    sink.event("control.override_refused", {"step": 11, "reason": "kl_coef > 0 needs kl.ref"})
    part = client_as(OWNER).get(url + "?part=live", HTTP_HX_REQUEST="true").content.decode()
    assert "KL coef 0.05" in part and "temperature 0.9" in part
    assert "control.overrides_requested" in part and "kl.coef_changed" in part
    assert "control.override_refused" in part and "kl_coef &gt; 0 needs kl.ref" in part


def test_the_charts_cover_per_criterion_rewards_and_leave_out_the_mix() -> None:
    from console.runs import live

    for key in ("reward/parity/answer/mean", "reward/parity/answer/std", "critic/score/mean"):
        assert live.is_chart_key(key) == (key != "critic/score/mean")  # the alias: drawn once
    assert not live.is_chart_key("mix/parity/weight")


def test_a_new_run_of_the_team_joins_an_open_list(
    client_as: Any, people: Any, version: Any, attempt: Attempt
) -> None:
    client = client_as(OWNER)

    def launch() -> int:
        run = make_run(people, version, "just-launched", state="queued")
        services.notify(run, "run.created", {"state": run.state})  # what run_launch sends
        return run.pk

    async def scenario() -> tuple[Any, Any, int]:
        communicator = list_socket(client)
        assert (await communicator.connect(timeout=10))[0]
        first = await communicator.receive_json_from(timeout=10)
        new_id = await sync_to_async(launch)()
        update = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return first, update, new_id

    first, update, new_id = async_to_sync(scenario)()
    assert [row["id"] for row in first["rows"]] == [attempt.run_id]
    assert [row["id"] for row in update["rows"]] == [new_id] and update["removed"] == []
    assert "just-launched" in update["rows"][0]["html"] and "0/100" in update["rows"][0]["html"]
