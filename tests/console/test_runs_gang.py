"""Runs on several hosts (gangs), without workers: the scheduler starts a gang on all of its
hosts or on none, in one transaction; each gang takes a rendezvous port from the range while it
runs and frees it when its nodes have exited; a node's death, or a silent host, ends the whole
attempt; what each node's agent would start (its environment and command); and `hosts` on
launch (the API and the form) is 1 to 64, refused otherwise with nothing saved. The same on
real host agents: test_runs_multihost.py."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.runs import agent
from console.runs import services as runs_services
from console.runs.launch import default_document
from console.runs.models import (
    Allocation,
    AllocationState,
    Attempt,
    AttemptState,
    Host,
    HostState,
    Run,
    RunEvent,
    RunState,
)
from console.scheduling import services
from tests.conftest import OWNER
from tests.console import test_runs_views
from tests.console.test_runs_views import Lab, form_data
from tests.console.test_scheduling_services import host, launch, make_running

pytestmark = pytest.mark.django_db
lab = test_runs_views.lab  # the fixture: a model, the parity domain, a run


@pytest.fixture
def fleet(lab: Lab, settings: Any) -> Lab:
    """Three ready CPU hosts (the fixture's own GPU host and run are not needed)."""
    settings.RUNS_RENDEZVOUS_PORT_FIRST = 31000
    settings.RUNS_RENDEZVOUS_PORT_COUNT = 4
    lab.run.delete()
    Host.objects.filter(name="gpu-a").delete()
    for name in ("cpu-a", "cpu-b", "cpu-c"):
        host(name)
    Host.objects.update(address="10.0.0.1")
    return lab


def attempt_of(run: Run) -> Attempt:
    return Attempt.objects.get(run=run, state__in=["scheduled", "starting", "running"])


def placed_pair(fleet: Lab) -> tuple[Run, Attempt]:
    """A run on two hosts, placed by a pass: its attempt and nodes are scheduled."""
    run = launch(fleet, "pair", hosts=2)
    services.schedule_pass()
    return run, attempt_of(run)


def running_pair(fleet: Lab, *, nodes: bool = True) -> tuple[Run, Attempt]:
    """A placed pair whose job runs (as the agents and the job would record it), and with
    `nodes` both nodes' process groups too."""
    run, attempt = placed_pair(fleet)
    make_running(run)
    if nodes:
        Allocation.objects.filter(attempt=attempt).update(state=AllocationState.RUNNING)
    return run, attempt


def test_a_gang_starts_on_all_its_hosts_at_once_with_one_rendezvous(fleet: Lab) -> None:
    run = launch(fleet, "pair", hosts=2)
    result = services.schedule_pass()
    assert [a.run_id for a in result.placed] == [run.pk]
    attempt = attempt_of(run)
    nodes = list(attempt.allocations.order_by("node_rank"))
    assert [n.node_rank for n in nodes] == [0, 1]
    assert len({n.host_id for n in nodes}) == 2 and nodes[0].host_id == attempt.host_id
    assert all(n.state == AllocationState.SCHEDULED and n.cpu_slots == 1 for n in nodes)
    assert attempt.rendezvous == "10.0.0.1:31000" and attempt.rendezvous_port == 31000
    run.refresh_from_db()
    assert run.state == RunState.SCHEDULED and "2 hosts" in run.state_reason
    event = RunEvent.objects.get(run=run, kind="attempt.scheduled")
    assert event.data["hosts"] == [n.host.name for n in nodes]
    # A run on one host gets its one allocation and no rendezvous.
    single = launch(fleet, "single")
    services.schedule_pass()
    only = attempt_of(single)
    assert only.rendezvous == "" and only.rendezvous_port is None
    assert list(only.allocations.values_list("node_rank", "host_id")) == [(0, only.host_id)]


def test_a_gang_that_does_not_fit_waits_and_nothing_is_written(fleet: Lab) -> None:
    Host.objects.filter(name__in=["cpu-b", "cpu-c"]).update(state=HostState.CORDONED)
    run = launch(fleet, "pair", hosts=2)
    services.schedule_pass()
    run.refresh_from_db()
    assert run.state == RunState.QUEUED and run.state_reason.startswith("waiting")
    assert not Attempt.objects.filter(run=run).exists()
    assert not Allocation.objects.filter(run=run).exists()


def test_gang_start_is_all_or_none_when_one_host_has_no_room(fleet: Lab) -> None:
    busy = launch(fleet, "busy")
    services.schedule_pass()
    taken = attempt_of(busy).host
    free = Host.objects.exclude(pk=taken.pk).order_by("name").first()
    assert free is not None
    pair = launch(fleet, "pair", hosts=2)
    reason = services.gang_start(pair, [free, taken])
    assert isinstance(reason, str) and taken.name in reason
    assert not Attempt.objects.filter(run=pair).exists()
    assert not Allocation.objects.filter(run=pair).exists()
    # Naming the wrong number of hosts (or one twice) is refused too.
    assert isinstance(services.gang_start(pair, [free]), str)
    assert isinstance(services.gang_start(pair, [free, free]), str)


def test_rendezvous_ports_are_distinct_and_freed_when_the_nodes_exit(
    fleet: Lab, settings: Any
) -> None:
    for name in ("cpu-d", "cpu-e", "cpu-f"):
        host(name)
    settings.RUNS_RENDEZVOUS_PORT_COUNT = 1
    first = launch(fleet, "first", hosts=2)
    second = launch(fleet, "second", hosts=2)
    services.schedule_pass()
    held = attempt_of(first)
    assert held.rendezvous_port == 31000
    second.refresh_from_db()
    assert second.state == RunState.QUEUED
    assert "rendezvous port" in second.state_reason
    # The attempt ends, but node 1 still runs: the port stays held.
    make_running(Run.objects.get(pk=first.pk))
    Allocation.objects.filter(attempt=held).update(state=AllocationState.RUNNING)
    runs_services.attempt_finished(attempt_id=held.pk, status="completed", step=4)
    Allocation.objects.filter(attempt=held, node_rank=0).update(
        state=AllocationState.EXITED, exit_code=0
    )
    assert services.rendezvous_port() is None
    Allocation.objects.filter(attempt=held, node_rank=1).update(
        state=AllocationState.EXITED, exit_code=0
    )
    assert services.rendezvous_port() == 31000
    services.schedule_pass()
    assert attempt_of(second).rendezvous_port == 31000


def test_only_the_agent_of_each_node_claims_it_and_only_while_the_attempt_is_live(
    fleet: Lab,
) -> None:
    _, attempt = placed_pair(fleet)
    zero, one = attempt.allocations.select_related("host").order_by("node_rank")
    claim = runs_services.attempt_claim
    assert not claim(attempt_id=attempt.pk, host_name=zero.host.name, pid=1, node=1)
    assert claim(attempt_id=attempt.pk, host_name=one.host.name, pid=1, node=1)
    assert not claim(attempt_id=attempt.pk, host_name=one.host.name, pid=1, node=1)  # twice
    assert claim(attempt_id=attempt.pk, host_name=zero.host.name, pid=1, node=0)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STARTING
    assert set(attempt.allocations.values_list("state", flat=True)) == {AllocationState.STARTING}


def test_one_nodes_death_ends_the_whole_attempt_and_requeues_the_run(fleet: Lab) -> None:
    run, attempt = running_pair(fleet)
    assert runs_services.gang_stop_reason(attempt.pk) == ""
    runs_services.node_exited(attempt=attempt, node=1, exit_code=-9)
    runs_services.attempt_died(
        attempt_id=attempt.pk, exit_code=-9, last_output="", where="'s node 1 on cpu-b"
    )
    attempt.refresh_from_db()
    run.refresh_from_db()
    assert attempt.state == AttemptState.LOST and attempt.outcome == "died"
    assert "node 1" in attempt.error and "signal 9" in attempt.error
    assert run.state == RunState.QUEUED
    # Node 0's agent now stops its process group.
    assert "died" in runs_services.gang_stop_reason(attempt.pk)
    kinds = list(RunEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert "node.exited" in kinds and "attempt.lost" in kinds


def test_a_completed_gang_gives_its_other_nodes_time_to_exit(fleet: Lab, settings: Any) -> None:
    _, attempt = running_pair(fleet, nodes=False)
    runs_services.attempt_finished(attempt_id=attempt.pk, status="completed", step=4)
    assert runs_services.gang_stop_reason(attempt.pk) == ""
    long_ago = timezone.now() - dt.timedelta(seconds=settings.RUN_CANCEL_GRACE_S + 1)
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=long_ago)
    assert "completed" in runs_services.gang_stop_reason(attempt.pk)


def test_a_silent_host_loses_the_gang_it_is_part_of(fleet: Lab) -> None:
    _, attempt = running_pair(fleet)
    Attempt.objects.filter(pk=attempt.pk).update(heartbeat_at=timezone.now())
    one = attempt.allocations.get(node_rank=1)
    Host.objects.filter(pk=one.host_id).update(heartbeat_at=timezone.now() - dt.timedelta(days=1))
    runs_services.sweep()
    attempt.refresh_from_db()
    one.refresh_from_db()
    assert attempt.state == AttemptState.LOST and one.host.name in attempt.error
    assert one.state == AllocationState.LOST
    # Node 0 runs on a live host: its agent stops it and records its exit.
    assert attempt.allocations.get(node_rank=0).state == AllocationState.RUNNING
    assert runs_services.gang_stop_reason(attempt.pk)


def test_each_node_gets_the_rendezvous_and_its_rank_in_its_environment(
    fleet: Lab, settings: Any
) -> None:
    settings.RUNS_DIST_BACKEND = "gloo"
    _, attempt = placed_pair(fleet)
    env = agent.job_environment(attempt, [], name="cpu-b", node=1, nodes=2)
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "31000"
    assert (env["NODE_RANK"], env["NNODES"], env["RANK"], env["WORLD_SIZE"]) == ("1", "2", "1", "2")
    assert env["CONSOLE_HOST_NAME"] == env["TRAINING_HOST_NAME"] == "cpu-b"
    assert env["TRAINING_DIST_BACKEND"] == "gloo"
    assert agent.job_command(attempt, [], node=1, nodes=2)[-2:] == ["run_attempt", str(attempt.pk)]
    # Several GPUs on each host: torchrun joins the nodes (node k holds ranks k*g ..).
    command = agent.job_command(attempt, [0, 1], node=1, nodes=2)
    assert "--nnodes=2" in command and "--node-rank=1" in command
    assert "--nproc-per-node=2" in command and "--master-port=31000" in command
    # (torchrun sets each worker's RANK; the agent sets only the rendezvous.)
    env = agent.job_environment(attempt, [0, 1], name="cpu-b", node=1, nodes=2)
    assert env.get("RANK") == os.environ.get("RANK") and env["MASTER_PORT"] == "31000"
    alone = agent.job_environment(attempt, [], name="cpu-a")
    assert alone.get("MASTER_PORT") == os.environ.get("MASTER_PORT")


def api_launch(api: Client, hosts: int) -> Any:
    """POSTs a two-step parity run on `hosts` hosts to the runs API."""
    document = default_document(model="base", domains=[("parity", 1.0)])
    document.update(name="pair", max_steps=2)
    return api.post(
        "/api/runs",
        data=json.dumps({"spec": document, "hosts": hosts}),
        content_type="application/json",
    )


@pytest.mark.parametrize("hosts", [0, 65, -1])
def test_the_api_refuses_hosts_out_of_range_and_saves_nothing(
    fleet: Lab, api_client_as: Any, hosts: int
) -> None:
    before = Run.objects.count()
    response = api_launch(api_client_as(OWNER), hosts)
    assert response.status_code == 422, response.content
    assert "hosts" in response.content.decode()
    assert Run.objects.count() == before


def test_the_api_and_the_form_launch_a_run_on_several_hosts(
    fleet: Lab, api_client_as: Any, owner_client: Client
) -> None:
    response = api_launch(api_client_as(OWNER), 2)
    assert response.status_code == 201, response.content
    assert response.json()["hosts"] == 2
    services.schedule_pass()
    detail = api_client_as(OWNER).get(f"/api/runs/{response.json()['id']}").json()
    nodes = detail["attempts"][0]["hosts"]
    assert [n["node"] for n in nodes] == [0, 1] and detail["attempts"][0]["rendezvous"]
    page = owner_client.get(reverse("runs:run_detail", args=[response.json()["id"]]))
    content = page.content.decode()
    assert all(n["host"] in content for n in nodes) and "node 1" in content
    hosts_page = owner_client.get(reverse("runs:host_list")).content.decode()
    assert "node 0 of 2" in hosts_page and "node 1 of 2" in hosts_page
    bad = owner_client.post(reverse("runs:run_create"), form_data(fleet, name="bad", hosts="0"))
    assert bad.status_code == 422 and 'id="errors-hosts"' in bad.content.decode()
    assert not Run.objects.filter(name="bad").exists()
    good = owner_client.post(reverse("runs:run_create"), form_data(fleet, name="good", hosts="3"))
    assert good.status_code == 302, good.content
    assert Run.objects.get(name="good").hosts == 3


def test_a_restarted_agent_loses_the_nodes_its_host_was_running(fleet: Lab) -> None:
    run, attempt = running_pair(fleet)
    one = attempt.allocations.select_related("host").get(node_rank=1)
    runs_services.host_register(name=one.host.name, inventory={}, agent_pid=2)
    attempt.refresh_from_db()
    one.refresh_from_db()
    assert one.state == AllocationState.LOST
    assert attempt.state == AttemptState.LOST and "restarted" in attempt.error
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED
    # The port is free once node 0's agent has stopped its group and recorded the exit.
    assert services.rendezvous_port() == 31001
    runs_services.node_exited(attempt=attempt, node=0, exit_code=-15)
    assert services.rendezvous_port() == 31000


def test_a_node_no_agent_claims_in_time_loses_the_gang(fleet: Lab, settings: Any) -> None:
    _, attempt = running_pair(fleet, nodes=False)
    # Node 0 runs and beats; node 1's agent never took its message.
    Allocation.objects.filter(attempt=attempt, node_rank=0).update(state=AllocationState.RUNNING)
    old = timezone.now() - dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S + 5)
    Attempt.objects.filter(pk=attempt.pk).update(scheduled_at=old, heartbeat_at=timezone.now())
    runs_services.sweep()
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.LOST and "did not start" in attempt.error
    assert attempt.allocations.get(node_rank=1).state == AllocationState.LOST


