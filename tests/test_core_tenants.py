"""Tenants with shares (the Kueue model) in the policy core: weights, guarantees, borrowing limits, admission."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import demand, owners, register, spec

from rlix.core import ClusterSpec, ReleaseStage, RequestStage, Scheduler, SchedulerConfig, SchedulingError, Stage, TenantSpec

NODE12 = ClusterSpec(nodes=1, gpus_per_node=12)
PLAIN = dict(small_first=0.0, path_halving_s=0.0)  # the split by current demand alone


def job(pid: str, tenant: str, train=(0,), infer=range(12)):
    return replace(spec(pid, train, infer, home=train), tenant=tenant)


def held(sched: Scheduler, *pids: str) -> int:
    """Rollout GPUs the pipelines hold now."""
    got = owners(sched)
    return sum(len(got.get(p, [])) for p in pids)


def tenants(*specs: TenantSpec) -> SchedulerConfig:
    return SchedulerConfig(tenants=specs, min_residency_s=0.0, **PLAIN)


def test_weights_split_the_cluster_between_tenants_then_their_jobs():
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="a", weight=2.0), TenantSpec(name="b", weight=1.0)))
    register(sched, job("a1", "a"), job("a2", "a"), job("b1", "b"))
    sched.step(0, [demand("a1", 400), demand("a2", 400), demand("b1", 400)])
    assert held(sched, "a1", "a2") == 8 and held(sched, "b1") == 4  # 2:1 although a has two jobs and b one
    assert held(sched, "a1") == held(sched, "a2") == 4
    # without tenants the three jobs split it three ways
    flat = Scheduler(NODE12, "rlix", SchedulerConfig(min_residency_s=0.0, **PLAIN))
    register(flat, job("a1", ""), job("a2", ""), job("b1", ""))
    flat.step(0, [demand("a1", 400), demand("a2", 400), demand("b1", 400)])
    assert [held(flat, p) for p in ("a1", "a2", "b1")] == [4, 4, 4]


def test_a_guarantee_holds_against_any_weight_and_a_limit_caps_even_an_idle_cluster():
    sched = Scheduler(
        NODE12,
        "rlix",
        tenants(TenantSpec(name="small", weight=0.01, guarantee_gpus=5), TenantSpec(name="big", weight=100.0)),
    )
    register(sched, job("s", "small"), job("g", "big"))
    sched.step(0, [demand("s", 400), demand("g", 400)])
    assert held(sched, "s") == 5 and held(sched, "g") == 7
    capped = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="t", guarantee_gpus=2, borrow_limit_gpus=1)))
    register(capped, job("x", "t"))
    capped.step(0, [demand("x", 400)])
    assert held(capped, "x") == 3  # guarantee 2 + borrowing 1, though 9 GPUs stay idle


def test_gang_stages_count_towards_their_tenant():
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="a"), TenantSpec(name="b")))
    register(sched, job("a1", "a", train=range(4)), job("b1", "b", train=(11,)))
    sched.step(0, [RequestStage(pipeline_id="a1", stage=Stage.ACTOR_TRAIN), demand("a1", 0), demand("b1", 400)])
    sched.step(1, [demand("b1", 400)])
    assert held(sched, "b1") == 8  # everything but a's training gang: a wants no rollout now
    sched.step(2, [ReleaseStage(pipeline_id="a1", stage=Stage.ACTOR_TRAIN), demand("a1", 400), demand("b1", 400)])
    sched.step(3, [demand("a1", 400), demand("b1", 400)])
    assert held(sched, "a1") == held(sched, "b1") == 6
    sched.step(4, [RequestStage(pipeline_id="a1", stage=Stage.ACTOR_TRAIN)])
    sched.step(5, [demand("a1", 400), demand("b1", 400)])
    assert held(sched, "a1") == 2 and held(sched, "b1") == 6  # a's 6: 4 training, 2 rollout


def test_a_limit_holds_when_a_gang_stage_comes_beside_the_rollout_workers_a_tenant_already_holds():
    """Before: x's three rollout workers stayed beside its new 2-GPU stage, 5 GPUs against a limit of 3,
    and y's model load was admitted on top of them alike."""
    config = tenants(TenantSpec(name="t", guarantee_gpus=2, borrow_limit_gpus=1))
    sched = Scheduler(NODE12, "rlix", config)
    register(sched, replace(spec("x", (0,), range(10), home=(0,), reference=(10, 11)), tenant="t"))
    sched.step(0, [demand("x", 400)])
    assert held(sched, "x") == 3
    for t in (1, 2, 100):
        plan = sched.step(t, [RequestStage(pipeline_id="x", stage=Stage.REF_LOGPROBS)] if t == 1 else [demand("x", 400)])
        if t == 1:
            assert [g.stage for g in plan.grants] == [Stage.REF_LOGPROBS] and len(plan.shrinks) == 2
        assert held(sched, "x") + 2 == 3  # its stage's 2 GPUs and one rollout worker: its limit
    sched = Scheduler(NODE12, "rlix", config)
    register(sched, job("x", "t", infer=range(10)), job("y", "t", train=(10, 11), infer=(10, 11)))
    sched.step(0, [demand("x", 400)])
    plan = sched.step(1, [RequestStage(pipeline_id="y", stage=Stage.INIT), demand("x", 400)])
    assert [g.pipeline_id for g in plan.grants] == ["y"] and held(sched, "x") == 1


