"""Scenario tests of the policy core's decisions, through the public API."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from helpers import demand, owners, register, spec

from rlix.core import (
    ClusterSpec,
    InvariantViolation,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    ShrinkReason,
    Stage,
    Unregister,
    WorkerLoad,
    check_ledger,
)
from rlix.core.passes import fill_idle, gang_pass, rollout_needs
from rlix.core.policies import RlixPolicy
from rlix.core.shares import checked_counts
from rlix.core.state import PipelineEntry

NODE8 = ClusterSpec(nodes=1, gpus_per_node=8)
TWO_NODES = ClusterSpec(nodes=2, gpus_per_node=4)
PROPORTIONAL = SchedulerConfig(weight_by_demand=True, small_first=0.0, path_halving_s=0.0)  # the split by current demand alone
EQUAL = SchedulerConfig(small_first=0.0, path_halving_s=0.0)  # the default split without urgency: equal entitlement


def two_jobs(policy="rlix", config=SchedulerConfig()):
    sched = Scheduler(TWO_NODES, policy, config)
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    return sched


# ------------------------------------------------------------------ gang stages


def test_gang_stage_preempts_only_overlapping_rollout_workers():
    sched = two_jobs()
    sched.step(0, [demand("a", 40), demand("b", 40)])
    assert sum(len(v) for v in owners(sched).values()) == 8
    plan = sched.step(1, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert [g.gpus for g in plan.grants] == [(0, 1, 2, 3)]
    shrunk = sorted(s.worker.gpus[0] for s in plan.shrinks)
    assert shrunk == [0, 1, 2, 3]
    assert all(s.reason is ShrinkReason.GANG for s in plan.shrinks)
    assert all(w >= 4 for ws in owners(sched).values() for w in ws)  # 4..7 untouched


def test_gang_stage_waits_for_another_gang_and_never_preempts_it():
    sched = two_jobs()
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN, role=None)])
    # b's reference role is mapped over a's training GPUs (b's home is its own: no guest rule)
    sched2 = Scheduler(TWO_NODES, "rlix")
    register(sched2, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8), reference=range(2, 6), home=range(4, 8)))
    sched2.step(0, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    plan = sched2.step(1, [RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS)])
    assert plan.grants == ()
    assert sched2.pending_requests() == [("b", Stage.REF_LOGPROBS)]
    plan = sched2.step(2, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.REF_LOGPROBS)]


def test_blocked_high_priority_request_reserves_its_gpus():
    sched = Scheduler(NODE8, "rlix")
    register(sched, spec("a", range(4), range(8)), spec("b", range(2, 8), range(8), reference=range(6, 8), home=range(4, 8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])  # holds 0-3
    # b's actor_train (priority 1) waits on 2-3; b's ref (priority 4) needs 6-7 only, which b's
    # blocked training has reserved, so it must not jump the queue.
    plan = sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS)]
    )
    assert plan.grants == ()
    plan = sched.step(2, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert [g.stage for g in plan.grants] == [Stage.ACTOR_TRAIN]


def test_priority_order_between_waiting_gangs():
    sched = Scheduler(NODE8, "rlix")
    register(sched, spec("a", range(8), range(8)), spec("b", range(8), range(8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS)])
    sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.OLD_LOGPROBS), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    plan = sched.step(2, [ReleaseStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("a", Stage.ACTOR_TRAIN)]  # priority 1 beats 3


def test_a_higher_priority_jobs_stage_goes_before_an_earlier_and_more_urgent_one():
    sched = Scheduler(NODE8, "rlix")
    register(
        sched,
        spec("a", range(8), range(8), home=(0, 1)),  # homes of their own: no job is another's guest
        spec("b", range(8), range(8), home=(2, 3)),
        spec("vip", range(8), range(8), priority=1, home=range(4, 8)),
    )
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS)])
    # b's training (stage priority 1) asked first; vip's ref log-probs (stage priority 4) asked later
    sched.step(1, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)])
    sched.step(2, [RequestStage(pipeline_id="vip", stage=Stage.REF_LOGPROBS, role=Role.ACTOR_TRAIN)])
    assert sched.pending_requests() == [("vip", Stage.REF_LOGPROBS), ("b", Stage.ACTOR_TRAIN)]
    plan = sched.step(3, [ReleaseStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("vip", Stage.REF_LOGPROBS)]
    plan = sched.step(4, [ReleaseStage(pipeline_id="vip", stage=Stage.REF_LOGPROBS)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.ACTOR_TRAIN)]


def test_out_of_range_priorities_are_refused_with_the_field_named():
    sched = Scheduler(NODE8, "rlix")
    with pytest.raises(SchedulingError, match="priority=11"):
        register(sched, spec("a", range(4), range(8), priority=11))
    with pytest.raises(SchedulingError, match="priority_weight"):
        Scheduler(NODE8, "rlix", SchedulerConfig(priority_weight=0.5))


def test_static_admits_in_arrival_order_and_a_waiting_job_gets_no_rollout():
    sched = Scheduler(NODE8, "static")
    # a holds 0-3; b (home 0-7) asked first, d (home 4-7) later: d must not jump b's place in the queue
    register(sched, spec("a", range(4), range(4)), spec("b", range(8), range(8)), spec("d", range(4, 8), range(4, 8)))
    assert [g.pipeline_id for g in sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)]).grants] == ["a"]
    sched.step(1, [RequestStage(pipeline_id="b", stage=Stage.INIT)])
    plan = sched.step(2, [RequestStage(pipeline_id="d", stage=Stage.INIT), demand("b", 16), demand("d", 16)])
    assert plan.grants == () and owners(sched)["b"] == [] and owners(sched)["d"] == []
    sched.step(3, [ReleaseStage(pipeline_id="a", stage=Stage.INIT)])
    plan = sched.step(4, [Unregister(pipeline_id="a")])
    assert [g.pipeline_id for g in plan.grants] == ["b"]  # first come, first admitted


# ------------------------------------------------------------------ rollout split


@pytest.mark.parametrize(
    ("priority_weight", "expected"), [(2.0, {"a": 3, "b": 5}), (1.0, {"a": 4, "b": 4}), (3.0, {"a": 2, "b": 6})]
)
def test_a_higher_priority_jobs_rollout_demand_weighs_more(priority_weight, expected):
    sched = Scheduler(NODE8, "rlix", SchedulerConfig(priority_weight=priority_weight))
    register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1, priority=1))
    sched.step(0, [demand("a", 8), demand("b", 8)])  # equal demand; b's weight is priority_weight x a's
    assert {pid: len(ws) for pid, ws in owners(sched).items()} == expected


def test_split_is_proportional_with_the_floor_inside_the_share():
    sched = two_jobs(config=PROPORTIONAL)
    plan = sched.step(0, [demand("a", 40), demand("b", 8)])
    counts = {pid: len(ws) for pid, ws in owners(sched).items()}
    # shares 40:8 of 8 GPUs = 6.67 and 1.33 workers; the last GPU goes to the larger remainder
    assert counts == {"a": 7, "b": 1}
    assert len(plan.expands) == 8 and not plan.shrinks


def test_by_default_jobs_have_equal_entitlement_and_demand_only_caps_a_share():
    # a says 80 trajectories are left, b 28, c 4 (slots 4: needs of 8 bundles, 7 and 1 workers)
    sched = Scheduler(NODE8, "rlix", EQUAL)
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)), spec("c", (0,), range(8)))
    sched.step(0, [demand("a", 80), demand("b", 28), demand("c", 4)])
    # c is capped at its one worker; a and b split the other 7 GPUs evenly (by demand: 5 and 2)
    counts = {pid: len(ws) for pid, ws in owners(sched).items()}
    assert counts["c"] == 1 and sorted([counts["a"], counts["b"]]) == [3, 4]


@pytest.mark.parametrize("config", [EQUAL, SchedulerConfig(), PROPORTIONAL])
def test_a_job_that_reports_twice_its_queue_gets_no_more_workers_than_the_truth(config):
    # a's batch is 8 trajectories (declared: open_limit 8); b has 24 queued (slots 4)
    def workers_of_a(pending: int) -> int:
        sched = Scheduler(NODE8, "rlix", config)
        register(sched, spec("a", range(4), range(8), open_limit=8), spec("b", range(4, 8), range(8)))
        sched.step(0, [demand("a", pending), demand("b", 24)])
        return len(owners(sched)["a"])

    assert workers_of_a(8) == 2  # what its 8 trajectories fill
    assert workers_of_a(16) == 2  # undeclared, a lie would win it 4 (equal shares) or 3 (16:24 by demand)


def test_a_worker_counts_no_more_running_trajectories_than_its_slots():
    sched = Scheduler(NODE8, "rlix", EQUAL)
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 4), demand("b", 24)])
    (first,) = owners(sched)["a"]
    sched.step(1, [demand("a", 0, {first: 40}), demand("b", 24)])  # 40 running on one 4-slot worker: a lie
    assert len(owners(sched)["a"]) == 1  # counted as 4: no second worker


@pytest.mark.parametrize("config", [EQUAL, SchedulerConfig(), PROPORTIONAL])
def test_running_trajectories_on_workers_the_job_does_not_hold_gain_it_nothing(config):
    """Before: every listed load counted as running, on GPUs the job held no worker on (one outside the
    cluster, even), past its declared open_limit; a load listed twice is refused."""

    def workers_of_a(loads: dict[int, int]) -> int:
        sched = Scheduler(NODE8, "rlix", config)
        register(sched, spec("a", range(4), range(8), open_limit=8), spec("b", range(4, 8), range(8)))
        sched.step(0, [demand("a", 8, loads, batch=8), demand("b", 24)])
        return len(owners(sched)["a"])

    assert workers_of_a({}) == 2
    assert workers_of_a({2: 4, 3: 4, 4: 4, 5: 4, 99: 4}) == 2
    sched = Scheduler(NODE8, "rlix", config)
    register(sched, spec("a", range(4), range(8)))
    twice = ReportDemand(pipeline_id="a", pending=0, loads=(WorkerLoad(first_gpu=0, active=1),) * 2, batch_size=2)
    with pytest.raises(SchedulingError, match="a worker's load is reported twice"):
        sched.step(0, [twice])


def test_a_batch_opened_as_a_worker_is_shrunk_is_credited_whole():
    """The report that opens a batch may list running trajectories on a worker a plan has just shrunk:
    they still count to the batch's credit (up to open_limit), though not to the split."""
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig())
    register(sched, spec("a", (3,), range(3), open_limit=8, batch_credit=True))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    sched.step(2, [demand("a", 4, {2: 4}, batch=8)])  # GPU 2: a worker it holds no more
    assert sched._view.pipelines["a"].credit_end == 8


