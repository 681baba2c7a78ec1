"""A run on two hosts, on real parts: a control worker and two host agents on this machine
(two hosts to the console), a CPU job whose two ranks (one per host, gloo) meet at the
rendezvous on node 0's host and report as one run. Killing one node's process mid-run stops
the whole gang (no process of it is left) and puts the run back in the queue; it resumes on
both hosts from its checkpoint, is preempted as a whole through its Control (both nodes exit
cleanly), resumes again, loses one host's whole agent mid-run (the attempt is lost, nothing of
it is left), resumes once the agent is back, and finishes with every step's metrics and samples
once."""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from typing import Any

import psutil
import pytest

from console.runs.launch import default_document
from console.runs.models import (
    Allocation,
    AllocationState,
    Attempt,
    Checkpoint,
    MetricRow,
    Run,
    RunEvent,
    TrajectoryRecord,
)
from tests.console.runs_cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROMPTS, GROUP, STEPS = 4, 2, 8
# The first two attempts wait before their fourth step until the test releases them (see
# runs_hold.py): the test kills a node of the first and preempts the second there; the third
# waits before its fifth, where the test kills a host's whole agent. On an idle
# machine a step takes ~0.2 s; a run the test merely watched could end (the resumed attempt's few
# steps are over in a second) before the kill or the preemption reached it, and the test would
# then see a completed attempt instead.
HELD_AFTER = 3


@pytest.fixture
def cluster_env(settings: Any) -> dict[str, str]:
    # Other suites on this machine may hold the default range: a range of our own.
    first = random.randrange(40000, 60000, 50)
    settings.RUNS_RENDEZVOUS_PORT_FIRST = first
    return {
        "RUNS_RENDEZVOUS_PORT_FIRST": str(first),
        "RUNS_RENDEZVOUS_PORT_COUNT": "50",
        "RUNS_DIST_BACKEND": "gloo",
        "HOST_ADDRESS": "127.0.0.1",
    }


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """The shared cluster with two host agents: the two hosts of a gang."""
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    return cluster


def gang_processes(pids: list[int]) -> list[psutil.Process]:
    """Every live process still in the process groups the agents started (each node's job
    leads its own group). A zombie has exited: it only waits for whoever adopted it (init, once
    its agent is dead) to reap it, which it may not have done yet."""
    left = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) in pids and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return left


def wait_nodes_ended(cluster: Cluster, attempt: Attempt, what: str) -> None:
    """Until no node of the attempt is starting or running."""
    wait_for(
        lambda: (
            not Allocation.objects.filter(
                attempt=attempt, state__in=[AllocationState.STARTING, AllocationState.RUNNING]
            ).exists()
        ),
        timeout=120,
        what=what,
        cluster=cluster,
    )


