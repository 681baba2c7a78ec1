"""The scheduler's policy on small hand-made fleets (pure Python: no database, no Django)."""

from __future__ import annotations

from console.scheduling.policy import (
    LEND_MAX_STOPS,
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
    "pinned": PriorityClass("pinned", 20, can_preempt=False, preemptible=True, approval="never"),
    "batch": PriorityClass(
        "batch",
        10,
        can_preempt=False,
        preemptible=True,
        approval="auto_recent_checkpoint",
        auto_approve_minutes=30,
    ),
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


def running(run_id: int, on: dict[str, int], **kw) -> JobView:
    """A running job using `on[host]` GPUs on each host."""
    gpus = next(iter(on.values()))
    kw.setdefault("est_remaining_s", 10_000.0)
    return job(
        run_id,
        gpus=gpus,
        hosts=len(on),
        running_on=[Allocation(h, g, 0) for h, g in on.items()],
        **kw,
    )


def fleet_using(*hosts_used: tuple[str, int]) -> list[HostView]:
    return [host(name, free=8 - used) for name, used in hosts_used]


def test_a_team_borrows_idle_capacity_beyond_its_quota():
    quotas = [Quota("a", "h200", 8), Quota("b", "h200", 8)]
    d = run([host("h1"), host("h2")], [job(1, team="a", hosts=2)], quotas)
    assert sorted(placed(d)[1]) == ["h1", "h2"]
    assert "borrowing idle capacity in pool h200" in d.placements[0].reason


def test_borrowed_capacity_is_reclaimed_by_preempting_the_borrower():
    quotas = [Quota("a", "h200", 8), Quota("b", "h200", 8)]
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 8}, team="b", last_checkpoint_age_s=60.0),
        running(2, {"h2": 8}, team="b", last_checkpoint_age_s=30.0),
        job(3, team="a"),  # research: may not preempt by class, but 8 GPUs are its guarantee
    ]
    d = run(fleet, jobs, quotas)
    assert placed(d) == {}  # the requester starts once the victim has stopped
    [plan] = d.preemptions
    assert plan.requester_run_id == 3
    assert [v.run_id for v in plan.victims] == [2]  # the cheaper of b's two jobs
    assert "reclaiming team a's quota" in plan.reason
    assert not plan.auto_approved  # research's policy: ask
    assert "preemption of run(s) 2 requested" in d.waiting[3]


def test_no_reclaim_when_the_team_is_over_its_own_quota():
    quotas = [Quota("a", "h200", 8), Quota("b", "h200", 8)]
    fleet = fleet_using(("h1", 8), ("h2", 8), ("h3", 8))
    jobs = [
        running(1, {"h1": 8}, team="a"),
        running(2, {"h2": 8}, team="b"),
        running(3, {"h3": 8}, team="b"),
        job(4, team="a"),
    ]
    d = run(fleet, jobs, quotas)
    assert d.preemptions == []
    assert d.waiting[4].startswith("waiting: team quota full in pool h200 (8 of 8 GPUs in use)")


def test_fair_share_orders_teams_by_usage_relative_to_quota():
    quotas = [Quota("a", "h200", 16), Quota("b", "h200", 4)]
    fleet = fleet_using(("h1", 8), ("h2", 4), ("h3", 0))
    jobs = [
        running(1, {"h1": 8}, team="a"),  # a: 8/16 = 0.5
        running(2, {"h2": 4}, team="b"),  # b: 4/4 = 1.0
        job(3, team="b", queued_at=1.0),  # older, but b uses more of its share
        job(4, team="a", queued_at=2.0),
    ]
    d = run(fleet, jobs, quotas)
    assert placed(d) == {4: ["h3"]}
    # the same fleet with the usage the other way round favours b
    jobs[0] = running(1, {"h1": 8}, team="b")
    jobs[1] = running(2, {"h2": 4}, team="a")
    d = run(fleet, jobs, [Quota("a", "h200", 16), Quota("b", "h200", 16)])
    assert placed(d) == {4: ["h3"]}  # a 4/16 < b 8/16
    d = run(fleet, jobs, [Quota("a", "h200", 2), Quota("b", "h200", 16)])
    assert placed(d) == {3: ["h3"]}  # a 4/2 > b 8/16


