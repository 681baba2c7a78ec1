"""The scheduler's pages, live (`/ws/scheduling/queue/`, `/ws/scheduling/fleet/`,
`/ws/scheduling/inbox/`): the role matrix for each socket, the origin check, team scoping of a
member's queue, rings only after commit, one ring for a burst, and the pages naming their
socket instead of polling. Real PostgreSQL, the real channel layer (Redis) and the ASGI app."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.asgi import application
from console.broadcast import flush_soon
from console.runs import services as runs_services
from console.runs.models import Host, HostState, Run
from console.scheduling import services
from console.scheduling.models import PreemptionRequest, PriorityClass
from tests.console import test_runs_views
from tests.console.factories import ADMINS, ANONYMOUS, EVERYONE, OUTSIDER, OWNER, TEAMMATE_ADMIN
from tests.console.test_runs_list_live import headers
from tests.console.test_runs_views import Lab
from tests.console.test_scheduling_services import full_fleet, host, launch  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
lab = test_runs_views.lab  # the fixture: a model, the parity domain, a run

PAGES = ("queue", "fleet", "inbox")


def socket(client: Client, page: str, **kw: Any) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, f"/ws/scheduling/{page}/", headers=headers(client, **kw)
    )


def connect(client: Client, page: str, **kw: Any) -> tuple[bool, Any]:
    async def go() -> tuple[bool, Any]:
        communicator = socket(client, page, **kw)
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected, code

    return async_to_sync(go)()


def rings(client: Client, page: str, change: Any, *, wait_s: float = 1.0) -> list[Any]:
    """Opens `page`'s socket, runs `change()` (sync, in its own transaction), and returns the
    messages the socket sent within `wait_s`."""

    async def go() -> list[Any]:
        communicator = socket(client, page)
        connected, code = await communicator.connect(timeout=10)
        assert connected, code
        await sync_to_async(change)()
        await sync_to_async(flush_soon)()
        got = []
        while not await communicator.receive_nothing(timeout=wait_s):
            got.append(await communicator.receive_json_from(timeout=1))
        await communicator.disconnect()
        return got

    return async_to_sync(go)()


def answer_to(
    client: Client, page: str, act: Callable[[WebsocketCommunicator], Awaitable[Any]]
) -> Any:
    """Opens `page`'s socket, awaits `act(socket)` and returns what the socket sent next."""

    async def go() -> Any:
        communicator = socket(client, page)
        assert (await communicator.connect(timeout=10))[0]
        await act(communicator)
        output = await communicator.receive_output(timeout=10)
        await communicator.disconnect()
        return output

    return async_to_sync(go)()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_role_matrix_of_the_sockets(who: str, client_as: Any, people: Any) -> None:
    client = client_as(who)
    for page in PAGES:  # one database per role: a transactional test's setup is the cost
        connected, code = connect(client, page)
        if who == ANONYMOUS:
            assert (connected, code) == (False, 4401), page
        elif page == "inbox" and who not in ADMINS:
            assert (connected, code) == (False, 4403), page  # admins only, like its page
        else:
            assert connected, (page, code)  # queue and fleet: any member (outsiders: theirs)


def test_a_user_without_a_team_is_refused(people: Any) -> None:
    client = Client()
    get_user_model().objects.create_user(username="loner", password="loner-password-1")
    assert client.login(username="loner", password="loner-password-1")
    for page in PAGES:
        assert connect(client, page) == (False, 4404)


def test_a_foreign_origin_is_refused(client_as: Any, people: Any) -> None:
    admin = client_as(TEAMMATE_ADMIN)
    for page in PAGES:
        assert connect(admin, page, origin="http://evil.example")[0] is False
        assert connect(admin, page)[0] is True


def test_a_members_queue_rings_for_their_teams_runs_and_no_other(client_as: Any, lab: Lab) -> None:
    def launch_one() -> None:
        launch(lab, "queued-now")

    owner = rings(client_as(OWNER), "queue", launch_one)
    outsider = rings(client_as(OUTSIDER), "queue", launch_one)
    admin = rings(client_as(TEAMMATE_ADMIN), "queue", launch_one)  # every team's queue
    assert owner and all(m["type"] == "changed" for m in owner)
    assert outsider == []
    assert admin and admin[0]["type"] == "changed"


def test_each_steps_metrics_ring_no_scheduling_page(client_as: Any, lab: Lab) -> None:
    def metrics() -> None:
        runs_services.notify(lab.run, "run.metrics", {"step": 3, "keys": ["reward/mean"]})

    for who, page in ((OWNER, "queue"), (TEAMMATE_ADMIN, "queue"), (OWNER, "fleet")):
        assert rings(client_as(who), page, metrics) == [], (who, page)


def test_a_ring_carries_nothing_but_its_sequence(client_as: Any, lab: Lab) -> None:
    got = rings(client_as(OWNER), "fleet", lambda: launch(lab, "queued-now"))
    assert got and set(got[0]) == {"type", "seq"} and got[0]["seq"] == 1


