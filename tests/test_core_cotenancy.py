"""Co-tenants: jobs whose mappings overlap run at once and share those GPUs (the core's public API).

Every job here maps ``actor_train`` and ``actor_infer`` onto the same GPUs and names no home,
as RLix's own deployment does: none of them owns the GPUs, and none queues behind another.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import demand, owners, register, spec

from rlix.core import (
    ClusterSpec,
    QueueSpec,
    ReleaseStage,
    RequestStage,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    ShrinkReason,
    Stage,
    Unregister,
)

NODE8 = ClusterSpec(nodes=1, gpus_per_node=8)
EQUAL = SchedulerConfig(small_first=0.0, path_halving_s=0.0)  # no urgency factors: the plain split


def cotenants(*pids: str, config: SchedulerConfig = EQUAL, resumable: bool = False, slots: int = 4) -> Scheduler:
    sched = Scheduler(NODE8, "rlix", config)
    register(sched, *(spec(p, range(8), range(8), resumable=resumable, slots=slots, reference=range(8)) for p in pids))
    return sched


def grants(plan) -> list[tuple[str, Stage]]:
    return [(g.pipeline_id, g.stage) for g in plan.grants]


def test_a_cotenants_model_load_starts_at_once_on_gpus_the_other_rolls_out_on():
    sched = cotenants("a", "b")
    plan = sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(10, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 64)])
    assert len(owners(sched)["a"]) == 8  # a rolls out on the whole node
    plan = sched.step(11, [RequestStage(pipeline_id="b", stage=Stage.INIT)])
    assert grants(plan) == [("b", Stage.INIT)]  # not queued behind a's rollout
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == list(range(8))
    assert all(s.reason is ShrinkReason.GANG and s.worker.pipeline_id == "a" for s in plan.shrinks)


def test_a_cotenants_stage_preempts_only_the_workers_it_overlaps_whoever_holds_them():
    sched = Scheduler(NODE8, "rlix", EQUAL)
    register(sched, spec("a", range(8), range(8), reference=range(4)), spec("b", range(8), range(8)))
    sched.step(0, [demand("a", 40), demand("b", 40)])
    assert sorted(owners(sched)["a"] + owners(sched)["b"]) == list(range(8))
    plan = sched.step(1, [RequestStage(pipeline_id="a", stage=Stage.REF_LOGPROBS)])  # on GPUs 0-3
    assert grants(plan) == [("a", Stage.REF_LOGPROBS)]
    shrunk = {s.worker.gpus[0]: s.worker.pipeline_id for s in plan.shrinks}
    assert sorted(shrunk) == [0, 1, 2, 3] and set(shrunk.values()) == {"a", "b"}  # whoever held them, nothing on 4-7
    assert all(g >= 4 for ws in owners(sched).values() for g in ws)


def test_the_rollout_left_is_split_between_cotenants():
    sched = cotenants("a", "b")
    sched.step(0, [demand("a", 40)])
    assert len(owners(sched)["a"]) == 8  # an idle node is used whole
    sched.step(100, [demand("b", 40), demand("a", 8, loads={g: 4 for g in owners(sched)["a"]})])
    held = owners(sched)
    assert len(held["a"]) + len(held["b"]) == 8 and len(held["b"]) >= 3  # b is not kept waiting for a to finish


def test_an_idle_gpu_is_used_before_a_donor_is_shrunk():
    sched = cotenants("a", "b")
    sched.step(0, [demand("a", 8)])  # a fills 2 workers of 4 slots
    assert len(owners(sched)["a"]) == 2
    plan = sched.step(100, [demand("b", 40), demand("a", 0, loads={g: 4 for g in owners(sched)["a"]})])
    assert plan.shrinks == ()  # six GPUs were idle: nobody is shrunk for b
    assert len(owners(sched)["b"]) == 6


def test_a_move_is_not_reversed_in_the_next_plan():
    sched = cotenants("a", "b")
    sched.step(0, [demand("a", 40)])
    loads_a = {g: 4 for g in owners(sched)["a"]}
    first = sched.step(100, [demand("b", 40), demand("a", 8, loads=loads_a)])
    moved = {s.worker.gpus for s in first.shrinks}
    assert moved  # b got workers from a
    loads_b = {g: 4 for g in owners(sched)["b"]}
    again = sched.step(
        105, [demand("b", 40 - sum(loads_b.values()), loads=loads_b), demand("a", 8, loads={g: 4 for g in owners(sched)["a"]})]
    )
    assert not moved & {e.worker.gpus for e in again.expands if e.worker.pipeline_id == "a"}


def test_a_job_near_the_end_of_its_batch_donates_to_a_pending_one_and_keeps_one_worker():
    # a: 10 trajectories left of 100, spread one per worker over all 8 GPUs (resumable: they can be packed);
    # b: 90 trajectories waiting and no worker.
    sched = cotenants("a", "b", resumable=True)
    sched.step(0, [demand("a", 100)])
    assert len(owners(sched)["a"]) == 8
    loads = dict.fromkeys(owners(sched)["a"], 1)
    loads[0] = 3
    sched.step(200, [demand("a", 0, loads=loads, batch=100, finished=90), demand("b", 90, batch=90)])
    held = owners(sched)
    assert len(held["b"]) >= 4  # the donor's stragglers packed, its GPUs lent to the job with more work
    assert len(held["a"]) >= 1


def test_no_cotenants_stage_waits_behind_another_jobs_stages_twice_in_a_row():
    sched = cotenants("a", "b")
    # a and b both want a gang stage on the whole node: a's old log-probs come first (asked first)
    plan = sched.step(
        0, [RequestStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS), RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS)]
    )
    assert grants(plan) == [("a", Stage.OLD_LOGPROBS)]
    # a's training is of a higher stage priority than b's reference log-probs, but b has waited behind a once
    plan = sched.step(
        50, [ReleaseStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    assert grants(plan) == [("b", Stage.REF_LOGPROBS)]
    plan = sched.step(80, [ReleaseStage(pipeline_id="b", stage=Stage.REF_LOGPROBS)])
    assert grants(plan) == [("a", Stage.ACTOR_TRAIN)]


def test_a_cotenant_with_a_home_of_its_own_does_not_wait_behind_another_jobs_stages_twice_in_a_row():
    """Before: the stages of jobs that named a home did not age, so where their gang mappings overlap, a
    stage of low priority (reference log-probs) waited while two other jobs' higher ones took turns."""
    sched = Scheduler(NODE8, "rlix", EQUAL)
    homes = {"a": (0, 1), "b": (2, 3), "c": (4, 5)}
    register(sched, *(spec(p, range(8), range(8), home=h, reference=range(8)) for p, h in homes.items()))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.OLD_LOGPROBS)])
    sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS), RequestStage(pipeline_id="c", stage=Stage.OLD_LOGPROBS)]
    )
    order = []
    for t, (pid, done, then) in enumerate(
        (
            ("a", Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN),
            ("a", Stage.ACTOR_TRAIN, Stage.OLD_LOGPROBS),
            ("c", Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN),
        )
    ):
        plan = sched.step(30 * (t + 1), [ReleaseStage(pipeline_id=pid, stage=done), RequestStage(pipeline_id=pid, stage=then)])
        order += grants(plan)
    assert order == [("a", Stage.ACTOR_TRAIN), ("c", Stage.OLD_LOGPROBS), ("b", Stage.REF_LOGPROBS)]  # b's waited twice


