"""TeamGroupConsumer: the base every team-scoped live stream uses, over the real channel layer."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.urls import path

from console.broadcast import TeamGroupConsumer, broadcast_on_commit, team_group
from tests.console.factories import ANONYMOUS, EVERYONE, READERS, TEAMMATE_ANNOTATOR


class ThingsConsumer(TeamGroupConsumer):
    topic = "things"


class ResearchersOnlyConsumer(TeamGroupConsumer):
    topic = "things"
    min_role = "researcher"


application = AuthMiddlewareStack(
    URLRouter(
        [
            path("ws/things/<int:team_id>/", ThingsConsumer.as_asgi()),
            path("ws/researchers/<int:team_id>/", ResearchersOnlyConsumer.as_asgi()),
        ]
    )
)


def headers_for(client) -> list[tuple[bytes, bytes]]:
    cookie = client.cookies.get(settings.SESSION_COOKIE_NAME)
    return (
        [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie.value}".encode())] if cookie else []
    )


def connect_and_listen(url: str, headers, team_id: int):
    async def scenario():
        communicator = WebsocketCommunicator(application, url, headers=headers)
        connected, code = await communicator.connect(timeout=10)
        received = None
        if connected:
            await sync_to_async(broadcast_on_commit)(
                team_group(team_id, "things"), "thing.changed", {"id": 3}
            )
            received = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return connected, code, received

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who", EVERYONE)
def test_only_members_of_the_team_join_its_stream(who, client_as, people):
    team_id = people.team.pk
    connected, code, received = connect_and_listen(
        f"/ws/things/{team_id}/", headers_for(client_as(who)), team_id
    )
    if who in READERS:
        assert connected
        assert received == {"event": "thing.changed", "id": 3}
    else:
        assert not connected
        assert code == (4401 if who == ANONYMOUS else 4404)


@pytest.mark.django_db(transaction=True)
def test_a_team_that_does_not_exist_looks_like_another_teams(client_as, people):
    connected, code, _ = connect_and_listen(
        "/ws/things/999999/", headers_for(client_as("owner")), 999999
    )
    assert (connected, code) == (False, 4404)


@pytest.mark.django_db(transaction=True)
def test_a_stream_for_researchers_refuses_an_annotator(client_as, people):
    team_id = people.team.pk
    connected, code, _ = connect_and_listen(
        f"/ws/researchers/{team_id}/", headers_for(client_as(TEAMMATE_ANNOTATOR)), team_id
    )
    assert (connected, code) == (False, 4403)


@pytest.mark.django_db(transaction=True)
def test_notices_sent_without_waiting_arrive_in_order_after_commit():
    from channels.layers import get_channel_layer
    from django.db import transaction

    from console.broadcast import flush_soon

    layer = get_channel_layer()

    async def listen(count: int) -> list[dict]:
        channel = await layer.new_channel()
        await layer.group_add("run.test-soon", channel)
        await sync_to_async(send_batches)(count)
        received = [await layer.receive(channel) for _ in range(count)]
        await layer.group_discard("run.test-soon", channel)
        return received

    def send_batches(count: int) -> None:
        for index in range(count):
            with transaction.atomic():
                broadcast_on_commit("run.test-soon", "run.trajectories", {"i": index}, wait=False)
        flush_soon()

    received = async_to_sync(listen)(20)
    assert [message["payload"]["i"] for message in received] == list(range(20))


@pytest.mark.django_db(transaction=True)
def test_doorbells_committed_together_ring_at_least_once_and_last_after_every_row():
    import asyncio

    from channels.layers import get_channel_layer
    from django.db import transaction

    from console.broadcast import flush_soon

    layer = get_channel_layer()

    async def listen() -> list[dict]:
        channel = await layer.new_channel()
        await layer.group_add("run.test-doorbell", channel)
        await layer.group_add("run.test-notices", channel)
        await sync_to_async(send)()
        received = []
        while True:
            try:
                received.append(await asyncio.wait_for(layer.receive(channel), timeout=2.0))
            except TimeoutError:
                break
        await layer.group_discard("run.test-doorbell", channel)
        await layer.group_discard("run.test-notices", channel)
        return received

    def send() -> None:
        with transaction.atomic():
            for index in range(50):
                broadcast_on_commit(
                    "run.test-doorbell", "run.event", {"i": index}, wait=False, doorbell=True
                )
                broadcast_on_commit("run.test-notices", "run.event", {"n": index}, wait=False)
        flush_soon()

    received = async_to_sync(listen)()
    rings = [m["payload"]["i"] for m in received if "i" in m["payload"]]
    notices = [m["payload"]["n"] for m in received if "n" in m["payload"]]
    # Every plain notice, in order; the doorbells at least once, the last one last.
    assert notices == list(range(50))
    assert 1 <= len(rings) <= 50 and rings[-1] == 49 and rings == sorted(rings)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_receive_ends_whenever_the_cancel_lands():
    # A page's channel-layer receive is cancelled when the page leaves (and when a test's event
    # loop closes). Python 3.11's asyncio.wait_for loses a cancellation that lands as the call
    # it waits for completes, and redis-py sends every command through wait_for when the
    # connection has a socket timeout: a receive cancelled while its blocking pop was being
    # sent went on popping (channels_redis pops again while a pop comes back empty) until a
    # read timed out, or forever with a timeout longer than the pop's. Cancelled after each
    # number of loop steps in turn, every receive must end, cancelled, at once.
    import asyncio

    from channels.layers import get_channel_layer

    layer = get_channel_layer()

    async def scenario() -> list[int]:
        stuck = []
        try:
            for steps in range(40):
                channel = await layer.new_channel()
                task = asyncio.ensure_future(layer.receive(channel))
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=3)
                if not (task in done and task.cancelled()):
                    stuck.append(steps)
        finally:
            if stuck:  # end the lost receives (their reads fail) rather than hang the test
                await layer.close_pools()
        return stuck

    assert async_to_sync(scenario)() == []