def test_a_declared_total_caps_the_backlog_the_core_weighs():
    # a has 8 trajectories open and 8 of its 48 finished: at most 32 are backlog, whatever it says
    a = spec("a", range(4), range(8), open_limit=8, total_trajectories=48)
    assert checked_counts(a, demand("a", 8, backlog=200, finished=8), 0) == (8, 8, 32)
    assert checked_counts(a, demand("a", 8, backlog=20, finished=8), 0) == (8, 8, 20)  # the truth is not cut
    assert checked_counts(a, demand("a", 30, batch=30, finished=8), 2) == (8, 8, 0)  # 2 running, 28 queued: 8 open at most
    assert checked_counts(spec("b", range(4), range(8)), demand("b", 30, backlog=200), 2) == (32, 30, 200)  # undeclared


def test_batches_are_credited_one_by_one_when_the_job_declares_it():
    a = PipelineEntry.joining(spec("a", range(4), range(8), open_limit=16, batch_credit=True), order=0, rollout_bundles=())

    def weighed(pending: int, running: int, finished: int) -> int:
        report = demand("a", pending, {0: running} if running else None, finished=finished)
        a.record_demand(report, 0.0)
        return checked_counts(a.spec, report, running, a.credit_end)[0]

    assert weighed(16, 0, 0) == 16  # a batch opens: credited up to open_limit
    assert weighed(4, 8, 4) == 12  # the truth: 16 - 4 finished
    assert weighed(30, 8, 6) == 10  # a claim of more than the batch has left counts as what it has left
    assert weighed(0, 0, 16) == 0  # the batch is done
    assert weighed(16, 0, 16) == 16  # so the next one may open
    assert weighed(3, 8, 21) == 11
    assert weighed(19, 8, 21) == 11  # 16 more announced: not credited before a release
    a.note_release()  # a training released: the batch announced in the report just sent opens
    report = a.demand
    assert checked_counts(a.spec, report, 8, a.credit_end)[0] == 16  # up to open_limit, running ones included
    assert weighed(19, 8, 21) == 16  # and in the report after the release too
    assert weighed(19, 8, 22) == 15  # then the credit holds again