def test_a_stage_waits_behind_another_jobs_stages_once_though_that_job_asked_for_two():
    """Before: a job's second pending stage kept the age it had before its first was granted, so it tied
    with the stage that had just waited behind the first, and went before it by stage priority."""
    sched = Scheduler(NODE8, "rlix", EQUAL)
    register(sched, spec("a", range(4, 8), range(8)), spec("b", range(8), range(8), reference=range(4, 8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.INIT)])
    asked = [RequestStage(pipeline_id="b", stage=Stage.INIT)]
    asked += [RequestStage(pipeline_id="a", stage=s) for s in (Stage.ACTOR_TRAIN, Stage.OLD_LOGPROBS)]
    assert grants(sched.step(2, asked)) == [("b", Stage.INIT)]  # a's two stages wait behind it
    sched.step(3, [RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS)])
    assert grants(sched.step(4, [ReleaseStage(pipeline_id="b", stage=Stage.INIT)])) == [("a", Stage.ACTOR_TRAIN)]
    plan = sched.step(5, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert grants(plan) == [("b", Stage.REF_LOGPROBS)]  # it waited behind a's training: a's other stage waits now


def test_stage_priority_orders_cotenants_stages_that_waited_alike():
    sched = cotenants("a", "b")
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    plan = sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.REF_LOGPROBS), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    assert grants(plan) == []  # a's model load holds the node
    plan = sched.step(60, [ReleaseStage(pipeline_id="a", stage=Stage.INIT)])
    # both waited behind the same model load (a's own); a's training goes first by stage priority
    assert grants(plan) == [("a", Stage.ACTOR_TRAIN)]