def test_fair_share_alternates_teams_within_one_pass():
    fleet = [host(f"h{i}") for i in range(4)]
    jobs = [job(i, team="a", queued_at=float(i)) for i in range(1, 5)]
    jobs += [job(i, team="b", queued_at=100.0 + i) for i in range(5, 9)]
    d = run(fleet, jobs, [Quota("a", "h200", 16), Quota("b", "h200", 16)])
    assert sorted(placed(d)) == [1, 2, 5, 6]


def _backfill_fleet(h3_busy: int = 6) -> tuple[list[HostView], list[JobView]]:
    # h1: 4 GPUs busy until t+100; h2: full until t+5000; h3: partly busy for long
    fleet = fleet_using(("h1", 4), ("h2", 8), ("h3", h3_busy))
    jobs = [
        running(1, {"h1": 4}, est_remaining_s=100.0),
        running(2, {"h2": 8}, est_remaining_s=5000.0),
        running(3, {"h3": h3_busy}, est_remaining_s=5000.0),
        job(10, gpus=8, priority=10),  # the head: fits h1 at t+100
    ]
    return fleet, jobs


def test_backfill_uses_idle_gpus_when_it_ends_before_the_head_can_start():
    fleet, jobs = _backfill_fleet()
    d = run(fleet, [*jobs, job(11, gpus=4, est_remaining_s=50.0)])
    assert placed(d) == {11: ["h1"]}
    assert d.placements[0].reason == "placed on h1 by backfill"
    assert 10 in d.waiting


def test_backfill_is_refused_when_it_would_delay_the_head():
    fleet, jobs = _backfill_fleet()
    d = run(fleet, [*jobs, job(11, gpus=4, est_remaining_s=500.0)])
    assert placed(d) == {}
    assert d.waiting[11] == "waiting: behind higher-priority run 10"


def test_backfill_may_use_capacity_the_reservation_does_not_need():
    # h3 has 6 free: best fit alone would take h1's 4, which the head needs at t+100
    fleet, jobs = _backfill_fleet(h3_busy=2)
    d = run(fleet, [*jobs, job(11, gpus=2, est_remaining_s=99_999.0)])
    assert placed(d) == {11: ["h3"]}
    assert d.placements[0].reason == "placed on h3 by backfill"
    # without a head waiting, the same job goes to the fuller host
    d = run(fleet, [*jobs[:3], job(11, gpus=2, est_remaining_s=99_999.0)])
    assert placed(d) == {11: ["h1"]}


def _gang_head_fleet() -> tuple[list[HostView], list[JobView]]:
    # h1 and h3 idle, h2 full until t+1000, h4 half busy for long: the head, a 3-host gang,
    # starts at t+1000 on h1, h2 and h3; h4's 4 free GPUs are no part of its reservation
    fleet = fleet_using(("h1", 0), ("h2", 8), ("h3", 0), ("h4", 4))
    jobs = [
        running(1, {"h2": 8}, est_remaining_s=1000.0),
        running(2, {"h4": 4}, est_remaining_s=50_000.0),
        job(10, gpus=8, hosts=3, priority=10),
    ]
    return fleet, jobs


def test_a_backfill_that_ends_before_the_head_starts_takes_a_reserved_host():
    fleet, jobs = _gang_head_fleet()
    short = job(11, gpus=4, est_remaining_s=500.0)  # ends before the gang can start
    long = job(12, gpus=4, est_remaining_s=20_000.0)
    d = run(fleet, [*jobs, short, long])
    # the short job takes a reserved host, which would idle until the gang starts; best fit
    # alone would have put it on h4 and left the long job nowhere to go
    assert placed(d) == {11: ["h1"], 12: ["h4"]}
    assert all(p.reason.endswith("by backfill") for p in d.placements)
    assert d.waiting[10].startswith("waiting: needs 3 host(s)")


def test_a_backfill_that_would_delay_the_gang_is_refused():
    fleet, jobs = _gang_head_fleet()
    d = run(fleet, [*jobs, job(11, gpus=8, est_remaining_s=1500.0)])  # ends after t+1000
    assert placed(d) == {}
    assert d.waiting[11] == "waiting: behind higher-priority run 10"
    d = run(fleet, [*jobs, job(11, gpus=8, est_remaining_s=900.0)])
    assert placed(d) == {11: ["h1"]}