def test_a_finished_count_that_falls_is_read_as_the_highest_one_reported():
    """Before: a job near the end of its batch that reported ``finished=0`` with more trajectories queued
    had its whole credit back (the remaining work was the credit's end less the finished count it said)."""
    a = PipelineEntry.joining(spec("a", range(4), range(8), open_limit=16, batch_credit=True), order=0, rollout_bundles=())

    def weighed(pending: int, running: int, finished: int) -> int:
        a.record_demand(demand("a", pending, {0: running} if running else None, finished=finished), 0.0)
        return checked_counts(a.spec, a.demand, running, a.credit_end)[0]

    assert weighed(16, 0, 0) == 16
    assert weighed(0, 2, 14) == 2
    assert weighed(14, 2, 0) == 2  # finished trajectories do not come back
    assert a.demand.finished == 14


def test_batch_credit_is_declared_with_an_open_limit_only():
    sched = Scheduler(NODE8, "rlix")
    with pytest.raises(SchedulingError, match="batch_credit=True: must be a bool, and True only with an open_limit"):
        register(sched, spec("a", range(4), range(8), batch_credit=True))


def test_a_declared_open_limit_caps_the_demand_the_core_weighs():
    sched = Scheduler(NODE8, "rlix", PROPORTIONAL)
    register(sched, spec("a", range(4), range(8), open_limit=8), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 40), demand("b", 8)])
    # a's 40 count as its declared 8: a split 8:8 of 8 GPUs, not 40:8
    assert {pid: len(ws) for pid, ws in owners(sched).items()} == {"a": 2, "b": 2}