# ------------------------------------------------------------------ queues: explicit admission limits


def queued(config: SchedulerConfig, *specs) -> Scheduler:
    sched = Scheduler(NODE8, "rlix", config)
    register(sched, *specs)
    return sched


def test_a_queue_admits_its_jobs_one_at_a_time_in_arrival_order():
    one = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=1),))
    sched = queued(one, *(spec(p, range(8), range(8)) for p in ("a", "b", "c")))
    plan = sched.step(0, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("c", "a", "b")])
    assert grants(plan) == [("c", Stage.INIT)]  # asked first
    assert sched.admission_refusal("a") == "queue 'node' holds 1 of its 1 jobs" and sched.admission_refusal("c") is None
    sched.step(10, [ReleaseStage(pipeline_id="c", stage=Stage.INIT), demand("c", 8)])
    assert sched.pending_requests() == [("a", Stage.INIT), ("b", Stage.INIT)]  # the GPUs are free, the queue is not
    plan = sched.step(20, [Unregister(pipeline_id="c")])
    assert grants(plan) == [("a", Stage.INIT)]


def test_a_job_its_queue_holds_back_rolls_nothing_out_and_takes_no_place_in_the_queue():
    """Before: under rlix a job whose model load the queue refused got the node's idle GPUs for its
    rollout as soon as it reported demand, and that expand counted as its admission."""
    one = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=1),))
    sched = queued(one, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("a", "b")])
    plan = sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 0), demand("b", 100)])
    assert [e.worker.pipeline_id for e in plan.expands] == []
    assert sched.admitted_at("b") is None and sched.admission_refusal("b") == "queue 'node' holds 1 of its 1 jobs"
    plan = sched.step(2, [demand("a", 8)])
    assert {e.worker.pipeline_id for e in plan.expands} == {"a"}


def test_a_queue_of_resident_memory_refuses_a_model_that_does_not_fit_and_says_so():
    host = SchedulerConfig(queues=(QueueSpec(name="host", gpus=tuple(range(8)), max_resident_gb=64.0),))
    big = [dataclasses.replace(spec(p, range(8), range(8)), resident_gb=40.0) for p in ("a", "b")]
    small = dataclasses.replace(spec("c", range(8), range(8)), resident_gb=20.0)
    sched = queued(host, *big, small)
    plan = sched.step(0, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("a", "b", "c")])
    assert grants(plan) == [("a", Stage.INIT)]  # b does not fit beside a, and c waits behind b (first come, first served)
    assert sched.admission_refusal("b") == "queue 'host' has 24.0 GB of resident model memory free, the job needs 40.0 GB"


def test_without_a_queue_cotenants_are_all_admitted():
    sched = cotenants("a", "b", "c")
    plan = sched.step(0, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("a", "b", "c")])
    assert grants(plan) == [("a", Stage.INIT)]  # the model loads take the node in turn, not the jobs
    for t, pid in ((30, "b"), (60, "c")):
        prev = {"b": "a", "c": "b"}[pid]
        plan = sched.step(t, [ReleaseStage(pipeline_id=prev, stage=Stage.INIT), demand(prev, 16)])
        assert grants(plan) == [(pid, Stage.INIT)]