def test_a_small_job_goes_where_it_does_not_keep_the_host_busy_longer():
    # best fit would take h1 (2 free, exact), whose job ends at t+100: h1 would then stay
    # 6 GPUs idle for hours behind this job; h2's jobs run past it, so h2 frees whole later
    fleet = fleet_using(("h1", 6), ("h2", 4))
    jobs = [
        running(1, {"h1": 6}, est_remaining_s=100.0),
        running(2, {"h2": 4}, est_remaining_s=5000.0),
    ]
    assert placed(run(fleet, [*jobs, job(3, gpus=2, est_remaining_s=3000.0)])) == {3: ["h2"]}
    # a job that ends before h1's does still takes the best fit
    assert placed(run(fleet, [*jobs, job(3, gpus=2, est_remaining_s=50.0)])) == {3: ["h1"]}


def test_preemption_picks_the_cheapest_victim_and_previews_its_impact():
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 8}, last_checkpoint_age_s=3600.0, steps_since_checkpoint=90),
        running(
            2,
            {"h2": 8},
            last_checkpoint_age_s=900.0,
            steps_since_checkpoint=25,
            next_checkpoint_in_s=300.0,
            rollouts_in_flight=64,
        ),
        job(3, class_name="prod", est_remaining_s=1800.0),
    ]
    d = run(fleet, jobs)
    assert placed(d) == {}
    [plan] = d.preemptions
    [impact] = plan.victims
    assert impact.run_id == 2
    assert impact.gpu_hours_since_checkpoint == 2.0  # 8 GPUs x 15 min
    assert impact.steps_lost == 25
    assert impact.next_checkpoint_in_s == 300.0
    assert impact.rollouts_in_flight == 64
    assert impact.expected_resume_s == 1800.0  # when the requester is expected to finish
    assert not plan.auto_approved


def test_a_victims_expected_resume_counts_the_jobs_queued_ahead_of_it():
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(2, {"h1": 8}, est_remaining_s=9000.0),  # the victim, queued at 2 before
        running(9, {"h2": 8}, class_name="pinned", est_remaining_s=5000.0),  # never a victim
        job(3, class_name="prod", est_remaining_s=1800.0),  # the requester
        job(1, queued_at=0.5, est_remaining_s=3000.0),  # older than the victim: ahead of it
        job(5, queued_at=50.0, est_remaining_s=100.0),  # newer: behind it
    ]
    [plan] = run(fleet, jobs).preemptions
    [impact] = plan.victims
    # h1 frees when the requester ends (1800 s), job 1 runs there until 4800 s, then the
    # victim: before h2 frees at 5000 s
    assert impact.run_id == 2 and impact.expected_resume_s == 4800.0


def test_preemption_prefers_borrowers_and_fewer_victims():
    quotas = [Quota("a", "h200", 8), Quota("b", "h200", 0)]
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 8}, team="a", last_checkpoint_age_s=10.0),  # cheap, within quota
        running(2, {"h2": 8}, team="b", last_checkpoint_age_s=3000.0),  # costly, but borrows
        job(3, team="c", class_name="prod"),
    ]
    d = run(fleet, jobs, quotas)
    assert [v.run_id for v in d.preemptions[0].victims] == [2]
    # fewest victims: one job of 8 over two of 4 when they cost the same
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 4}, last_checkpoint_age_s=600.0),
        running(2, {"h1": 4}, last_checkpoint_age_s=600.0),
        running(3, {"h2": 8}, last_checkpoint_age_s=300.0),
        job(4, class_name="prod"),
    ]
    assert [v.run_id for v in run(fleet, jobs).preemptions[0].victims] == [3]
    # on one host: one job of 8 at 1.33 GPU-h beats the two cheapest of 4 at 1 GPU-h each
    fleet = [host("big", gpus=16, free=0)]
    jobs = [
        running(1, {"big": 4}, last_checkpoint_age_s=900.0),
        running(2, {"big": 4}, last_checkpoint_age_s=900.0),
        running(3, {"big": 8}, last_checkpoint_age_s=600.0),
        job(4, class_name="prod"),
    ]
    assert [v.run_id for v in run(fleet, jobs).preemptions[0].victims] == [3]