def test_split_by_duration_follows_remaining_work_not_counts():
    # a: 8 short trajectories (5 s), b: 8 long ones (95 s); equal counts, 19x the work
    reports = [demand("a", 8, trajectory_s=5.0), demand("b", 8, trajectory_s=95.0)]
    by_count = Scheduler(NODE8, "rlix", PROPORTIONAL)
    register(by_count, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    by_count.step(0, reports)
    assert {pid: len(ws) for pid, ws in owners(by_count).items()} == {"a": 4, "b": 4}
    by_work = Scheduler(
        NODE8, "rlix", SchedulerConfig(weight_by_demand=True, weight_by_duration=True, small_first=0.0, path_halving_s=0.0)
    )
    register(by_work, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    by_work.step(0, reports)
    # 1:19 of 8 GPUs is 0.4 : 7.6 workers; the floor is inside the share, so a gets
    # exactly its one worker and b the other 7 (not a floor each and then 1:19 of the rest)
    assert {pid: len(ws) for pid, ws in owners(by_work).items()} == {"a": 1, "b": 7}


def test_the_job_with_the_least_work_left_gets_more_of_the_split():
    # equal current batches; b has three more batches announced (backlog), a none
    reports = [demand("a", 8), demand("b", 8, backlog=24)]
    counts = {}
    for small_first in (0.0, 1.0, 3.0):
        sched = Scheduler(NODE8, "rlix", SchedulerConfig(small_first=small_first, path_halving_s=0.0))
        register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
        sched.step(0, reports)
        counts[small_first] = {pid: len(ws) for pid, ws in owners(sched).items()}
    # work left 8 : 32 -> weights 8 x 4^k : 8: 4 : 4, then 6.4 : 1.6, then 7.9 : 0.1 (b keeps its floor)
    assert counts == {0.0: {"a": 4, "b": 4}, 1.0: {"a": 6, "b": 2}, 3.0: {"a": 7, "b": 1}}


def test_the_job_with_the_most_work_left_gets_a_larger_share_when_small_first_is_off():
    sched = Scheduler(
        NODE8, "rlix", SchedulerConfig(weight_by_demand=True, small_first=0.0, path_halving_s=0.0, backlog_weight=1.0)
    )
    register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    sched.step(0, [demand("a", 8), demand("b", 8, backlog=24)])
    assert {pid: len(ws) for pid, ws in owners(sched).items()} == {"a": 2, "b": 6}  # 8 : 32 of 8 GPUs


@pytest.mark.parametrize(
    ("halving_s", "expected"), [(0.0, {"a": 4, "b": 4}), (600.0, {"a": 3, "b": 5}), (200.0, {"a": 1, "b": 7})]
)
def test_the_job_on_the_longest_chain_gets_more_of_the_split(halving_s, expected):
    # equal batches; b's chain of steps still ahead is 600 s longer than a's
    sched = Scheduler(NODE8, "rlix", SchedulerConfig(small_first=0.0, path_halving_s=halving_s))
    register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    reports = [
        ReportDemand(pipeline_id="a", pending=8, batch_size=8, path_s=1000.0),
        ReportDemand(pipeline_id="b", pending=8, batch_size=8, path_s=1600.0),
    ]
    sched.step(0, reports)
    # b's weight is 2 ** (600 / halving_s) times a's: 2x -> 2.67 : 5.33 workers, 8x -> 0.89 : 7.11 (a keeps its floor)
    assert {pid: len(ws) for pid, ws in owners(sched).items()} == expected


@pytest.mark.parametrize("knob", ["small_first", "path_halving_s"])
def test_negative_or_infinite_urgency_knobs_are_refused_with_the_knob_named(knob):
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(SchedulingError, match=knob):
            Scheduler(NODE8, "rlix", SchedulerConfig(**{knob: bad}))


def test_negative_or_nan_path_seconds_are_refused():
    sched = two_jobs()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(SchedulingError, match="path_s"):
            sched.step(0, [ReportDemand(pipeline_id="a", pending=4, path_s=bad)])


def test_split_by_duration_treats_an_unmeasured_pipeline_by_count():
    sched = Scheduler(NODE8, "rlix", SchedulerConfig(weight_by_duration=True))
    register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    sched.step(0, [demand("a", 8), demand("b", 8)])  # neither has finished a trajectory yet
    assert {pid: len(ws) for pid, ws in owners(sched).items()} == {"a": 4, "b": 4}


def test_negative_or_nan_trajectory_seconds_are_refused():
    sched = two_jobs()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(SchedulingError, match="trajectory_s"):
            sched.step(0, [demand("a", 4, trajectory_s=bad)])


def test_idle_gpus_are_used_before_anyone_is_shrunk():
    sched = two_jobs()
    sched.step(0, [demand("a", 12)])  # a needs 3 workers of 4 slots: 5 GPUs stay idle
    assert len(owners(sched)["a"]) == 3
    plan = sched.step(1, [demand("b", 400)])
    assert not plan.shrinks
    assert len(owners(sched)["b"]) == 5


def test_rebalance_respects_min_residency_then_moves_workers():
    cfg = SchedulerConfig(min_residency_s=30.0, backlog_weight=0.0)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 100)])
    assert len(owners(sched)["a"]) == 8
    loads = {g: 4 for g in owners(sched)["a"]}
    # equal remaining demand (68 queued + 32 running vs 100): equal shares
    plan = sched.step(10, [demand("a", 68, loads), demand("b", 100)])
    assert not plan.shrinks  # a's workers are too young to be taken
    plan = sched.step(40, [demand("a", 68, loads), demand("b", 100)])
    assert {s.reason for s in plan.shrinks} == {ShrinkReason.REBALANCE}
    counts = {pid: len(ws) for pid, ws in owners(sched).items()}
    assert counts == {"a": 4, "b": 4}
    plan = sched.step(80, [demand("a", 68, loads), demand("b", 100)])
    assert plan.empty  # settled: no worker moves back and forth