def test_a_two_host_run_reports_as_one_and_a_dead_node_requeues_the_whole_gang(
    cluster, parity, api_client_as
):
    cluster.hold("two-hosts", after_step=HELD_AFTER, attempts=(1, 2))
    # The third attempt resumes from the preemption's checkpoint (step HELD_AFTER) and is held
    # after one step of its own, so that it is caught training when its host's agent dies.
    cluster.hold("two-hosts", after_step=HELD_AFTER + 1, attempts=(3,))
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name="two-hosts", max_steps=STEPS)
    document["batch"].update(prompts_per_step=PROMPTS, group_size=GROUP)
    document["checkpoint"].update(every_steps=2)
    document["eval"].update(at_start=False, at_end=False)
    response = api_client_as("owner").post(
        "/api/runs",
        data=json.dumps({"spec": document, "hosts": 2}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    run_id = int(response.json()["id"])

    # Both nodes run and a checkpoint is recorded, with a step or more beyond it done.
    cluster.wait_held("two-hosts", attempt=1)
    wait_for(
        lambda: (
            Checkpoint.objects.filter(run_id=run_id, step__gte=2).exists()
            and Run.objects.get(pk=run_id).last_step >= 3
        ),
        timeout=600,
        what="a checkpoint of the two-host run",
        cluster=cluster,
    )
    first = Attempt.objects.get(run_id=run_id, number=1)
    nodes = list(first.allocations.select_related("host").order_by("node_rank"))
    assert {n.host.name for n in nodes} == {
        cluster.host_name("node-a"),
        cluster.host_name("node-b"),
    }
    assert all(n.state == AllocationState.RUNNING and n.pid for n in nodes)
    assert first.rendezvous.startswith("127.0.0.1:")
    pids = [n.pid for n in nodes if n.pid]

    # One node's job dies (what the OOM killer does): the whole gang stops and is requeued.
    os.kill(nodes[1].pid or 0, signal.SIGKILL)
    cluster.release("two-hosts", attempt=1)  # rank 0 goes on, and finds its peer gone
    wait_nodes_ended(cluster, first, "both nodes of the first attempt to exit")
    first.refresh_from_db()
    assert first.state == "lost" and first.outcome == "died", first.error
    assert "node 1" in first.error
    assert gang_processes(pids) == [], "a process of the stopped gang is still running"

    # Resumed on both hosts, the gang is preempted through its Control: rank 0 decides for
    # every rank, the checkpoint is collective, and both nodes exit by themselves.
    wait_for(
        lambda: TrajectoryRecord.objects.filter(
            run_id=run_id, attempt__number=2, attempt__state="running"
        ).exists(),
        timeout=300,
        what="the second attempt to train",
        cluster=cluster,
    )
    cluster.wait_held("two-hosts", attempt=2)
    api = api_client_as("owner")
    answer = api.post(
        f"/api/runs/{run_id}/preempt",
        data=json.dumps({"reason": "make room"}),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    # The preempt command is stored: released, rank 0's Control reads it before the next step.
    cluster.release("two-hosts", attempt=2)
    second = Attempt.objects.get(run_id=run_id, number=2)
    wait_for(
        lambda: set(second.allocations.values_list("state", flat=True)) == {AllocationState.EXITED},
        timeout=300,
        what="both nodes of the preempted attempt to exit",
        cluster=cluster,
    )
    second.refresh_from_db()
    assert second.state == "preempted", second.error
    assert list(second.allocations.values_list("exit_code", flat=True)) == [0, 0]
    assert gang_processes([n.pid for n in second.allocations.all() if n.pid]) == []

    # Resumed again, node b's whole host agent is killed (its job dies with it) and comes
    # back: the attempt is lost, node a's job is stopped too, nothing of it is left, and the
    # run resumes on both hosts from its last checkpoint.
    wait_for(
        lambda: TrajectoryRecord.objects.filter(
            run_id=run_id, attempt__number=3, attempt__state="running"
        ).exists(),
        timeout=300,
        what="the third attempt to train",
        cluster=cluster,
    )
    cluster.wait_held("two-hosts", attempt=3)
    third = Attempt.objects.get(run_id=run_id, number=3)
    third_pids = [n.pid for n in third.allocations.all() if n.pid]
    cluster.kill("node-b")
    cluster.start_agent("node-b")
    cluster.release("two-hosts", attempt=3)  # rank 0 goes on, if it is still there
    wait_nodes_ended(
        cluster, third, "both nodes of the third attempt to end after node b's agent died"
    )
    third.refresh_from_db()
    assert third.state == "lost", (third.state, third.error)
    assert gang_processes(third_pids) == [], "a process of the dead agent's gang is still running"

    wait_for(
        lambda: Run.objects.get(pk=run_id).state in ("completed", "failed", "cancelled"),
        timeout=900,
        what="the run to finish on both hosts",
        cluster=cluster,
    )
    final = Run.objects.get(pk=run_id)
    assert final.state == "completed", f"{final.state_reason}\n{final.error}\n{cluster.logs()}"
    attempts = list(Attempt.objects.filter(run=final).order_by("number"))
    assert [a.state for a in attempts] == ["lost", "preempted", "lost", "completed"]
    last = attempts[-1]
    preempted = Checkpoint.objects.get(run=final, reason="preempt")
    assert third.start_step == preempted.step > second.start_step
    assert last.start_step >= preempted.step
    assert last.allocations.count() == 2
    wait_for(
        lambda: set(last.allocations.values_list("state", flat=True)) == {AllocationState.EXITED},
        timeout=120,
        what="both nodes of the last attempt to exit",
        cluster=cluster,
    )
    assert list(last.allocations.values_list("exit_code", flat=True)) == [0, 0]

    # The two ranks report as one run: each step's metrics once, every sample once.
    steps = list(MetricRow.objects.filter(run=final).values_list("step", flat=True))
    assert sorted(steps) == list(range(1, STEPS + 1))
    counts = Counter(TrajectoryRecord.objects.filter(run=final).values_list("step", flat=True))
    assert sorted(counts) == list(range(1, STEPS + 1))
    assert set(counts.values()) == {PROMPTS * GROUP}
    started = RunEvent.objects.filter(run=final, kind="run.started", attempt=last)
    assert [e.data["world_size"] for e in started] == [2]
    # Both nodes' starts and exits, for every attempt (node b's exit in the attempt its agent
    # died with has nobody to report it: its allocation is marked lost instead).
    for attempt in attempts:
        events = RunEvent.objects.filter(run=final, attempt=attempt)
        exits = [0] if attempt.pk == third.pk else [0, 1]
        assert sorted(events.filter(kind="node.started").values_list("data__node", flat=True)) == [
            0,
            1,
        ]
        assert (
            sorted(events.filter(kind="node.exited").values_list("data__node", flat=True)) == exits
        )
    # Each step's timeline holds both ranks.
    timeline = RunEvent.objects.filter(run=final, kind="step.timeline", step=STEPS).first()
    assert timeline is not None
    ranks = {span.get("rank") for span in timeline.data.get("stages", [])}
    assert ranks == {0, 1}, timeline.data
    # ... each rank's spans named by the host it ran on (the agent's name, not the machine's).
    span_hosts = {(span.get("rank"), span.get("host")) for span in timeline.data["stages"]}
    last_nodes = last.allocations.select_related("host")
    assert span_hosts == {(n.node_rank, n.host.name) for n in last_nodes}, timeline.data