def test_approval_policy_auto_ask_and_never():
    fleet = fleet_using(("h1", 8))

    def plan_for(class_name: str, age: float):
        jobs = [running(1, {"h1": 8}, class_name=class_name, last_checkpoint_age_s=age)]
        return run(fleet, [*jobs, job(2, class_name="prod")])

    d = plan_for("batch", 600.0)  # checkpointed 10 min ago, class auto-approves under 30
    assert d.preemptions[0].auto_approved
    assert "auto-approved" in d.waiting[2]
    d = plan_for("batch", 3600.0)  # too long ago: a person decides
    assert not d.preemptions[0].auto_approved
    d = plan_for("research", 10.0)  # "ask": always a person
    assert not d.preemptions[0].auto_approved
    d = plan_for("pinned", 10.0)  # "never": not a victim at all
    assert d.preemptions == []
    assert d.waiting[2].startswith("waiting: needs 1 host(s) with 8 free GPUs")


def test_a_class_that_may_not_preempt_files_no_plan():
    fleet = fleet_using(("h1", 8))
    d = run(fleet, [running(1, {"h1": 8}, class_name="batch"), job(2, class_name="research")])
    assert d.preemptions == []


def test_no_second_plan_and_pending_victims_are_not_chosen_again():
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 8}, last_checkpoint_age_s=10.0, preemption_pending=True),
        running(2, {"h2": 8}, last_checkpoint_age_s=3000.0),
        job(3, class_name="prod", preemption_requested=True),
        job(4, class_name="prod"),
    ]
    d = run(fleet, jobs)
    assert [p.requester_run_id for p in d.preemptions] == [4]
    assert [v.run_id for v in d.preemptions[0].victims] == [2]
    assert "preemption request is open" in d.waiting[3]


def test_a_requester_holds_idle_hosts_so_lower_jobs_do_not_take_them():
    fleet = fleet_using(("h1", 0), ("h2", 8))
    jobs = [
        running(1, {"h2": 8}, last_checkpoint_age_s=10.0),
        job(2, class_name="prod", hosts=2),
        job(3, class_name="batch", est_remaining_s=60.0),
    ]
    d = run(fleet, jobs)
    assert [v.run_id for v in d.preemptions[0].victims] == [1]
    assert placed(d) == {}
    assert 3 in d.waiting


def test_a_job_that_cannot_fit_does_not_block_others():
    fleet = [host("h1"), host("h2"), host("h3", schedulable=False)]
    d = run(fleet, [job(1, class_name="prod", hosts=3, pool="h200"), job(2)])
    assert d.waiting[1].startswith("waiting: cannot fit: pool h200 has fewer than 3")
    assert placed(d) == {2: ["h1"]}


def test_every_queued_job_gets_a_placement_or_a_reason():
    fleet = fleet_using(("h1", 6), ("h2", 0))
    jobs = [running(1, {"h1": 6})] + [job(i, gpus=(i % 3) + 1) for i in range(2, 12)]
    d = run(fleet, jobs)
    decided = set(placed(d)) | set(d.waiting)
    assert decided == set(range(2, 12))
    assert not set(placed(d)) & set(d.waiting)
    assert sum(a.gpus for p in d.placements for a in p.allocations) <= 10


def test_reclaim_does_not_take_from_a_higher_class_borrower():
    quotas = [Quota("a", "h200", 8), Quota("b", "h200", 8)]
    fleet = fleet_using(("h1", 8), ("h2", 8))
    jobs = [
        running(1, {"h1": 8}, team="b", class_name="research"),
        running(2, {"h2": 8}, team="b", class_name="research"),
        job(3, team="a", class_name="batch"),  # within quota, but lower than the borrower
    ]
    d = run(fleet, jobs, quotas)
    assert d.preemptions == []
    assert 3 in d.waiting


def test_a_requester_whose_victims_stopped_goes_first_in_its_class():
    fleet = [host("h1")]
    jobs = [
        job(1, class_name="prod", team="a", queued_at=1.0),
        job(2, class_name="prod", team="b", queued_at=5.0, preemption_requested=True),
    ]
    d = run(fleet, jobs)
    assert placed(d) == {2: ["h1"]}
    assert d.preemptions == []  # and it files no second request
    assert 1 in d.waiting