def test_nearly_finished_batch_keeps_its_busy_workers():
    cfg = SchedulerConfig(min_residency_s=0.0, protect_fraction=0.1, backlog_weight=0.0, home_guarantee=False)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 32)])
    loads = {g: 1 for g in owners(sched)["a"]}  # 8 stragglers of a 100-trajectory batch
    plan = sched.step(5, [demand("a", 0, loads, batch=100), demand("b", 400)])
    # protection yields only to b's floor: b gets one worker, a keeps the other seven
    assert len(plan.shrinks) == 1
    assert len(owners(sched)["a"]) == 7 and len(owners(sched)["b"]) == 1
    plan = sched.step(10, [demand("a", 0, {g: 1 for g in owners(sched)["a"]}, batch=100), demand("b", 400)])
    assert plan.empty


def test_idle_surplus_workers_go_to_a_pipeline_that_needs_them():
    cfg = SchedulerConfig(min_residency_s=1e9)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 32)])
    a_workers = owners(sched)["a"]
    loads = {a_workers[0]: 1}  # one straggler, seven empty workers
    plan = sched.step(5, [demand("a", 0, loads, batch=100), demand("b", 400)])
    assert len(plan.shrinks) == 7
    assert owners(sched)["a"] == [a_workers[0]]
    assert len(owners(sched)["b"]) == 7