def test_a_tenant_over_its_limit_gives_back_workers_of_the_job_above_its_share_and_plans_stay_valid():
    """A trim by workers held alone took a worker from a job the shares then gave it back to: the plan
    shrank and expanded one worker, and every plan after fell back to the safe plan."""
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="t", borrow_limit_gpus=4)))
    register(sched, job("a", "t", train=(10,), infer=range(10)), job("b", "t", train=(11,), infer=range(10)))
    sched.step(0, [demand("a", 400), demand("b", 400)])
    assert held(sched, "a") == held(sched, "b") == 2
    for t in range(1, 4):
        asks = [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)] if t == 1 else []
        sched.step(t, [*asks, demand("a", 400), demand("b", 0)])
        assert sched.violations == [] and held(sched, "a") + held(sched, "b") + 1 <= 4
    assert held(sched, "a") == 3 and held(sched, "b") == 0  # b trains on its GPU; a rolls out on the rest of the limit


def test_a_job_its_tenants_limit_holds_back_keeps_no_gpus_from_another_tenants_job():
    """Before: b, refused for t1's limit, kept its GPUs 4-7 from c of tenant t2, which waited on free GPUs."""
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="t1", borrow_limit_gpus=4), TenantSpec(name="t2")))
    register(sched, job("a", "t1", train=range(4)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    register(sched, job("b", "t1", train=range(4, 8)), job("c", "t2", train=range(4, 8)), now=2)
    plan = sched.step(2, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("b", "c")])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("c", Stage.INIT)]
    register(sched, job("d", "t1", train=range(8, 12)), now=3)
    plan = sched.step(3, [RequestStage(pipeline_id="d", stage=Stage.INIT)])
    assert plan.grants == ()  # t1 is still at its limit: its own next job waits