def test_preempt_after_wait_lets_a_short_wait_pass_without_preemption():
    patient = dict(CLASSES)
    patient["prod"] = PriorityClass(
        "prod", 100, can_preempt=True, preemptible=False, approval="never", preempt_after_wait_s=600
    )
    fleet = fleet_using(("h1", 8))

    def plans(victim_remaining_s: float) -> int:
        jobs = [
            running(1, {"h1": 8}, est_remaining_s=victim_remaining_s),
            job(2, class_name="prod"),
        ]
        d = schedule(hosts=fleet, jobs=jobs, classes=patient, quotas=[], now=0.0)
        return len(d.preemptions)

    assert plans(300.0) == 0  # frees up within 10 minutes anyway: no work thrown away
    assert plans(3600.0) == 1


def test_a_job_for_any_pool_goes_to_the_pool_with_the_most_idle_capacity():
    fleet = [
        host("a1", pool="a100", free=8),
        host("b1", pool="h100", free=8),
        host("b2", pool="h100", free=8),
    ]
    d = run(fleet, [job(1, gpus=4)])
    assert placed(d)[1][0].startswith("b")
    assert d.placements[0].allocations[0].gpus == 4


def test_a_small_job_joins_the_host_whose_jobs_end_when_it_does():
    # equal best fit (4 free on each): the host then frees whole at once, not in fragments
    fleet = fleet_using(("h1", 4), ("h2", 4))
    early = running(1, {"h1": 4}, est_remaining_s=1000.0)
    late = running(2, {"h2": 4}, est_remaining_s=5000.0)
    assert placed(run(fleet, [early, late, job(3, gpus=4, est_remaining_s=4800.0)])) == {3: ["h2"]}
    assert placed(run(fleet, [early, late, job(3, gpus=4, est_remaining_s=900.0)])) == {3: ["h1"]}


def test_a_job_for_any_pool_avoids_the_pool_its_pinned_queue_waits_for():
    fleet = [host("a1", pool="a100"), host("a2", pool="a100"), host("b1", pool="h100")]
    jobs = [
        job(1, gpus=8, pool="a100", class_name="prod", queued_at=0.0),  # takes one a100 host
        job(2, gpus=8, hosts=2, pool="a100", class_name="prod"),  # waits for both a100 hosts
        job(3, gpus=2),  # any pool: a100 and h100 have 8 idle GPUs each
    ]
    assert placed(run(fleet, jobs)) == {1: ["a1"], 3: ["b1"]}


def test_a_pass_leaves_its_inputs_as_they_were():
    import copy

    fleet = fleet_using(("h1", 8), ("h2", 4), ("h3", 0))
    jobs = [
        running(1, {"h1": 8}, last_checkpoint_age_s=60.0),
        running(2, {"h2": 4}),
        job(3, class_name="prod", hosts=2),
        job(4, gpus=2),
        job(5, gpus=8, hosts=3),
    ]
    before = copy.deepcopy((fleet, jobs))
    d = run(fleet, jobs, [Quota("a", "h200", 8)])
    assert d.preemptions and d.waiting  # the pass did decide something
    assert (fleet, jobs) == before


def test_a_job_for_any_pool_is_told_what_blocks_it_in_each_pool():
    # a100: team a's quota is full and no GPU idle; h100: 4 GPUs idle on b1, but the head
    # (run 10) starts there at t+100 and job 11 would run past it
    fleet = [
        host("a1", pool="a100", free=0),
        host("b1", pool="h100", free=4),
        host("b2", pool="h100", free=0),
    ]
    jobs = [
        running(1, {"a1": 8}, team="a"),
        running(2, {"b1": 4}, team="c", est_remaining_s=100.0),
        running(3, {"b2": 8}, team="c", est_remaining_s=5000.0),
        job(10, gpus=8, pool="h100", team="b", priority=10),
        job(11, gpus=4, team="a", est_remaining_s=500.0),  # any pool
    ]
    d = run(fleet, jobs, [Quota("a", "a100", 8)])
    assert placed(d) == {}
    assert d.waiting[11] == (
        "waiting: pool a100: team quota full (8 of 8 GPUs in use) and no idle GPUs to borrow; "
        "pool h100: behind higher-priority run 10"
    )
    # pinned to one pool, the reason names that pool as before
    jobs[-1] = job(11, gpus=4, team="a", est_remaining_s=500.0, pool="a100")
    d = run(fleet, jobs, [Quota("a", "a100", 8)])
    assert d.waiting[11].startswith("waiting: team quota full in pool a100 (8 of 8 GPUs")
    # the same cause in two pools is said once
    fleet = [host("a1", pool="a100", free=2), host("b1", pool="h100", free=2)]
    d = run(fleet, [job(12, gpus=4)])
    assert (
        d.waiting[12] == "waiting: pools a100, h100: needs 1 host(s) with 4 free GPUs, 0 available"
    )


