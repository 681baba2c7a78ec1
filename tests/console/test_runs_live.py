"""A run's live stream `/ws/runs/<id>/` over the real channel layer and PostgreSQL: who may
watch, the snapshot, deltas after the sink commits, reconnecting without gap or duplicate,
and the server-side downsampling."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.test import Client
from django.utils.timezone import now

from console.asgi import application
from console.broadcast import flush_soon
from console.runs import live, rollup, services
from console.runs.models import Attempt, Host, MetricRollup, MetricRow, Run, RunEvent
from console.runs.sink import ConsoleSink, copy_trajectory_rows, trajectory_row
from tests.console.factories import ANONYMOUS, EVERYONE, OWNER, READERS, attempt_create

pytestmark = pytest.mark.django_db(transaction=True)


def trajectory(step: int, group: int, reward: float = 1.0) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Is 4 even?"}],
        "prompt": "Is 4 even?",
        "completion": "\\boxed{even} " + "x" * 500,
        "observations": [],
        "reward": {"total": reward, "breakdown": {"answer": reward}, "details": {}},
        "finish_reason": "stop",
        "response_tokens": 5,
        "task_id": "7",
        "provenance": {"step": step, "policy_version": step, "domain": "parity", "group": group},
    }


def train_metrics(step: int) -> dict[str, float]:
    return {
        "reward/mean": step / 10,
        "reward/parity/mean": step / 20,
        "actor/kl": 0.01 * step,
        "timing_s/step": 1.5,
        "mix/parity/weight": 1.0,  # not a chart key: never sent
    }


@pytest.fixture
def attempt(people: Any, tmp_path: Path) -> Attempt:
    (tmp_path / "config.json").write_text("{}")
    version = services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )
    run = Run.objects.create(
        team=people.team, created_by=people.owner, name="r", request={}, spec={},
        pins={"domains": [{"slug": "parity"}]}, model_version=version, state="running",
        max_steps=100,
    )  # fmt: skip
    host = Host.objects.create(name="h", cpu_slots=1)
    return attempt_create(run, host, state="running")


def headers(client: Client, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    result = [(b"host", b"testserver"), (b"origin", origin.encode())]
    cookie = client.cookies.get(django_settings.SESSION_COOKIE_NAME)
    if cookie:
        name = django_settings.SESSION_COOKIE_NAME
        result.append((b"cookie", f"{name}={cookie.value}".encode()))
    return result


def socket(client: Client, run_id: int, query: str = "", **kw: Any) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, f"/ws/runs/{run_id}/{query}", headers=headers(client, **kw)
    )


def db_points(run_id: int) -> dict[tuple[str, int], float]:
    return {
        (key, row.step): value
        for row in MetricRow.objects.filter(run_id=run_id)
        for key, value in row.values.items()
        if live.is_chart_key(key) and isinstance(value, float | int)
    }


def points_of(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [
        (key, step) for m in messages for key, points in m["series"].items() for step, _ in points
    ]


async def write(sink: ConsoleSink, fn: str, *args: Any) -> None:
    await sync_to_async(getattr(sink, fn))(*args)
    await sync_to_async(flush_soon)()


@contextlib.contextmanager
def writer_a_open(write_a: Callable[[], None]) -> Iterator[Callable[[], None]]:
    """Writer A: `write_a` runs in a transaction on another thread, which is left open (its
    row ids and its transaction id drawn, nothing committed) while the block runs. Yields
    `commit`, which lets A commit (then send its notices) and waits for it; the block's end
    does so too. What A raised is raised here."""
    wrote, may_commit = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                write_a()
                wrote.set()
                assert may_commit.wait(10)
            flush_soon()
        except BaseException as error:
            failed.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)

    def commit() -> None:
        may_commit.set()
        thread.join(30)
        assert not thread.is_alive()
        if failed:
            raise failed[0]

    thread.start()
    try:
        assert wrote.wait(10) or failed, "writer A did not write"
        if failed:
            raise failed[0]
        yield commit
    finally:
        may_commit.set()
        thread.join(30)


# --- who may watch ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
def test_the_team_may_watch_and_outsiders_cannot_tell_the_run_exists(
    who: str, client_as: Any, attempt: Attempt
) -> None:
    client = client_as(who)

    async def scenario() -> tuple[bool, Any, Any]:
        communicator = socket(client, attempt.run_id)
        connected, code = await communicator.connect(timeout=10)
        first = await communicator.receive_json_from(timeout=10) if connected else None
        await communicator.disconnect()
        return connected, code, first

    connected, code, first = async_to_sync(scenario)()
    if who in READERS:
        assert connected and first["type"] == "snapshot" and first["seq"] == 1
    else:
        assert not connected
        assert code == (4401 if who == ANONYMOUS else 4404)


def test_a_missing_run_is_refused_like_another_teams_run(client_as: Any, attempt: Attempt) -> None:
    client = client_as(OWNER)

    async def scenario() -> tuple[bool, Any]:
        communicator = socket(client, attempt.run_id + 1000)
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4404)


def test_a_foreign_origin_is_refused(client_as: Any, attempt: Attempt) -> None:
    client = client_as(OWNER)

    async def scenario() -> bool:
        communicator = socket(client, attempt.run_id, origin="http://evil.example")
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


# --- snapshot and deltas ------------------------------------------------------------------------


def test_the_snapshot_holds_the_series_events_and_newest_trajectories(
    client_as: Any, attempt: Attempt
) -> None:
    sink = ConsoleSink(attempt)
    sink.event("run.started", {"step": 0})
    for step in (1, 2, 3):
        sink.metrics(step, train_metrics(step))
        sink.trajectories([trajectory(step, g) for g in range(10)])
    sink.metrics(3, {"eval/reward/mean": 0.5, "actor/entropy": float("nan")})
    sink.event("control.overrides_applied", {"step": 2, "reason": "hotter"})
    client = client_as(OWNER)

    async def scenario() -> Any:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        snapshot = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return snapshot

    snapshot = async_to_sync(scenario)()
    assert snapshot["type"] == "snapshot" and snapshot["seq"] == 1
    assert snapshot["state"] == "running" and snapshot["last_step"] == 3
    assert snapshot["max_steps"] == 100
    got = {(k, s): v for k, pts in snapshot["series"].items() for s, v in pts}
    assert got == db_points(attempt.run_id)
    assert "mix/parity/weight" not in snapshot["series"]
    assert "actor/entropy" not in snapshot["series"]  # NaN is stored as null: no point
    assert snapshot["series"]["eval/reward/mean"] == [[3, 0.5]]
    assert [(e["kind"], e["step"]) for e in snapshot["events"]] == [
        ("run.started", 0),
        ("control.overrides_applied", 2),
    ]
    assert snapshot["events"][1]["reason"] == "hotter"
    feed = snapshot["trajectories"]
    assert len(feed) == 20 and (feed[0]["step"], feed[0]["index"]) == (3, 9)
    assert feed[0]["domain"] == "parity" and feed[0]["finish_reason"] == "stop"
    assert feed[0]["completion"].startswith("\\boxed{even}") and len(feed[0]["completion"]) == 200
    assert snapshot["cursors"] == {
        "metric_step": 3,
        "metric_keys": ["actor/kl", "eval/reward/mean", "reward/mean"]
        + ["reward/parity/mean", "timing_s/step"],
        "event_xid": snapshot["cursors"]["event_xid"],
        "event_sent": [],
        "metric_xid": snapshot["cursors"]["event_xid"],  # one horizon for the three
        "metric_sent": [],
        "trajectory_xid": snapshot["cursors"]["event_xid"],
        "trajectory_sent": [],
    }
    # Past every event written so far: a resume from here gets none of them again.
    newest = RunEvent.objects.filter(run_id=attempt.run_id).order_by("-xid").first()
    assert newest is not None and snapshot["cursors"]["event_xid"] > newest.xid


def test_a_delta_follows_each_commit_of_the_sink(client_as: Any, attempt: Attempt) -> None:
    sink = ConsoleSink(attempt)
    client = client_as(OWNER)

    async def scenario() -> list[dict[str, Any]]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        received = [await communicator.receive_json_from(timeout=10)]
        await write(sink, "metrics", 1, train_metrics(1))
        received.append(await communicator.receive_json_from(timeout=10))
        # The step's held-out evaluation merges into the same row: only the new keys come.
        await write(sink, "metrics", 1, {"eval/reward/mean": 0.25})
        received.append(await communicator.receive_json_from(timeout=10))
        await write(sink, "trajectories", [trajectory(1, g) for g in range(3)])
        received.append(await communicator.receive_json_from(timeout=10))
        await write(sink, "event", "checkpoint.saved", {"step": 1, "reason": "periodic"})
        received.append(await communicator.receive_json_from(timeout=10))
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return received

    snapshot, metrics, evaluation, trajectories, event = async_to_sync(scenario)()
    assert snapshot["series"] == {} and snapshot["cursors"]["metric_step"] == -1
    assert [m["seq"] for m in (metrics, evaluation, trajectories, event)] == [2, 3, 4, 5]
    assert all(m["type"] == "delta" for m in (metrics, evaluation, trajectories, event))
    assert metrics["series"] == {
        "actor/kl": [[1, 0.01]],
        "reward/mean": [[1, 0.1]],
        "reward/parity/mean": [[1, 0.05]],
        "timing_s/step": [[1, 1.5]],
    }
    assert metrics["last_step"] == 1
    assert evaluation["series"] == {"eval/reward/mean": [[1, 0.25]]}
    assert [(t["step"], t["index"]) for t in trajectories["trajectories"]] == [
        (1, 2),
        (1, 1),
        (1, 0),
    ]
    assert trajectories["series"] == {}
    assert [(e["kind"], e["reason"]) for e in event["events"]] == [("checkpoint.saved", "periodic")]


def test_reconnecting_with_resume_gets_what_was_missed_without_gap_or_duplicate(
    client_as: Any, attempt: Attempt
) -> None:
    sink = ConsoleSink(attempt)
    for step in (1, 2):
        sink.metrics(step, train_metrics(step))
    client = client_as(OWNER)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        first = [await communicator.receive_json_from(timeout=10)]
        for step in (3, 4):
            await write(sink, "metrics", step, train_metrics(step))
            first.append(await communicator.receive_json_from(timeout=10))
        await communicator.disconnect()  # the socket dies mid-run
        for step in range(5, 12):
            await write(sink, "metrics", step, train_metrics(step))
            await write(sink, "trajectories", [trajectory(step, 0)])
        await write(sink, "metrics", 11, {"eval/reward/mean": 0.75})
        again = socket(client, attempt.run_id, "?resume=1")
        assert (await again.connect(timeout=10))[0]
        await again.send_json_to({"type": "resume", "since": first[-1]["cursors"]})
        second = [await again.receive_json_from(timeout=10)]
        await write(sink, "metrics", 12, train_metrics(12))
        second.append(await again.receive_json_from(timeout=10))
        assert await again.receive_nothing(timeout=0.3)
        await again.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    assert second[0]["type"] == "delta" and [m["seq"] for m in second] == [1, 2]
    received = points_of(first + second)
    assert len(received) == len(set(received)), "a point was sent twice"
    union = {(k, s): v for m in first + second for k, pts in m["series"].items() for s, v in pts}
    assert union == db_points(attempt.run_id)
    assert {t["step"] for t in second[0]["trajectories"]} == set(range(5, 12))


def test_a_resume_with_nothing_missed_is_answered_with_an_empty_delta(
    client_as: Any, attempt: Attempt
) -> None:
    ConsoleSink(attempt).metrics(1, train_metrics(1))
    client = client_as(OWNER)

    async def scenario() -> dict[str, Any]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        snapshot = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        again = socket(client, attempt.run_id, "?resume=1")
        assert (await again.connect(timeout=10))[0]
        await again.send_json_to({"type": "resume", "since": snapshot["cursors"]})
        answer = await again.receive_json_from(timeout=10)
        await again.disconnect()
        return answer

    answer = async_to_sync(scenario)()
    assert answer["type"] == "delta" and answer["series"] == {} and answer["events"] == []


def test_a_restarted_attempt_tells_the_page_to_drop_what_came_after_its_checkpoint(
    client_as: Any, attempt: Attempt
) -> None:
    sink = ConsoleSink(attempt)
    for step in (1, 2, 3):
        sink.metrics(step, train_metrics(step))
    client = client_as(OWNER)

    async def scenario() -> dict[str, Any]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        await communicator.receive_json_from(timeout=10)
        await write(sink, "event", "run.started", {"step": 1})
        restart = await communicator.receive_json_from(timeout=10)
        await write(sink, "metrics", 2, train_metrics(2))
        again = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return {"restart": restart, "again": again}

    got = async_to_sync(scenario)()
    assert got["restart"]["truncate_after"] == 1
    assert got["restart"]["cursors"]["metric_step"] == 1
    assert got["again"]["series"]["reward/mean"] == [[2, 0.2]]


def test_pages_of_one_process_share_one_subscription_to_the_run(
    client_as: Any, attempt: Attempt
) -> None:
    from channels.layers import get_channel_layer

    client = client_as(OWNER)
    layer = get_channel_layer()
    group = services.run_group(attempt.run_id)

    async def members() -> int:
        return int(await layer.connection(0).zcard(layer._group_key(group)))

    async def scenario() -> tuple[list[int], list[dict[str, Any]]]:
        pages = [socket(client, attempt.run_id) for _ in range(3)]
        counts = []
        for page in pages:
            assert (await page.connect(timeout=10))[0]
            await page.receive_json_from(timeout=10)
            counts.append(await members())
        await write(ConsoleSink(attempt), "metrics", 1, train_metrics(1))
        deltas = [await page.receive_json_from(timeout=10) for page in pages]
        for page in pages:
            await page.disconnect()
        counts.append(await members())
        return counts, deltas

    counts, deltas = async_to_sync(scenario)()
    assert counts == [1, 1, 1, 0]  # one channel in Redis for three pages; none once they left
    assert all(d["series"]["reward/mean"] == [[1, 0.1]] for d in deltas)


def test_an_event_committed_after_a_newer_one_was_shown_is_still_sent(
    client_as: Any, attempt: Attempt
) -> None:
    # Writer A draws its event's id (and transaction id) first and commits last; writer B
    # commits in between. A stream that followed ids would have shown B's event and skipped
    # A's for good; one that waited for the oldest open transaction would have held B's back
    # until A ended.
    client = client_as(OWNER)

    def write_a() -> None:
        ConsoleSink(attempt).event("test.a", {"reason": "first id, last commit"})

    async def scenario() -> list[dict[str, Any]]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        messages = [await communicator.receive_json_from(timeout=10)]
        with writer_a_open(write_a) as commit_a:
            await write(ConsoleSink(attempt), "event", "test.b", {"reason": "second id"})
            # B's event is sent while A's transaction is still open.
            messages.append(await communicator.receive_json_from(timeout=10))
            assert await communicator.receive_nothing(timeout=0.3)
            await asyncio.to_thread(commit_a)
        messages.append(await communicator.receive_json_from(timeout=10))
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return messages

    snapshot, b_delta, a_delta = async_to_sync(scenario)()
    assert snapshot["events"] == []
    assert [e["kind"] for e in b_delta["events"]] == ["test.b"]
    assert [e["kind"] for e in a_delta["events"]] == ["test.a"]
    assert a_delta["events"][0]["id"] < b_delta["events"][0]["id"]
    # B's transaction is past the horizon (A's, still open) and was sent: it is recorded in
    # the cursor until the horizon passes it.
    assert b_delta["cursors"]["event_sent"] and not b_delta["held_back"]


def test_a_metric_and_a_trajectory_committed_after_newer_ones_were_shown_are_still_sent(
    client_as: Any, attempt: Attempt
) -> None:
    # As for events: writer A draws the first ids of a metric row and a trajectory and commits
    # last; writer B (the attempt's sink) writes a later step and commits in between. A cursor
    # on the newest step or [step, index] would have skipped A's rows for good. (A writes the
    # rows only: the sink's counters on the run row would make B wait for A's commit, which is
    # not the case under test.)
    client = client_as(OWNER)

    def write_a() -> None:
        MetricRow.objects.create(run_id=attempt.run_id, step=1, values=train_metrics(1))
        copy_trajectory_rows(
            [trajectory_row(attempt.run_id, attempt.pk, 0, trajectory(1, 0), now())]
        )
        services.notify(attempt.run, "run.metrics", {"step": 1}, wait=False)

    async def scenario() -> list[dict[str, Any]]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        messages = [await communicator.receive_json_from(timeout=10)]
        with writer_a_open(write_a) as commit_a:
            sink = ConsoleSink(attempt)
            await sync_to_async(sink.metrics)(2, train_metrics(2))
            await write(sink, "trajectories", [trajectory(2, 0)])
            # B's rows are sent while A's transaction is still open (one delta or two).
            while not messages[-1]["trajectories"]:
                messages.append(await communicator.receive_json_from(timeout=10))
            assert await communicator.receive_nothing(timeout=0.3)
            b_count = len(messages)
            await asyncio.to_thread(commit_a)
        messages.append(await communicator.receive_json_from(timeout=10))
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        messages.insert(b_count, {"b_ends": True})
        return messages

    messages = async_to_sync(scenario)()
    split = next(i for i, m in enumerate(messages) if m.get("b_ends"))
    before, after = messages[:split], messages[split + 1 :]
    assert before[0]["series"] == {} and before[0]["trajectories"] == []
    assert {step for _, step in points_of(before)} == {2}
    assert {step for _, step in points_of(after)} == {1}
    # Every point and every trajectory stored arrived once.
    shown = points_of(before + after)
    assert len(shown) == len(set(shown)) and set(shown) == set(db_points(attempt.run_id))
    feed = [(t["step"], t["index"]) for m in before + after for t in m["trajectories"]]
    assert feed == [(2, 0), (1, 0)]
    stored = MetricRow.objects.filter(run_id=attempt.run_id).order_by("step")
    assert stored[0].pk < stored[1].pk  # A's row has the smaller id: out of id order


def test_a_page_too_far_behind_gets_a_snapshot_of_the_same_moment(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The delta turns into a snapshot inside its own transaction, which the snapshot joins.
    monkeypatch.setattr(live, "DELTA_MAX_STEPS", 3)
    sink = ConsoleSink(attempt)
    sink.metrics(1, train_metrics(1))
    start = live.snapshot(attempt.run_id)
    for step in range(2, 7):
        sink.metrics(step, train_metrics(step))
    sink.event("test.a", {})
    message = live.delta(attempt.run_id, start["cursors"])
    assert message["type"] == "snapshot"
    assert [step for step, _ in message["series"]["reward/mean"]] == [1, 2, 3, 4, 5, 6]
    assert [e["kind"] for e in message["events"]] == ["test.a"]
    assert live.delta(attempt.run_id, message["cursors"])["events"] == []


def test_past_its_bound_of_sent_transactions_a_cursor_holds_newer_ones_back_until_the_horizon_moves(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long transaction A keeps the horizon back while B, C and D commit; the cursor may
    # record two sent transactions, so D waits (held_back) until A ends.
    monkeypatch.setattr(live, "MAX_SENT_XIDS", 2)
    with writer_a_open(lambda: ConsoleSink(attempt).event("test.a", {})):
        start = live.snapshot(attempt.run_id)
        for kind in ("test.b", "test.c", "test.d"):
            ConsoleSink(attempt).event(kind, {})
        first = live.delta(attempt.run_id, start["cursors"])
        again = live.delta(attempt.run_id, first["cursors"])
    last = live.delta(attempt.run_id, again["cursors"])
    assert [e["kind"] for e in first["events"]] == ["test.b", "test.c"]
    assert first["held_back"] and len(first["cursors"]["event_sent"]) == 2
    assert again["events"] == [] and again["held_back"]
    assert [e["kind"] for e in last["events"]] == ["test.a", "test.d"]
    assert not last["held_back"] and last["cursors"]["event_sent"] == []


def test_the_events_api_polled_by_the_last_id_misses_no_event_committed_out_of_id_order(
    api_client_as: Any, attempt: Attempt
) -> None:
    # `GET /api/runs/<id>/events?after=<last id>`: A draws the first id and commits last. A
    # list by id would have given B, and the next poll (after B's id) would have skipped A.
    api = api_client_as(OWNER)
    url = f"/api/runs/{attempt.run_id}/events"
    with writer_a_open(lambda: ConsoleSink(attempt).event("test.a", {})):
        ConsoleSink(attempt).event("test.b", {})
        polls = [api.get(f"{url}?after=0").json()]
    while True:
        after = next((p[-1]["id"] for p in reversed(polls) if p), 0)
        polls.append(api.get(f"{url}?after={after}").json())
        if not polls[-1]:
            break
    listed = [(e["kind"], e["id"]) for poll in polls for e in poll]
    stored = RunEvent.objects.filter(run_id=attempt.run_id).order_by("id")
    assert sorted(e[1] for e in listed) == list(stored.values_list("id", flat=True))
    assert [kind for kind, _ in listed] == ["test.a", "test.b"]  # B waited for A's end
    assert polls[0] == []


def test_two_concurrent_writers_lose_and_repeat_no_event_across_a_reconnect(
    client_as: Any, attempt: Attempt
) -> None:
    client = client_as(OWNER)
    per_writer = 150
    stop_reading = threading.Event()

    def writer(name: str, seed: int) -> None:
        rng = random.Random(seed)
        sink = ConsoleSink(attempt)
        written = 0
        try:
            while written < per_writer:
                with transaction.atomic():
                    for _ in range(min(rng.randint(1, 6), per_writer - written)):
                        sink.event("test.tick", {"writer": name})
                        written += 1
                        time.sleep(rng.random() * 0.004)  # interleave the two transactions
            flush_soon()
        finally:
            connections.close_all()

    async def read(communicator: WebsocketCommunicator, got: list[dict[str, Any]]) -> None:
        # (A receive that times out ends the consumer: poll for nothing first.)
        while not stop_reading.is_set() or not await communicator.receive_nothing(0.2):
            if not await communicator.receive_nothing(timeout=0.1):
                got.append(await communicator.receive_json_from(timeout=10))

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        first: list[dict[str, Any]] = []
        second: list[dict[str, Any]] = []
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        first.append(await communicator.receive_json_from(timeout=10))
        loop = asyncio.get_running_loop()
        writers = [loop.run_in_executor(None, writer, name, i) for i, name in enumerate("ab")]
        reading = asyncio.create_task(read(communicator, first))
        count = sync_to_async(RunEvent.objects.filter(run_id=attempt.run_id).count)
        while await count() < per_writer // 2:
            await asyncio.sleep(0.05)
        stop_reading.set()
        await reading
        await communicator.disconnect()  # the socket dies while both still write
        stop_reading.clear()
        again = socket(client, attempt.run_id, "?resume=1")
        assert (await again.connect(timeout=10))[0]
        await again.send_json_to({"type": "resume", "since": first[-1]["cursors"]})
        reading = asyncio.create_task(read(again, second))
        await asyncio.gather(*writers)
        await asyncio.sleep(1.0)  # the last doorbells and a held-back read's retry
        stop_reading.set()
        await reading
        await again.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    assert second[0]["type"] == "delta"
    shown = [e["id"] for m in first + second for e in m["events"]]
    stored = RunEvent.objects.filter(run_id=attempt.run_id, kind="test.tick")
    assert len(shown) == len(set(shown)), "an event was sent twice"
    assert sorted(shown) == sorted(stored.values_list("id", flat=True))
    assert len(shown) == 2 * per_writer


@pytest.mark.parametrize("since", [{"metric_step": "x"}, [], {"event_id": 1}, None])
def test_a_malformed_resume_closes_the_socket(since: Any, client_as: Any, attempt: Attempt) -> None:
    client = client_as(OWNER)

    async def scenario() -> Any:
        communicator = socket(client, attempt.run_id, "?resume=1")
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_json_to({"type": "resume", "since": since})
        output = await communicator.receive_output(timeout=10)
        await communicator.disconnect()
        return output

    output = async_to_sync(scenario)()
    assert output == {"type": "websocket.close", "code": 1007}


def test_doorbells_that_ring_during_a_read_coalesce_and_nothing_is_lost(
    client_as: Any, attempt: Attempt
) -> None:
    sink = ConsoleSink(attempt)
    client = client_as(OWNER)

    async def scenario() -> list[dict[str, Any]]:
        communicator = socket(client, attempt.run_id)
        assert (await communicator.connect(timeout=10))[0]
        received = [await communicator.receive_json_from(timeout=10)]
        for step in range(1, 41):
            await sync_to_async(sink.metrics)(step, train_metrics(step))
        await sync_to_async(flush_soon)()
        while received[-1]["cursors"]["metric_step"] < 40:
            received.append(await communicator.receive_json_from(timeout=10))
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert len(received) - 1 < 40  # 40 doorbells, fewer reads
    points = points_of(received)
    assert len(points) == len(set(points))
    assert set(points) == set(db_points(attempt.run_id))


# --- downsampling -------------------------------------------------------------------------------


def test_downsampling_keeps_each_buckets_min_and_max_and_bounds_the_points(
    attempt: Attempt,
) -> None:
    rng = random.Random(7)
    values = {step: rng.gauss(0, 1) for step in range(1, 20_001)}
    values[12_345] = 50.0  # a spike
    values[777] = -50.0
    MetricRow.objects.bulk_create(
        MetricRow(run_id=attempt.run_id, step=s, values={"reward/mean": v, "actor/kl": 1.0})
        for s, v in values.items()
    )
    rollup.rebuild(attempt.run_id)  # rows stored without the sink (which keeps the buckets)
    series = live.downsampled_series(attempt.run_id)
    points = series["reward/mean"]
    assert live.MAX_POINTS // 4 <= len(points) <= live.MAX_POINTS + 1
    assert len(series["actor/kl"]) <= live.MAX_POINTS + 1
    assert [p[0] for p in points] == sorted({p[0] for p in points})
    kept = {step for step, _ in points}
    assert {777, 12_345, 20_000} <= kept
    width = rollup.width_for(1, 20_000, live.MAX_POINTS // 2)
    for start in range(0, 20_001, width):
        bucket = {s: values[s] for s in range(max(start, 1), min(start + width, 20_001))}
        assert min(bucket, key=lambda s: (bucket[s], s)) in kept
        assert max(bucket, key=lambda s: (bucket[s], s)) in kept
    assert all(value == values[step] for step, value in points)


def test_the_sink_keeps_the_buckets_a_rebuild_would_make_also_across_a_restart(
    attempt: Attempt,
) -> None:
    rng = random.Random(3)
    sink = ConsoleSink(attempt)
    for step in range(1, 1_501):
        sink.metrics(step, {"reward/mean": rng.random(), "actor/kl": rng.random(), "x/y": 1.0})
        if step % 7 == 0:  # held-out evaluation merges into the same step
            sink.metrics(step, {"eval/reward/mean": rng.random()})
    # A new attempt resumes from step 1,000: steps after it are produced again, differently.
    sink.event("run.started", {"step": 1_000})
    for step in range(1_001, 1_201):
        sink.metrics(step, {"reward/mean": 2.0 + rng.random(), "actor/kl": rng.random()})

    def buckets() -> list[tuple[Any, ...]]:
        return sorted(
            MetricRollup.objects.filter(run_id=attempt.run_id).values_list(
                "key", "width", "bucket", "low", "low_step", "high", "high_step", "last",
                "last_step",
            )
        )  # fmt: skip

    kept = buckets()
    assert {row[0] for row in kept} == {"reward/mean", "actor/kl", "eval/reward/mean"}
    assert max(row[8] for row in kept) == 1_200
    snapshot = live.downsampled_series(attempt.run_id)
    rollup.rebuild(attempt.run_id)
    assert buckets() == kept
    assert all(value >= 2.0 for step, value in snapshot["reward/mean"] if step > 1_000)
    assert snapshot["reward/mean"][-1][0] == 1_200


def test_a_short_run_is_not_downsampled(attempt: Attempt) -> None:
    MetricRow.objects.bulk_create(
        MetricRow(run_id=attempt.run_id, step=s, values={"reward/mean": float(s)})
        for s in range(1000)
    )
    assert len(live.downsampled_series(attempt.run_id)["reward/mean"]) == 1000