def test_a_tenant_at_its_limit_admits_its_next_job_once_a_model_load_fits():
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="t", guarantee_gpus=4, borrow_limit_gpus=0)))
    register(sched, job("first", "t", train=range(4)), job("second", "t", train=range(4, 8)))
    plan = sched.step(0, [RequestStage(pipeline_id="first", stage=Stage.INIT)])
    assert [g.pipeline_id for g in plan.grants] == ["first"]
    plan = sched.step(1, [RequestStage(pipeline_id="second", stage=Stage.INIT)])
    assert plan.grants == ()  # its GPUs are free, but the tenant would hold 8 > 4
    plan = sched.step(2, [ReleaseStage(pipeline_id="first", stage=Stage.INIT)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("second", Stage.INIT)]


@pytest.mark.parametrize(
    ("config", "job_spec", "message"),
    [
        (tenants(TenantSpec(name="a")), job("x", "nobody"), "tenant 'nobody' is not declared (declared: a)"),
        (
            tenants(TenantSpec(name="a", guarantee_gpus=1, borrow_limit_gpus=1)),
            job("x", "a", train=range(4)),
            "its model load needs 4 GPUs, more than tenant 'a' may hold (2)",
        ),
    ],
)
def test_a_job_of_an_undeclared_tenant_or_over_its_limit_is_refused(config, job_spec, message):
    sched = Scheduler(NODE12, "rlix", config)
    with pytest.raises(SchedulingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        register(sched, job_spec)


def test_tenants_the_cluster_cannot_honour_are_refused():
    with pytest.raises(SchedulingError, match="guarantees add up to 14 GPUs but the cluster has 12"):
        Scheduler(NODE12, "rlix", tenants(TenantSpec(name="a", guarantee_gpus=8), TenantSpec(name="b", guarantee_gpus=6)))
    with pytest.raises(SchedulingError, match="every tenant needs a name of its own"):
        Scheduler(NODE12, "rlix", tenants(TenantSpec(name="a"), TenantSpec(name="a")))


def test_home_guarantees_hold_within_each_tenants_part():
    # Four jobs, each with a home of 3 GPUs: the homes cover the cluster. With home_guarantee on,
    # b's homes (6 GPUs) do not fit its part (4 of 12 at weights 2:1): each of its jobs is guaranteed
    # 2 workers, not 3, and a's jobs take their part back from b at once when they want it.
    config = replace(tenants(TenantSpec(name="a", weight=2.0), TenantSpec(name="b", weight=1.0)), home_guarantee=True)
    sched = Scheduler(NODE12, "rlix", config)
    homes = {"a1": range(0, 3), "a2": range(3, 6), "b1": range(6, 9), "b2": range(9, 12)}
    register(sched, *[job(p, p[0], train=tuple(g)) for p, g in homes.items()])
    sched.step(0, [demand("b1", 400), demand("b2", 400)])
    assert held(sched, "b1", "b2") == 12  # nobody else wants any: b borrows a's homes
    for t in range(1, 4):
        sched.step(t, [demand(p, 400, loads={w.gpus[0]: 4 for w in sched.workers(p)}) for p in homes])
    assert held(sched, "a1") == held(sched, "a2") == 4 and held(sched, "b1") == held(sched, "b2") == 2


def test_a_tenants_limit_is_checked_at_admission_and_its_admitted_jobs_stages_do_not_wait_for_it():
    """As Kueue's quota: each model load fits beside the gang stages the tenant holds then; once admitted,
    its jobs' stages run (three jobs admitted one after another train at once on 6 GPUs, over a limit of 2:
    made to wait for it, a stage of theirs could wait for ever behind the others' turns)."""
    sched = Scheduler(NODE12, "rlix", tenants(TenantSpec(name="a", guarantee_gpus=2, borrow_limit_gpus=0)))
    register(sched, *(job(p, "a", train=train) for p, train in (("a1", (0, 1)), ("a2", (2, 3)), ("a3", (4, 5)))))
    plan = sched.step(0, [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("a1", "a2", "a3")])
    assert [g.pipeline_id for g in plan.grants] == ["a1"]  # a2's load would hold 4 > 2
    for t, (done, next_load) in enumerate((("a1", "a2"), ("a2", "a3")), start=1):
        plan = sched.step(t, [ReleaseStage(pipeline_id=done, stage=Stage.INIT)])
        assert [g.pipeline_id for g in plan.grants] == [next_load]  # one load at a time, each fitting then
    sched.step(3, [ReleaseStage(pipeline_id="a3", stage=Stage.INIT)])
    plan = sched.step(4, [RequestStage(pipeline_id=p, stage=Stage.ACTOR_TRAIN) for p in ("a1", "a2", "a3")])
    assert [g.pipeline_id for g in plan.grants] == ["a1", "a2", "a3"]


def test_a_worker_the_split_hands_between_two_jobs_of_a_tenant_at_its_limit_moves_once_resident():
    """Found in review: with room for one worker under its limit, two jobs' floors took turns at every plan
    and the worker moved every 5 s, whatever min_residency_s said. It moves once it has resided (30 s)."""
    config = SchedulerConfig(tenants=(TenantSpec(name="a", guarantee_gpus=2, borrow_limit_gpus=0), TenantSpec(name="b")))
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=8), "rlix", config)
    register(sched, *(replace(spec(p, (0,), range(8), tp=2, slots=4), tenant="a") for p in ("a1", "a2")))
    moves = []
    for t in range(0, 200, 5):
        events = [
            demand(p, 400, dict.fromkeys((w.gpus[0] for w in sched.workers(p)), 4), trajectory_s=1000) for p in ("a1", "a2")
        ]
        plan = sched.step(float(t), events)
        assert sum(len(w.gpus) for p in ("a1", "a2") for w in sched.workers(p)) <= 2  # the limit holds throughout
        moves += [(t, e.worker.pipeline_id) for e in plan.expands]
    assert moves == [(0, "a1"), (30, "a2"), (60, "a1"), (90, "a2"), (120, "a1"), (150, "a2"), (180, "a1")]