def moving_fleet(age: float = 60.0, victim_class: str = "batch", h2_used: int = 4):
    """h1 and h2 half used: run 1 (4 GPUs on h1, last checkpoint `age` ago) may be moved, run 2
    (on h2, class "pinned": never preempted) may not; run 3 asks for a whole host."""
    fleet = fleet_using(("h1", 4), ("h2", h2_used))
    jobs = [
        running(1, {"h1": 4}, class_name=victim_class, last_checkpoint_age_s=age),
        running(2, {"h2": h2_used}, class_name="pinned", last_checkpoint_age_s=60.0),
        job(3, class_name="batch", est_remaining_s=3600.0),
    ]
    return fleet, jobs


def test_a_run_that_just_checkpointed_is_moved_to_free_a_whole_host():
    fleet, jobs = moving_fleet()
    d = run(fleet, jobs)
    assert placed(d) == {}
    [plan] = d.preemptions
    assert plan.requester_run_id == 3
    assert [v.run_id for v in plan.victims] == [1]
    assert plan.auto_approved  # its class approves: checkpointed a minute ago
    assert "moving run(s) 1 to h2" in plan.reason
    [impact] = plan.victims
    assert impact.expected_resume_s == 0.0  # h2's 4 free GPUs take it at once
    assert impact.gpu_hours_since_checkpoint == round(4 * 60.0 / 3600.0, 4)
    assert d.waiting[3] == "waiting: preemption of run(s) 1 requested (auto-approved)"


def test_a_run_is_moved_only_when_its_class_approves_without_a_person():
    for fleet, jobs in (
        moving_fleet(age=45 * 60.0),  # batch auto-approves under 30 minutes only
        moving_fleet(victim_class="research"),  # "ask": a person would have to approve
    ):
        d = run(fleet, jobs)
        assert d.preemptions == []
        assert d.waiting[3].startswith("waiting: needs 1 host(s) with 8 free GPUs")


def test_a_run_is_moved_only_where_it_fits_at_once():
    def with_h3(h2_used: int):
        fleet, jobs = moving_fleet(h2_used=h2_used)
        fleet.append(host("h3", free=3))
        jobs.append(running(4, {"h3": 5}, class_name="pinned"))
        return run(fleet, jobs)

    # 10 free GPUs, but in 4 (h1), 3 and 3: the 4-GPU run has nowhere to go
    assert with_h3(h2_used=5).preemptions == []
    d = with_h3(h2_used=4)  # h2's 4 free GPUs take it
    assert [v.run_id for v in d.preemptions[0].victims] == [1]


def test_a_run_of_a_higher_class_is_not_moved_and_moves_can_be_switched_off():
    classes = {
        **CLASSES,
        "standard": PriorityClass(
            "standard", 50, False, True, "auto_recent_checkpoint", auto_approve_minutes=30
        ),
    }
    fleet, jobs = moving_fleet(victim_class="standard")
    d = schedule(hosts=fleet, jobs=jobs, classes=classes, quotas=[], now=1000.0)
    assert d.preemptions == []  # a batch run does not move a standard one
    jobs[2].class_name = "standard"
    d = schedule(hosts=fleet, jobs=jobs, classes=classes, quotas=[], now=1000.0)
    assert [v.run_id for v in d.preemptions[0].victims] == [1]
    d = schedule(hosts=fleet, jobs=jobs, classes=classes, quotas=[], now=1000.0, moves=False)
    assert d.preemptions == []