def test_a_queue_is_first_come_first_served_even_for_a_later_job_whose_gpus_are_free():
    two = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=2),))
    sched = queued(two, spec("a", range(4), range(8)), spec("b", range(4), range(8)), spec("c", range(4, 8), range(8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert sched.step(2, [RequestStage(pipeline_id="b", stage=Stage.INIT)]).grants == ()  # a's training holds 0-3
    plan = sched.step(3, [RequestStage(pipeline_id="c", stage=Stage.INIT)])
    assert plan.grants == ()  # room in the queue and GPUs 4-7 free, but b asked first
    plan = sched.step(4, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert grants(plan) == [("b", Stage.INIT)]
    assert sched.admission_refusal("c") == "queue 'node' holds 2 of its 2 jobs"


def test_a_jobs_own_grants_do_not_age_its_other_requests():
    sched = Scheduler(NODE8, "rlix", EQUAL)
    register(sched, spec("a", range(8), range(8), reference=range(4)), spec("b", range(8), range(8)))
    plan = sched.step(
        0, [RequestStage(pipeline_id="a", stage=Stage.REF_LOGPROBS), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    assert grants(plan) == [("a", Stage.ACTOR_TRAIN)]  # a's own training: its reference log-probs are not passed over
    sched.step(1, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)])
    plan = sched.step(2, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert grants(plan) == [("b", Stage.ACTOR_TRAIN)]  # by stage priority: neither has waited behind another job


def test_the_most_slowed_cotenants_stage_goes_first():
    def first_granted(config: SchedulerConfig) -> str:
        sched = Scheduler(NODE8, "rlix", config)
        register(sched, *(spec(p, range(8), range(8)) for p in ("a", "b")))
        # both had 1,000 s of steps ahead alone; by 1,000 s a has 200 s left, b 900 s: b is slowed far more
        chain = {"a": (1000.0, 200.0), "b": (1000.0, 900.0)}
        sched.step(0, [dataclasses.replace(demand(p, 0), path_s=chain[p][0]) for p in ("a", "b")])
        sched.step(1000, [dataclasses.replace(demand(p, 0), path_s=chain[p][1]) for p in ("a", "b")])
        plan = sched.step(1001, [RequestStage(pipeline_id=p, stage=Stage.ACTOR_TRAIN) for p in ("a", "b")])
        return grants(plan)[0][0]

    assert first_granted(dataclasses.replace(EQUAL, slowdown_weight=0.0)) == "a"  # asked first
    assert first_granted(EQUAL) == "b"  # slowdown_weight 5, the default


def test_stage_yield_lets_a_far_more_slowed_cotenants_rollout_go_on_until_the_waiting_job_is_slowed_too():
    busy_b = dataclasses.replace(demand("b", 8, loads={g: 4 for g in range(8)}), path_s=900.0)

    def asked(config: SchedulerConfig, *, home: bool = False, a_path: float = 1000.0, b_busy: bool = True):
        sched = Scheduler(NODE8, "rlix", config)
        a = spec("a", range(8), range(8), home=range(8) if home else ())
        register(sched, a, spec("b", range(8), range(8)))
        sched.step(0, [dataclasses.replace(demand(p, 0), path_s=a_path if p == "a" else 1000.0) for p in ("a", "b")])
        # alone, each had 1,000 s of steps ahead; by 1,000 s a has 200 s left (slowdown 1.19), b 900 s (1.85)
        sched.step(
            1000,
            [dataclasses.replace(demand("a", 0), path_s=min(a_path, 200.0)), dataclasses.replace(demand("b", 40), path_s=900.0)],
        )
        assert len(owners(sched)["b"]) == 8
        b_now = busy_b if b_busy else dataclasses.replace(demand("b", 0), path_s=900.0)
        return sched, sched.step(1001, [b_now, RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])

    _, plan = asked(EQUAL)  # off, the default: the seed's stage priority, every gang stage before rollout
    assert grants(plan) == [("a", Stage.ACTOR_TRAIN)] and {s.worker.pipeline_id for s in plan.shrinks} == {"b"}
    on = dataclasses.replace(EQUAL, stage_yield=1.5)
    sched, plan = asked(on)
    assert grants(plan) == [] and not plan.shrinks and len(owners(sched)["b"]) == 8  # b is 1.56x as slowed: it rolls on
    assert grants(sched.step(1100, [busy_b])) == []  # 1.28 against 1.94: still 1.51x
    plan = sched.step(1300, [busy_b])  # a's slowdown grew as it waited: 1.47 against 2.13 (1.45x)
    assert grants(plan) == [("a", Stage.ACTOR_TRAIN)] and len(plan.shrinks) == 8
    # No yield to a job with a home of its own, to idle workers, or for an unmeasured slowdown (a's 1.0: no chain reported)
    assert grants(asked(on, home=True)[1]) == [("a", Stage.ACTOR_TRAIN)]
    assert grants(asked(on, b_busy=False)[1]) == [("a", Stage.ACTOR_TRAIN)]
    assert grants(asked(on, a_path=0.0)[1]) == [("a", Stage.ACTOR_TRAIN)]
    # and for turn_limit_s at most: past it the stage starts, however slowed b is
    sched, plan = asked(dataclasses.replace(on, turn_limit_s=100.0))
    assert grants(plan) == [] and grants(sched.step(1050, [busy_b])) == []  # 1.53x
    assert grants(sched.step(1102, [busy_b])) == [("a", Stage.ACTOR_TRAIN)]  # still 1.51x, but asked 101 s ago


@pytest.mark.parametrize("ratio", [0.5, 1.0, -1.0, float("inf"), float("nan")])
def test_a_stage_yield_of_1_or_below_or_not_finite_is_refused(ratio):
    with pytest.raises(SchedulingError, match="stage_yield"):
        Scheduler(NODE8, "rlix", SchedulerConfig(stage_yield=ratio))


def test_finish_time_fairness_leaves_jobs_with_homes_of_their_own_alone():
    def split(first, second) -> tuple[int, int]:
        sched = Scheduler(NODE8, "rlix", dataclasses.replace(EQUAL, home_guarantee=False))  # the split by weight alone
        register(sched, first, second)
        sched.step(0, [dataclasses.replace(demand(p, 40), path_s=1000.0) for p in ("a", "b")])
        sched.step(1000, [dataclasses.replace(demand(p, 40), path_s=s) for p, s in (("a", 200.0), ("b", 900.0))])
        return len(owners(sched)["a"]), len(owners(sched)["b"])

    homes = spec("a", range(4), range(8)), spec("b", range(4, 8), range(8))  # disjoint training: each a home
    assert split(*homes) == (4, 4)  # b's slowdown weighs nothing
    shared = spec("a", range(8), range(8)), spec("b", range(8), range(8))  # co-tenants
    a, b = split(*shared)
    assert b > a  # the more slowed co-tenant gets more of the rollout capacity


def test_the_makespan_factor_favours_no_cotenant_past_the_urgency_cap():
    # By 1,000 s, a has 3,100 s of its 4,000 s chain left (slowdown 1.03) and b all of its 1,000 s
    # (1.94): b is slowed far more, 24x in weight at slowdown_weight 5. But a's chain is the longest,
    # 2,100 s longer: path_halving_s alone weighs b 2^(-2100/350) = 1/64 against a, and the
    # makespan factor outweighs b's slowdown. Capped at 8 (urgency_cap), it does not.
    def split(urgency_cap: float) -> tuple[int, int]:
        config = SchedulerConfig(small_first=0.0, path_halving_s=350.0, urgency_cap=urgency_cap, floor_share=0.0)
        sched = Scheduler(NODE8, "rlix", config)
        register(sched, *(spec(p, range(8), range(8)) for p in ("a", "b")))
        sched.step(0, [dataclasses.replace(demand(p, 40), path_s=s) for p, s in (("a", 4000.0), ("b", 1000.0))])
        sched.step(1000, [dataclasses.replace(demand(p, 40), path_s=s) for p, s in (("a", 3100.0), ("b", 1000.0))])
        return len(owners(sched)["a"]), len(owners(sched)["b"])

    uncapped, capped = split(0.0), split(8.0)
    assert uncapped[0] > uncapped[1]  # the longest chain gets the most
    assert capped[1] > capped[0]  # the most slowed co-tenant gets the most


def test_a_cotenant_owed_under_floor_share_of_a_worker_takes_turns_instead_of_holding_a_floor():
    # equal batches, but b has three more announced (backlog): with small_first 3 (uncapped) it is
    # owed 0.1 worker. With floor_share off it holds a floor all along; with it (0.5, the default) a has the
    # whole node until b has waited min_residency_s (30 s): b starves and gets its turn.
    def held(floor_share: float) -> list[dict[str, int]]:
        config = SchedulerConfig(
            small_first=3.0, path_halving_s=0.0, urgency_cap=0.0, floor_share=floor_share, min_residency_s=30.0
        )
        sched = cotenants("a", "b", config=config, slots=1)
        out = []
        for now in (0, 20, 31):
            sched.step(now, [demand("a", 8), demand("b", 8, backlog=24)])
            out.append({pid: len(ws) for pid, ws in owners(sched).items()})
        return out

    assert held(0.0) == [{"a": 7, "b": 1}] * 3
    assert held(0.5) == [{"a": 8, "b": 0}, {"a": 8, "b": 0}, {"a": 7, "b": 1}]
    # jobs with homes of their own keep their floors: floor_share is a co-tenants' rule
    sched = Scheduler(NODE8, "rlix", SchedulerConfig(small_first=3.0, path_halving_s=0.0, urgency_cap=0.0, home_guarantee=False))
    register(sched, spec("a", range(4), range(8), slots=1), spec("b", range(4, 8), range(8), slots=1))
    sched.step(0, [demand("a", 8), demand("b", 8, backlog=24)])
    assert len(owners(sched)["b"]) == 1


@pytest.mark.parametrize(
    ("knob", "value"), [("urgency_cap", 0.5), ("urgency_cap", float("inf")), ("floor_share", 1.5), ("floor_share", -0.1)]
)
def test_an_urgency_cap_below_1_or_a_floor_share_outside_0_1_is_refused(knob, value):
    with pytest.raises(SchedulingError, match=knob):
        Scheduler(NODE8, "rlix", SchedulerConfig(**{knob: value}))


def test_a_job_that_never_asks_for_its_model_load_takes_no_place_in_a_full_queue():
    """Before: a job that rolled out (or trained) without asking for its model load skipped its queue: the
    queue was checked only for a model load, and the expand that followed counted as its admission."""
    one = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=1),))
    sched = queued(one, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 2)])
    plan = sched.step(2, [demand("b", 100)])
    assert [e.worker.pipeline_id for e in plan.expands] == [] and sched.admitted_at("b") is None
    assert sched.step(3, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)]).grants == ()
    assert sched.admission_refusal("b") == "queue 'node' holds 1 of its 1 jobs"
    plan = sched.step(4, [Unregister(pipeline_id="a")])
    assert grants(plan) == [("b", Stage.ACTOR_TRAIN)]  # its first stage is its admission