def test_a_protected_batchs_stragglers_are_packed_for_a_job_that_waits():
    # a has 8 stragglers left of a 100-trajectory batch (protected), one on each of its
    # 8 workers; its 4-slot workers could hold them on two. b waits with 400 queued.
    cfg = SchedulerConfig(min_residency_s=0.0, small_first=0.0, path_halving_s=0.0)
    sched = Scheduler(TWO_NODES, "rlix", cfg)
    register(sched, spec("a", range(4), range(8), resumable=True), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 32)])
    loads = {g: 1 for g in owners(sched)["a"]}
    plan = sched.step(5, [demand("a", 0, loads, batch=100), demand("b", 400)])
    assert len(owners(sched)["a"]) == 2  # ceil(8 / 4): every straggler still has a slot
    assert len(owners(sched)["b"]) == 6 and len(plan.shrinks) == 6


def test_resumable_stragglers_are_packed_onto_fewer_workers():
    cfg = SchedulerConfig(min_residency_s=0.0)
    sched = Scheduler(TWO_NODES, "rlix", cfg)
    register(sched, spec("a", range(4), range(8), resumable=True), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 32)])
    loads = {g: 1 for g in owners(sched)["a"]}  # 8 stragglers fit one 4-slot worker pair
    sched.step(5, [demand("a", 0, loads, batch=8), demand("b", 24)])
    assert len(owners(sched)["a"]) == 2  # ceil(8 / 4)
    assert len(owners(sched)["b"]) == 6


def test_stale_report_makes_workers_lendable():
    cfg = SchedulerConfig(report_ttl_s=60.0, min_residency_s=1e9, backlog_weight=0.0)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 100)])
    loads = {g: 4 for g in owners(sched)["a"]}
    sched.step(10, [demand("a", 100, loads)])
    plan = sched.step(20, [demand("b", 100)])
    assert not plan.shrinks  # a reported 10 s ago: fresh, busy, protected by residency
    plan = sched.step(100, [demand("b", 100)])  # a silent for 90 s > ttl
    assert len(owners(sched)["b"]) == 8 and len(plan.shrinks) == 8


def test_unregister_frees_everything():
    sched = two_jobs()
    sched.step(0, [demand("a", 100), RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)])
    plan = sched.step(1, [Unregister(pipeline_id="b")])
    assert sched.pipelines() == ["a"]
    assert not any(s.worker.pipeline_id == "a" for s in plan.shrinks)
    assert len(owners(sched)["a"]) == 8  # b's training GPUs went to a
    check_ledger(sched.ledger)


# ------------------------------------------------------------------ baselines


def test_static_confines_rollout_to_home_and_stages_take_turns():
    sched = Scheduler(TWO_NODES, "static")
    register(sched, spec("a", range(2), range(8), home=range(4)), spec("b", range(4, 6), range(8), home=range(4, 8)))
    sched.step(0, [demand("a", 100), demand("b", 1)])
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": [4]}  # b's 5-7 stay idle, a can't have them
    plan = sched.step(1, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == [0, 1, 2, 3]  # all of a's rollout stops
    assert owners(sched)["a"] == []


def test_partial_overlap_keeps_rollout_on_non_training_gpus():
    sched = Scheduler(TWO_NODES, "partial_overlap")
    register(sched, spec("a", range(2), range(8), home=range(4)), spec("b", range(4, 6), range(8), home=range(4, 8)))
    sched.step(0, [demand("a", 100)])
    plan = sched.step(1, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == [0, 1]
    assert owners(sched)["a"] == [2, 3]


def test_static_refuses_a_pipeline_with_no_rollout_bundle_at_home():
    sched = Scheduler(TWO_NODES, "static")
    with pytest.raises(SchedulingError, match="no actor_infer bundle lies inside its home"):
        register(sched, spec("a", range(4), range(4, 8), home=range(4)))


def test_a_disaggregated_job_naming_no_home_gets_every_gpu_it_maps():
    sched = Scheduler(TWO_NODES, "static")
    register(sched, spec("a", range(4), range(4, 8)))  # rollout on GPUs of its own
    sched.step(1, [demand("a", 40)])
    assert owners(sched)["a"] == [4, 5, 6, 7]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda: spec("a", range(4), (3, 4), tp=2), "spans nodes 0 and 1"),
        (lambda: spec("a", range(4), (0, 2), tp=2), "not contiguous"),
        (lambda: spec("a", range(4), range(3), tp=2), "not a multiple"),
        (lambda: spec("a", range(4), range(6, 10)), "must lie in 0..7"),
        (lambda: spec("", range(4), range(4)), "pipeline_id"),
        (lambda: spec("a", (1, 0), range(4)), "sorted and unique"),
        (lambda: spec("a", range(4), range(4), open_limit=-1), "open_limit=-1: must be an int >= 0"),
    ],
)
def test_bad_topology_is_refused_with_the_field_named(bad, message):
    sched = Scheduler(TWO_NODES, "rlix")
    with pytest.raises(SchedulingError, match=message):
        register(sched, bad())
    assert sched.pipelines() == []