def test_behind_a_reserved_head_a_move_uses_only_what_runs_past_its_start_may_use():
    # Run 3, a 2-host gang, is the head: it reserves h1 and h2 (their runs end first) and
    # starts in 20 minutes. Run 5 runs past that: it may not use h1's free GPUs, and gets run 4
    # moved from h3 into h4's free GPUs instead, not run 1 into h3's.
    fleet = fleet_using(("h1", 4), ("h2", 8), ("h3", 4), ("h4", 4))
    movable = {"class_name": "batch", "last_checkpoint_age_s": 60.0}
    jobs = [
        running(1, {"h1": 4}, est_remaining_s=600.0, **movable),
        running(2, {"h2": 8}, class_name="pinned", est_remaining_s=1200.0),
        job(3, class_name="batch", hosts=2, est_remaining_s=3600.0),
        running(4, {"h3": 4}, **movable),
        running(6, {"h4": 4}, class_name="pinned"),
        job(5, class_name="batch", est_remaining_s=7200.0),
    ]
    d = run(fleet, jobs)
    assert "behind higher-priority run" not in d.waiting[3]
    [plan] = d.preemptions
    assert plan.requester_run_id == 5
    assert [v.run_id for v in plan.victims] == [4]
    assert "moving run(s) 4 to h4" in plan.reason


def test_a_run_already_stopping_for_another_request_is_not_moved():
    fleet, jobs = moving_fleet()
    fleet.append(host("h3", free=4))
    jobs.append(running(4, {"h3": 4}, class_name="pinned"))
    jobs[0].preemption_pending = True  # its own request moves it (to h2, say)
    d = run(fleet, jobs)
    assert d.preemptions == []


# -- preemptible backfill: a gathering gang's hosts lent to jobs that agree to stop ----------


def test_a_preemptible_job_is_lent_a_gathering_gangs_hosts_until_it_can_start():
    # the head, a 3-host gang, starts at t+1000 on h1, h2 and h3; a batch job that runs past
    # that may still take h1, which would idle until then, on the terms that it stops then
    fleet, jobs = _gang_head_fleet()
    long = job(11, gpus=8, class_name="batch", est_remaining_s=20_000.0)
    d = run(fleet, [*jobs, long])
    [p] = d.placements
    assert p.run_id == 11 and p.lent_to == 10
    assert p.reason == "placed on h1 by backfill until run 10 can start (then stopped for it)"
    assert d.waiting[10].startswith("waiting: needs 3 host(s)")
    # a class whose stop a person must approve is not lent; nor when lending is switched off
    d = run(fleet, [*jobs, job(11, gpus=8, est_remaining_s=20_000.0)])
    assert placed(d) == {} and d.waiting[11] == "waiting: behind higher-priority run 10"
    d = schedule(
        hosts=fleet, jobs=[*jobs, long], classes=CLASSES, quotas=[], now=1000.0, lend=False
    )
    assert placed(d) == {}


def test_no_loan_when_the_head_starts_soon_or_the_job_was_stopped_often():
    fleet, jobs = _gang_head_fleet()
    jobs[0].est_remaining_s = 300.0  # the gang starts in 5 minutes: not worth a stop
    d = run(fleet, [*jobs, job(11, gpus=8, class_name="batch", est_remaining_s=20_000.0)])
    assert placed(d) == {}
    fleet, jobs = _gang_head_fleet()
    tired = job(11, gpus=8, class_name="batch", est_remaining_s=20_000.0, lent_stops=LEND_MAX_STOPS)
    d = run(fleet, [*jobs, tired])
    assert placed(d) == {} and d.waiting[11] == "waiting: behind higher-priority run 10"


def _loan_fleet(blocker_left_s: float, *, lent: bool = True):
    # h1 runs a batch job lent to the gang's capacity; h2's own job ends in `blocker_left_s`;
    # h3 is idle. The head, a 3-host gang of a class that may not preempt, needs all three.
    fleet = fleet_using(("h1", 8), ("h2", 8), ("h3", 0))
    jobs = [
        running(11, {"h1": 8}, class_name="batch", lent=lent, last_checkpoint_age_s=120.0),
        running(1, {"h2": 8}, class_name="pinned", est_remaining_s=blocker_left_s),
        job(10, gpus=8, hosts=3),
    ]
    return fleet, jobs