def test_a_job_that_only_rolls_out_is_admitted_by_its_first_worker_where_its_queue_has_room():
    two = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=2),))
    sched = queued(two, spec("a", range(4), range(8)))
    sched.step(0, [demand("a", 40)])
    assert owners(sched)["a"] == list(range(8)) and sched.admitted_at("a") == 0


def test_a_queue_is_first_come_first_served_when_the_job_that_asked_first_is_a_guest():
    """Before: under rlix a guest's model load was ordered after every owner's request, so a later
    job of the same queue took the last place while the guest waited for its owner."""
    two = SchedulerConfig(queues=(QueueSpec(name="node", gpus=tuple(range(8)), max_jobs=2),))
    sched = queued(
        two,
        spec("a", range(4), range(8), home=range(4)),
        spec("b", range(4), range(8), home=range(4)),
        spec("c", range(4, 8), range(8), home=range(4, 8)),
    )
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(10, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 4)])
    sched.step(20, [RequestStage(pipeline_id="b", stage=Stage.INIT)])  # a guest on a's home: it waits for a
    plan = sched.step(30, [RequestStage(pipeline_id="c", stage=Stage.INIT)])
    assert ("c", Stage.INIT) not in grants(plan)  # room in the queue, but b asked first
    assert sched.admission_refusal("b") is None