def test_duplicate_and_unknown_events_are_refused_without_changing_state():
    sched = two_jobs()
    with pytest.raises(SchedulingError, match="already registered"):
        register(sched, spec("a", range(4), range(8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    with pytest.raises(SchedulingError, match="duplicate request"):
        sched.submit(RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN), 1)
    with pytest.raises(SchedulingError, match="not registered"):
        sched.submit(demand("zz", 3), 1)
    with pytest.raises(SchedulingError, match="released without a request"):
        sched.submit(ReleaseStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), 1)
    with pytest.raises(SchedulingError, match="report rollout demand"):
        sched.submit(RequestStage(pipeline_id="a", stage=Stage.ROLLOUT), 1)
    with pytest.raises(SchedulingError, match="critic is not mapped"):
        sched.submit(RequestStage(pipeline_id="a", stage=Stage.CRITIC_TRAIN), 1)
    with pytest.raises(SchedulingError, match="unknown"):
        Scheduler(TWO_NODES, "fifo")
    assert sched.granted("a", Stage.ACTOR_TRAIN)
    check_ledger(sched.ledger)


def test_a_plan_that_breaks_an_invariant_is_replaced_by_a_safe_plan():
    class DoubleBooking(RlixPolicy):
        """Grants gangs but then also expands rollout onto the granted GPUs."""

        def plan(self, view, draft):
            gang_pass(view, draft, stop_own_rollout=False)
            needs = rollout_needs(view, blocked=set())
            for n in needs:
                for bundle in n.entry.rollout_bundles:
                    if draft.owner[bundle[0]] is not None:
                        draft.owner[bundle[0]] = None  # pretend it is free
                        draft.free_count += 1
            fill_idle(draft, needs)

    sched = Scheduler(TWO_NODES, DoubleBooking())
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(4, 8)))
    sched.submit(RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN), 0)
    sched.plan(0)
    sched.submit(demand("a", 100), 1)
    sched.submit(RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), 1)
    with pytest.warns(RuntimeWarning, match="no_gpu_owned_twice"):
        plan = sched.plan(1)
    # reported, and replaced by the safe plan: b's stage still starts, no rollout moves
    assert [v.invariant for v in sched.violations] == ["no_gpu_owned_twice"]
    assert isinstance(sched.violations[0], InvariantViolation)
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.ACTOR_TRAIN)]
    assert not plan.expands and not plan.shrinks
    check_ledger(sched.ledger)  # the bad plan was not applied
    sched.submit(demand("a", 99), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same violation is warned about only once
        sched.plan(2)
    assert len(sched.violations) == 2


# ------------------------------------------------------------------ placement, protection, switching


def test_a_wide_floor_is_placed_before_narrow_ones_take_its_bundle():
    sched = Scheduler(NODE8, "rlix")
    register(
        sched,
        spec("a", range(8), range(8), slots=1),
        spec("b", range(8), range(8), slots=1),
        spec("wide", range(4), range(4), tp=4, slots=1),
    )
    sched.step(0, [demand("a", 3), demand("b", 3), demand("wide", 1)])
    assert owners(sched)["wide"] == [0]
    assert sorted(owners(sched)["a"] + owners(sched)["b"]) == [4, 5, 6, 7]


def test_a_worker_goes_first_where_no_other_pipeline_could_go():
    sched = Scheduler(NODE8, "rlix")
    # 'only0' may use GPU 0 alone, inside the home of 'any', which may use all eight.
    register(sched, spec("any", range(4), range(8), slots=1), spec("only0", range(4, 8), (0,), slots=1))
    plan = sched.step(0, [demand("any", 8), demand("only0", 1)])
    assert owners(sched) == {"any": [1, 2, 3, 4, 5, 6, 7], "only0": [0]}
    assert not plan.shrinks


def test_protection_never_keeps_a_pipeline_below_its_floor_but_keeps_the_donors_last_worker():
    cfg = SchedulerConfig(min_residency_s=0.0, home_guarantee=False, floor_share=0.0)  # b is owed its floor
    node = ClusterSpec(nodes=1, gpus_per_node=2)
    sched = Scheduler(node, "rlix", cfg)
    register(sched, spec("a", range(2), range(2), slots=1), spec("b", range(2), range(2), slots=1))
    sched.step(0, [demand("a", 2, batch=100)])
    assert len(owners(sched)["a"]) == 2
    loads = {g: 1 for g in owners(sched)["a"]}
    sched.step(5, [demand("a", 0, loads, batch=100), demand("b", 50)])  # a: protected, 2 left
    assert len(owners(sched)["b"]) == 1 and len(owners(sched)["a"]) == 1
    sched.step(10, [demand("a", 1, {owners(sched)["a"][0]: 1}, batch=100), demand("b", 50)])
    assert len(owners(sched)["a"]) == 1  # never its last worker while its batch is protected


def test_packing_never_takes_a_protected_jobs_last_workers():
    # A TP-4 pipeline may take the whole node; a small resumable job finishing a protected batch
    # keeps one worker (its four stragglers can be packed onto it, never onto none).
    cfg = SchedulerConfig(min_residency_s=0.0)
    node = ClusterSpec(nodes=1, gpus_per_node=4)
    sched = Scheduler(node, "rlix", cfg)
    register(
        sched,
        spec("small", range(4), range(4), slots=4, resumable=True),
        spec("big", range(4), range(4), tp=4, slots=1),
    )
    sched.step(0, [demand("small", 16, batch=40)])
    assert len(owners(sched)["small"]) == 4
    loads = {g: 1 for g in owners(sched)["small"]}
    for t in (5, 10, 40):
        sched.step(t, [demand("small", 0, loads, batch=40), demand("big", 100)])
        assert len(owners(sched)["small"]) >= 1
        loads = {g: 1 for g in owners(sched)["small"]}


def test_a_worker_moves_only_after_amortising_its_switch():
    cfg = SchedulerConfig(min_residency_s=10.0)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 100)])
    loads = {g: 4 for g in owners(sched)["a"]}
    # a reports 60 s switches: its workers stay 2 x 60 s before a rebalance may take them
    reports = lambda t: [
        ReportDemand(
            pipeline_id="a",
            pending=68,
            loads=tuple(WorkerLoad(first_gpu=g, active=4) for g in sorted(loads)),
            batch_size=100,
            switch_s=60.0,
        ),
        demand("b", 100),
    ]
    assert not sched.step(60, reports(60)).shrinks
    assert sched.step(121, reports(121)).shrinks