def test_lent_jobs_are_stopped_as_the_last_of_the_others_end_on_the_gangs_hosts():
    d = run(*_loan_fleet(blocker_left_s=30.0))  # within the lent job's 60 s grace
    [plan] = d.preemptions
    assert plan.kind == "backfill" and plan.requester_run_id == 10
    assert [v.run_id for v in plan.victims] == [11]
    assert plan.auto_approved  # batch approves at once: it checkpointed 2 minutes ago
    assert plan.reason == (
        "can start on h1, h2, h3 in pool h200: stopping backfilled run(s) 11, placed there "
        "by backfill until a run ahead of them could start"
    )
    assert plan.victims[0].gpu_hours_since_checkpoint == round(8 * 120.0 / 3600.0, 4)
    assert d.waiting[10] == "waiting: preemption of run(s) 11 requested (auto-approved)"


def test_lent_jobs_run_on_while_the_gang_waits_and_others_are_never_stopped_for_it():
    d = run(*_loan_fleet(blocker_left_s=3000.0))  # h2 is busy for 50 more minutes
    assert d.preemptions == [] and placed(d) == {}
    # the reservation counts the lent job as gone once stopped: the head starts with h2's
    # job, so a job that ends before that may still use h3
    fleet, jobs = _loan_fleet(blocker_left_s=3000.0)
    d = run(fleet, [*jobs, job(12, gpus=8, class_name="pinned", est_remaining_s=2000.0)])
    assert placed(d) == {12: ["h3"]}
    # a job not placed on those terms stays: this class may not preempt it
    d = run(*_loan_fleet(blocker_left_s=30.0, lent=False))
    assert d.preemptions == []


def test_a_lent_job_of_a_higher_class_than_the_head_is_not_stopped_for_it():
    classes = {
        **CLASSES,
        "standard": PriorityClass(
            "standard", 50, False, True, "auto_recent_checkpoint", auto_approve_minutes=30
        ),
    }
    fleet, jobs = _loan_fleet(blocker_left_s=30.0)
    jobs[0].class_name = "standard"
    jobs[2].class_name = "batch"
    d = schedule(hosts=fleet, jobs=jobs, classes=classes, quotas=[], now=1000.0)
    assert d.preemptions == []


def test_a_gang_may_be_lent_capacity_and_is_stopped_whole():
    # h1 and h3 idle, h2 busy until t+1000: the head, a 3-host gang, reserves all three; a
    # 2-host batch gang that runs past t+1000 is lent h1 and h3
    fleet, jobs = _gang_head_fleet()
    d = run(fleet, [*jobs, job(11, gpus=8, hosts=2, class_name="batch", est_remaining_s=9e4)])
    [p] = d.placements
    assert sorted(a.host for a in p.allocations) == ["h1", "h3"] and p.lent_to == 10
    # once h2's job is about to end, the lent gang is stopped, both hosts in one plan
    fleet = fleet_using(("h1", 8), ("h2", 8), ("h3", 8))
    jobs = [
        running(11, {"h1": 8, "h3": 8}, class_name="batch", lent=True, last_checkpoint_age_s=60),
        running(1, {"h2": 8}, class_name="pinned", est_remaining_s=30.0),
        job(10, gpus=8, hosts=3),
    ]
    [plan] = run(fleet, jobs).preemptions
    assert plan.kind == "backfill" and [v.run_id for v in plan.victims] == [11]


def test_loans_end_a_minute_before_the_head_can_start_whatever_the_grace_period():
    slow = PriorityClass(
        "slow", 10, False, True, "auto_recent_checkpoint", auto_approve_minutes=30, grace_s=3600
    )
    classes = {**CLASSES, "slow": slow}
    for left, stops in ((30.0, True), (600.0, False)):  # an hour's grace would stop it early
        fleet, jobs = _loan_fleet(blocker_left_s=left)
        jobs[0].class_name = "slow"
        d = schedule(hosts=fleet, jobs=jobs, classes=classes, quotas=[], now=1000.0)
        assert bool(d.preemptions) == stops, left
