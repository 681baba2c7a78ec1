"""The scheduler's policy on small hand-made fleets (pure Python: no database, no Django)."""

from __future__ import annotations

from console.scheduling.policy import (
    Allocation,
    HostView,
    JobView,
    PriorityClass,
    Quota,
    schedule,
)

CLASSES = {
    "prod": PriorityClass("prod", 100, can_preempt=True, preemptible=False, approval="never"),
    "research": PriorityClass("research", 50, can_preempt=False, preemptible=True, approval="ask"),
}


def host(name: str, pool: str = "h200", gpus: int = 8, free: int | None = None, **kw) -> HostView:
    return HostView(
        name=name,
        pool=pool,
        gpus_total=gpus,
        cpu_total=16,
        gpus_free=gpus if free is None else free,
        cpu_free=16,
        **kw,
    )


def job(run_id: int, gpus: int = 8, hosts: int = 1, **kw) -> JobView:
    kw.setdefault("team", "a")
    kw.setdefault("class_name", "research")
    kw.setdefault("priority", 0)
    kw.setdefault("queued_at", float(run_id))
    kw.setdefault("cpu_slots", 1)
    return JobView(run_id=run_id, gpus=gpus, hosts=hosts, **kw)


def run(hosts, jobs, quotas=(), now=1000.0):
    return schedule(hosts=hosts, jobs=jobs, classes=CLASSES, quotas=list(quotas), now=now)


def placed(decisions) -> dict[int, list[str]]:
    return {p.run_id: [a.host for a in p.allocations] for p in decisions.placements}


def test_gang_starts_on_all_its_hosts_or_none():
    fleet = [host("h1"), host("h2"), host("h3", free=4)]
    d = run(fleet, [job(1, gpus=8, hosts=3)])
    assert placed(d) == {}
    assert "needs 3 host(s)" in d.waiting[1]
    d = run(fleet, [job(1, gpus=4, hosts=3)])
    assert sorted(placed(d)[1]) == ["h1", "h2", "h3"]
    assert all(a.gpus == 4 for a in d.placements[0].allocations)


def test_strict_priority_order_class_then_priority_then_age():
    fleet = [host("h1")]
    jobs = [
        job(1, queued_at=1.0),
        job(2, queued_at=2.0, priority=5),
        job(3, queued_at=3.0, class_name="prod"),
    ]
    d = run(fleet, jobs)
    assert list(placed(d)) == [3]
    assert d.waiting[2].startswith("waiting:")
    assert set(d.waiting) == {1, 2}


def test_cordoned_hosts_are_skipped():
    fleet = [host("h1", schedulable=False), host("h2")]
    d = run(fleet, [job(1), job(2)])
    assert placed(d) == {1: ["h2"]}
    assert 2 in d.waiting


def test_cpu_jobs_use_cpu_slots_and_pools_are_respected():
    fleet = [host("c1", pool="cpu", gpus=0), host("h1")]
    d = run(fleet, [job(1, gpus=0, cpu_slots=10, pool="cpu"), job(2, gpus=8, pool="h200")])
    assert placed(d) == {1: ["c1"], 2: ["h1"]}
    alloc = d.placements[0].allocations[0]
    assert alloc == Allocation("c1", 0, 10)


def test_running_jobs_are_not_placed_again():
    fleet = [host("h1", free=0)]
    d = run(fleet, [job(1, running_on=[Allocation("h1", 8, 0)]), job(2)])
    assert placed(d) == {}
    assert set(d.waiting) == {2}


def test_quota_type_is_accepted():
    d = run([host("h1")], [job(1)], quotas=[Quota("a", "h200", 8)])
    assert placed(d) == {1: ["h1"]}