def test_a_receiver_with_less_work_than_a_switch_takes_no_busy_worker():
    cfg = SchedulerConfig(min_residency_s=0.0)
    sched = two_jobs(config=cfg)
    sched.step(0, [demand("a", 100)])
    loads = {g: 4 for g in owners(sched)["a"]}
    short = ReportDemand(pipeline_id="b", pending=40, trajectory_s=1.0, switch_s=30.0, batch_size=40)
    plan = sched.step(5, [demand("a", 68, loads), short])
    assert len(plan.shrinks) == 1  # its first worker: a job with demand and no worker always gets one
    b = {g: 4 for g in owners(sched)["b"]}
    a = {g: n for g, n in loads.items() if g not in b}
    short = dataclasses.replace(short, pending=36, loads=tuple(WorkerLoad(first_gpu=g, active=n) for g, n in b.items()))
    assert not sched.step(7, [demand("a", 68, a), short]).shrinks  # 36 one-second trajectories: not worth a 30 s switch
    long = dataclasses.replace(short, trajectory_s=600.0)
    assert sched.step(10, [demand("a", 68, a), long]).shrinks


def test_between_donors_equally_above_their_share_the_one_furthest_from_finishing_gives():
    # a and b hold four workers each with 40 trajectories left; a is 80% through its batch,
    # b has just started. c's floor costs one worker: b gives it, not a (lower GPU ids).
    config = SchedulerConfig(
        weight_by_demand=True, min_residency_s=0.0, small_first=0.0, path_halving_s=0.0, home_guarantee=False
    )
    sched = Scheduler(NODE8, "rlix", config)
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)), spec("c", (0,), range(8)))
    sched.step(0, [demand("a", 40, batch=200), demand("b", 40)])
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7], "c": []}
    loads = {pid: {g: 4 for g in gpus} for pid, gpus in owners(sched).items()}
    plan = sched.step(5, [demand("a", 24, loads["a"], batch=200), demand("b", 24, loads["b"]), demand("c", 10)])
    assert [s.worker.pipeline_id for s in plan.shrinks] == ["b"]
    assert len(owners(sched)["a"]) == 4 and len(owners(sched)["b"]) == 3 and len(owners(sched)["c"]) == 1