def test_rank_0_tells_a_dead_peer_from_its_own_failure(fleet: Lab) -> None:
    run, attempt = running_pair(fleet)
    one = attempt.allocations.get(node_rank=1)
    # The peer still runs and beats: no verdict within the wait (the failure is the run's).
    assert runs_services.gang_peer_lost(attempt=attempt, node=0, wait_s=0) == ""
    # Its ranks ended cleanly (they fail with rank 0 and exit 0): the failure is the run's.
    Allocation.objects.filter(pk=one.pk).update(state=AllocationState.EXITED, exit_code=0)
    assert runs_services.gang_peer_lost(attempt=attempt, node=0, wait_s=5) == ""
    # It was killed: rank 0 leaves the verdict to the agents.
    Allocation.objects.filter(pk=one.pk).update(exit_code=-9)
    assert "node 1" in runs_services.gang_peer_lost(attempt=attempt, node=0, wait_s=0)
    # Its host went silent.
    Allocation.objects.filter(pk=one.pk).update(state=AllocationState.RUNNING, exit_code=None)
    Host.objects.filter(pk=one.host_id).update(heartbeat_at=timezone.now() - dt.timedelta(days=1))
    assert "went silent" in runs_services.gang_peer_lost(attempt=attempt, node=0, wait_s=0)


def test_the_queue_and_the_fleet_show_a_gang_on_each_of_its_hosts(
    fleet: Lab, api_client_as: Any, owner_client: Client
) -> None:
    run, attempt = placed_pair(fleet)
    names = [n.host.name for n in attempt.allocations.select_related("host")]
    # The fleet counts the gang's share on every host it holds, as the scheduler does.
    hosts = api_client_as(OWNER).get("/api/scheduling/fleet").json()
    used = {h["name"]: (h["cpu_used"], [r["run_id"] for r in h["runs"]]) for h in hosts}
    assert {name: used[name] for name in names} == {name: (1, [run.pk]) for name in names}
    assert all(used[name] == (0, []) for name in used.keys() - set(names))
    queue = api_client_as(OWNER).get("/api/scheduling/queue").json()
    assert [r["hosts"] for r in queue["running"] if r["run_id"] == run.pk] == [names]
    page = owner_client.get(reverse("scheduling:queue")).content.decode()
    assert ", ".join(names) in page
