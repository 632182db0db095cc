"""The core's Rejoin event: a restarted scheduler rebuilds its ledger from what the pipelines hold."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
from core_fuzz import GANG_STAGES, POLICY_NAMES, random_knobs, random_report, random_spec
from helpers import demand, register, spec

from rlix.core import (
    ClusterSpec,
    Register,
    Rejoin,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    Scheduler,
    SchedulingError,
    ShrinkReason,
    Stage,
    Unregister,
    check_ledger,
)

NODE8 = ClusterSpec(nodes=1, gpus_per_node=8)


def snapshot(sched: Scheduler) -> list[Rejoin]:
    """What each active pipeline would tell a restarted scheduler, in registration order."""
    out = []
    for pid in sched.pipelines():
        entry = sched._view.pipelines[pid]
        gangs = sorted(
            ((stage, gpus) for (p, stage), gpus in sched.ledger.gangs.items() if p == pid), key=lambda x: x[0].priority
        )
        out.append(
            Rejoin(
                spec=entry.spec,
                gangs=tuple(gangs),
                workers=tuple(w.gpus for w in sched.workers(pid)),
                demand=entry.demand,
                admitted=entry.admitted,
                admitted_at=entry.admitted_at if entry.admitted else None,
            )
        )
    return out


def ledger_state(sched: Scheduler) -> tuple:
    led = sched.ledger
    workers = {pid: dict(ws) for pid, ws in led.workers.items() if ws}
    return (list(led.owner), dict(led.gangs), workers, dict(led.placed_at), led.free_count, sched.pipelines())


def restarted(old: Scheduler, now: float) -> Scheduler:
    new = Scheduler(old.cluster, old.policy.name, old.config)
    for event in snapshot(old):
        new.submit(event, now)
    return new


def a_trains_while_b_rolls_out() -> Scheduler:
    sched = Scheduler(NODE8, "rlix")
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 40), demand("b", 40)])
    sched.step(1, [RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN), demand("b", 40, loads={4: 4, 5: 4, 6: 4, 7: 4})])
    return sched


def test_the_scenario_holds_a_gang_and_rollout_workers():
    sched = a_trains_while_b_rolls_out()
    assert sched.granted("a", Stage.ACTOR_TRAIN) and sched.ledger.gangs[("a", Stage.ACTOR_TRAIN)] == (0, 1, 2, 3)
    assert [w.gpus for w in sched.workers("b")] == [(4,), (5,), (6,), (7,)] and sched.workers("a") == []


def test_rejoining_rebuilds_the_ledger_and_later_plans_match():
    old = a_trains_while_b_rolls_out()
    new = restarted(old, now=5.0)
    check_ledger(new.ledger)
    assert new.ledger.owner == old.ledger.owner
    assert new.ledger.gangs == old.ledger.gangs and new.ledger.free_count == old.ledger.free_count
    assert new.granted("a", Stage.ACTOR_TRAIN)
    assert new.pipelines() == old.pipelines() == ["a", "b"]
    for pid in ("a", "b"):
        assert new.workers(pid) == old.workers(pid)
    assert all(new.ledger.placed_at[w.gpus[0]] == 5.0 for w in new.workers("b"))  # placed, for the new scheduler, now
    loads_b = {w.gpus[0]: 4 for w in old.workers("b")}
    rounds = [
        (100.0, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN), demand("a", 30), demand("b", 30, loads=loads_b)]),
        (150.0, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), demand("a", 20)]),
        (200.0, [Unregister(pipeline_id="a")]),
    ]
    for now, events in rounds:
        plan_old, plan_new = old.step(now, events), new.step(now, events)
        assert plan_new == plan_old
        assert not plan_new.empty
        assert new.ledger.owner == old.ledger.owner
        check_ledger(new.ledger)
    assert new.violations == old.violations == []


def test_a_rejoined_gang_is_released_and_rejoined_workers_are_shrunk_for_a_stage():
    new = restarted(a_trains_while_b_rolls_out(), now=5.0)
    b_workers = new.workers("b")
    plan = new.step(
        6.0, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN), RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)]
    )
    assert not new.granted("a", Stage.ACTOR_TRAIN) and new.granted("b", Stage.ACTOR_TRAIN)
    assert [g.gpus for g in plan.grants] == [(4, 5, 6, 7)]
    gang_shrunk = {s.worker for s in plan.shrinks if s.reason is ShrinkReason.GANG}
    assert {w for w in b_workers if w.gpus[0] >= 4} <= gang_shrunk
    new.step(7.0, [Unregister(pipeline_id="b")])
    assert new.ledger.workers_of("b") == {} and ("b", Stage.ACTOR_TRAIN) not in new.ledger.gangs
    check_ledger(new.ledger)


def test_a_rejoined_pipeline_asks_again_for_the_stage_it_waited_for():
    sched = Scheduler(NODE8, "rlix")
    events = [
        Rejoin(spec=spec("a", range(4), range(8)), gangs=((Stage.ACTOR_TRAIN, (0, 1, 2, 3)),)),
        Rejoin(
            spec=spec("b", range(2, 6), range(8), home=range(4, 8)),
            workers=((6,), (7,)),
            demand=demand("b", 10, loads={6: 4, 7: 4}),
        ),
        RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN),
    ]
    plan = sched.step(0, events)
    assert plan.grants == ()  # a's restored gang still holds GPUs 2 and 3
    assert sched.pending_requests() == [("b", Stage.ACTOR_TRAIN)]
    plan = sched.step(1, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    assert [(g.pipeline_id, g.gpus) for g in plan.grants] == [("b", (2, 3, 4, 5))]


def test_admission_follows_what_the_pipeline_says_under_a_dedicated_partition_policy():
    # Under static, a started job's home stays taken while it holds nothing; one that never
    # started (and holds nothing) leaves it free.
    for admitted, granted in ((True, False), (False, True)):
        sched = Scheduler(NODE8, "static")
        sched.submit(Rejoin(spec=spec("a", range(4), range(4)), admitted=admitted), 0)
        plan = sched.step(0, [Register(spec=spec("b", range(4), range(4))), RequestStage(pipeline_id="b", stage=Stage.INIT)])
        assert bool(plan.grants) is granted


# ------------------------------------------------------------------ refusals


def refused(sched: Scheduler, event: Rejoin, match: str) -> None:
    before = ledger_state(sched)
    requests = sched.pending_requests()
    with pytest.raises(SchedulingError, match=match) as info:
        sched.submit(event, 10.0)
    assert "\n" not in str(info.value) and f"pipeline '{event.spec.pipeline_id}'" in str(info.value)
    assert ledger_state(sched) == before and sched.pending_requests() == requests


def test_a_gpu_another_pipeline_holds_is_refused_and_nothing_changes():
    sched = Scheduler(NODE8, "rlix")
    sched.submit(Rejoin(spec=spec("a", range(4), range(8)), workers=((4,), (5,))), 0)
    b = spec("b", range(4, 8), range(8))
    refused(sched, Rejoin(spec=b, gangs=((Stage.ACTOR_TRAIN, (4, 5, 6, 7)),)), "GPU 4 .* already held by pipeline 'a'")
    refused(sched, Rejoin(spec=b, workers=((6,), (5,))), "GPU 5 .* already held by pipeline 'a'")
    assert "b" not in sched._view.pipelines  # not half-registered: it may rejoin with what it really holds
    sched.submit(Rejoin(spec=b, workers=((6,), (7,))), 11.0)
    assert [w.gpus for w in sched.workers("b")] == [(6,), (7,)]


def test_a_gpu_listed_twice_by_one_pipeline_is_refused():
    sched = Scheduler(NODE8, "rlix")
    a = spec("a", range(4), range(8), reference=range(2, 6))
    refused(sched, Rejoin(spec=a, gangs=((Stage.ACTOR_TRAIN, (0, 1, 2, 3)),), workers=((3,),)), "GPU 3 is claimed by both")
    refused(sched, Rejoin(spec=a, workers=((6,), (6,))), "GPU 6 is claimed by both")
    gangs = ((Stage.ACTOR_TRAIN, (0, 1, 2, 3)), (Stage.REF_LOGPROBS, (2, 3, 4, 5)))
    refused(sched, Rejoin(spec=a, gangs=gangs), "GPU 2 is claimed by both stage actor_train and stage ref_logprobs")


def test_a_worker_off_the_policys_rollout_bundles_is_refused():
    sched = Scheduler(NODE8, "rlix")
    refused(sched, Rejoin(spec=spec("a", range(4), range(4, 8)), workers=((2,),)), r"rollout worker on GPUs \[2\] is not one")
    refused(sched, Rejoin(spec=spec("a", range(4), range(8), tp=2), workers=((1, 2),)), r"GPUs \[1, 2\] is not one")
    static = Scheduler(NODE8, "static")  # rollout only inside the home partition
    refused(static, Rejoin(spec=spec("a", range(4), range(8)), workers=((5,),)), r"GPUs \[5\] is not one")


def test_gang_gpus_matching_no_role_are_refused():
    sched = Scheduler(NODE8, "rlix")
    a = spec("a", range(4), range(4, 8), critic=range(6, 8))
    refused(sched, Rejoin(spec=a, gangs=((Stage.ACTOR_TRAIN, (0, 1)),)), r"stage actor_train on GPUs \[0, 1\] matches none")
    refused(sched, Rejoin(spec=a, gangs=((Stage.INIT, (0, 1, 2, 3, 4)),)), "stage init on GPUs")
    refused(sched, Rejoin(spec=a, gangs=((Stage.ROLLOUT, (4, 5, 6, 7)),)), "stage rollout is not a gang stage")
    twice = ((Stage.ACTOR_TRAIN, (0, 1, 2, 3)), (Stage.ACTOR_TRAIN, (0, 1, 2, 3)))
    refused(sched, Rejoin(spec=a, gangs=twice), "stage actor_train is listed twice")
    # Any role's mapping, or for INIT the union of the non-rollout mappings, is one it could have been granted.
    ok = ((Stage.ACTOR_TRAIN, (6, 7)), (Stage.OLD_LOGPROBS, (0, 1, 2, 3)))
    sched.submit(Rejoin(spec=a, gangs=ok), 0)
    assert sched.granted("a", Stage.ACTOR_TRAIN) and sched.granted("a", Stage.OLD_LOGPROBS)
    sched2 = Scheduler(NODE8, "rlix")
    sched2.submit(Rejoin(spec=a, gangs=((Stage.INIT, (0, 1, 2, 3, 6, 7)),)), 0)
    assert sched2.ledger.gangs == {("a", Stage.INIT): (0, 1, 2, 3, 6, 7)}


def test_a_registered_id_bad_spec_or_bad_demand_is_refused():
    sched = Scheduler(NODE8, "rlix")
    register(sched, spec("a", range(4), range(8)))
    refused(sched, Rejoin(spec=spec("a", range(4), range(8))), "already registered")
    sched.submit(Unregister(pipeline_id="a"), 1)
    refused(sched, Rejoin(spec=spec("a", range(4), range(8))), "already registered")  # still leaving
    sched.plan(1)
    sched.submit(Register(spec=spec("a", range(4), range(8))), 2)  # once it left, its id may run again
    assert sched.pipelines() == ["a"]
    refused(sched, Rejoin(spec=spec("c", range(4), range(9))), "actor_infer: GPU ids must lie in 0..7")
    refused(sched, Rejoin(spec=spec("c", range(4), range(8)), demand=demand("z", 3)), "demand report is for pipeline 'z'")
    bad = ReportDemand(pipeline_id="c", pending=-1)
    refused(sched, Rejoin(spec=spec("c", range(4), range(8)), workers=((4,),), demand=bad), "demand counts must be >= 0")
    for finished in (-1, float("nan")):
        bad = ReportDemand(pipeline_id="c", pending=1, finished=finished)
        refused(sched, Rejoin(spec=spec("c", range(4), range(8)), demand=bad), "finished must be a whole number >= 0")


# ------------------------------------------------------------------ random snapshots


def busy_setup(rng: random.Random) -> Scheduler:
    """A random scheduler whose pipelines all stay: they ask for and release stages and report demand."""
    cluster = ClusterSpec(nodes=rng.randint(1, 3), gpus_per_node=rng.choice([1, 2, 4, 8]))
    # A restarted scheduler has measured no gang stage and no rollout yet, so until it has, a guest's
    # stage waits (guest_stage_fit) where the old one might have let it go: compared with guests waiting.
    sched = Scheduler(cluster, rng.choice(POLICY_NAMES), dataclasses.replace(random_knobs(rng), guest_stage_fit=0.0))
    specs = [random_spec(rng, cluster, f"p{i}") for i in range(rng.randint(2, 5))]
    specs = [s for s in specs if sched.policy.rollout_bundles(s)]
    sched.step(0.0, [Register(spec=s) for s in specs])
    now, asked = 0.0, set()
    for _ in range(rng.randint(5, 25)):
        now += rng.choice([0.5, 5.0, rng.uniform(0.0, 300.0)])
        for s in rng.sample(specs, len(specs)):
            pid, stage = s.pipeline_id, rng.choice(GANG_STAGES)
            if (
                rng.random() < 0.3
                and (pid, stage) not in asked
                and (stage is not Stage.REF_LOGPROBS or s.has_role(Role.REFERENCE))
            ):
                sched.submit(RequestStage(pipeline_id=pid, stage=stage), now)
                asked.add((pid, stage))
            elif rng.random() < 0.3 and (pid, stage) in asked:
                sched.submit(ReleaseStage(pipeline_id=pid, stage=stage), now)
                asked.discard((pid, stage))
            if rng.random() < 0.6:
                sched.submit(random_report(rng, sched, s), now)
        sched.plan(now)
    return sched


@pytest.mark.parametrize("seed", range(40))
def test_rejoining_a_random_snapshot_reproduces_the_ledger_and_the_plans(seed: int):
    rng = random.Random(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan the core had to replace warns
        old = busy_setup(rng)
        t = old._view.now
        new = restarted(old, now=t)
        check_ledger(new.ledger)
        assert new.ledger.owner == old.ledger.owner and new.ledger.gangs == old.ledger.gangs
        # Past every report's time to live and every worker's residency, both judge alike: the
        # pipelines ask again for what they waited for, then report afresh.
        later = t + 1000.0
        for req in old._requests.values():  # nor has it seen which waiting stages were passed over: they ask again
            req.passed = 0
        again = [RequestStage(pipeline_id=p, stage=s) for p, s in old.pending_requests()]
        assert new.step(later, again) == old.step(later)
        for step in range(1, 5):
            events = [random_report(rng, old, s) for s in (e.spec for e in old._view.active())]
            held = sorted(old.ledger.gangs, key=lambda k: (k[0], k[1].priority))
            if held:  # a stage held since before the restart, or granted after it, ends
                pid, stage = rng.choice(held)
                events.append(ReleaseStage(pipeline_id=pid, stage=stage))
            assert new.step(later + step, events) == old.step(later + step, events)
            assert new.ledger.owner == old.ledger.owner
    assert new.violations == old.violations == []