def test_a_burst_of_changes_is_one_ring(client_as: Any, lab: Lab) -> None:
    def burst() -> None:
        for i in range(20):
            launch(lab, f"burst-{i}")

    got = rings(client_as(TEAMMATE_ADMIN), "queue", burst)
    assert 1 <= len(got) < 20  # rings coalesce within RING_GAP_S
    assert [m["seq"] for m in got] == list(range(1, len(got) + 1))


def test_a_rolled_back_change_rings_nobody(client_as: Any, lab: Lab) -> None:
    def rolled_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            launch(lab, "never-committed")
            raise RuntimeError("roll back")

    assert rings(client_as(TEAMMATE_ADMIN), "queue", rolled_back) == []
    assert not Run.objects.filter(name="never-committed").exists()


def test_the_fleet_rings_when_an_admin_cordons_a_host(
    client_as: Any,
    full_fleet: tuple[Lab, Run],  # noqa: F811
) -> None:
    lab, _ = full_fleet
    host = Host.objects.get(name="cpu-a")

    def cordon() -> None:
        services.host_act(
            actor=lab.people.teammate_admin, team=lab.people.team, host=host, action="cordon"
        )

    got = rings(client_as(OUTSIDER), "fleet", cordon)  # every member sees the whole fleet
    assert got and got[0]["type"] == "changed"


def test_the_fleet_rings_when_a_host_goes_silent_and_when_it_beats_again(
    client_as: Any, lab: Lab
) -> None:
    """The periodic tick (the sweep) rings the fleet when it marks a host offline, the first
    beat after the silence rings it again; the sweeps and beats between change nothing shown
    and ring nothing."""
    lab.run.delete()  # no queued run: a pass rings no run notice
    host("cpu-a")
    client = client_as(OUTSIDER)  # every member sees the whole fleet
    long_ago = timezone.now() - dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S + 5)

    def go_silent() -> None:
        Host.objects.filter(name="cpu-a").update(heartbeat_at=long_ago)
        runs_services.sweep()

    got = rings(client, "fleet", go_silent)
    assert got and got[0]["type"] == "changed"
    assert Host.objects.get(name="cpu-a").state == HostState.OFFLINE
    assert rings(client, "fleet", runs_services.sweep) == []  # still offline: silence

    def beat() -> None:
        runs_services.host_heartbeat(name="cpu-a", attempt_ids=[])

    assert rings(client, "fleet", beat)
    assert Host.objects.get(name="cpu-a").state == HostState.READY
    assert rings(client, "fleet", beat) == []  # an ordinary beat rings nothing


def test_the_inbox_rings_when_a_request_is_filed_and_when_it_is_decided(
    client_as: Any,
    full_fleet: tuple[Lab, Run],  # noqa: F811
) -> None:
    lab, _ = full_fleet
    admin = client_as(TEAMMATE_ADMIN)
    PriorityClass.objects.create(name="urgent", value=1000, can_preempt=True, preemptible=False)

    def file() -> None:
        launch(lab, "urgent-run", priority_class="urgent")
        services.schedule_pass()

    assert rings(admin, "inbox", file)
    request = PreemptionRequest.objects.get()

    def reject() -> None:
        services.preemption_reject(
            actor=lab.people.teammate_admin, request=request, reason="paper deadline"
        )

    assert rings(admin, "inbox", reject)
    assert rings(admin, "inbox", lambda: None) == []  # nothing changed: silence


def test_logging_out_closes_the_socket(client_as: Any, people: Any) -> None:
    client = client_as(TEAMMATE_ADMIN)
    output = answer_to(
        client, "inbox", lambda _: sync_to_async(client.post)(reverse("accounts:logout"))
    )
    assert output["type"] == "websocket.close" and output["code"] == 4401


@pytest.mark.parametrize("name", PAGES)
def test_the_pages_name_their_socket_and_no_longer_poll(
    name: str, client_as: Any, lab: Lab
) -> None:
    page = client_as(TEAMMATE_ADMIN).get(reverse(f"scheduling:{name}")).content.decode()
    assert f'data-ws="/ws/scheduling/{name}/"' in page and "scheduling-live.js" in page
    assert 'hx-trigger="live-changed"' in page and 'hx-trigger="every' not in page


def test_the_fleet_rings_for_another_teams_runs_without_naming_them(
    client_as: Any, lab: Lab
) -> None:
    got = rings(client_as(OUTSIDER), "fleet", lambda: launch(lab, "someone-elses"))
    assert got and all(set(m) == {"type", "seq"} for m in got)  # a doorbell, no run in it


def test_a_frame_the_socket_cannot_read_closes_it(client_as: Any, people: Any) -> None:
    output = answer_to(
        client_as(TEAMMATE_ADMIN), "queue", lambda ws: ws.send_to(bytes_data=b"\x00")
    )
    assert output["type"] == "websocket.close" and output["code"] == 1003
