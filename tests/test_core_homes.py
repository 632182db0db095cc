"""Core decisions: home partitions as guarantees (``home_guarantee``, on by default)."""

from __future__ import annotations

import pytest
from helpers import demand, owners, register, spec

from rlix.core import (
    ClusterSpec,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    ShrinkReason,
    Stage,
    Unregister,
)
from rlix.core.state import GangTimes, PipelineEntry

TWO_NODES = ClusterSpec(nodes=2, gpus_per_node=4)
ON = SchedulerConfig(home_guarantee=True)


def test_a_home_comes_back_first():
    # a borrows b's idle home; when b (started: its model load granted) wants it, b gets all
    # four home workers back at once, although a's workers are younger than min_residency_s
    # and a has more demand.
    sched = Scheduler(TWO_NODES, "rlix", ON)
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 800), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="b", stage=Stage.INIT)])
    assert owners(sched)["a"] == list(range(8))
    plan = sched.step(5, [demand("a", 800), demand("b", 16)])
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == [4, 5, 6, 7]
    assert {s.reason for s in plan.shrinks} == {ShrinkReason.REBALANCE}
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}


def test_without_the_guarantee_the_split_alone_decides():
    sched = Scheduler(TWO_NODES, "rlix", SchedulerConfig(home_guarantee=False))
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 800), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="b", stage=Stage.INIT)])
    plan = sched.step(5, [demand("a", 800), demand("b", 16)])
    assert len(owners(sched)["b"]) < 4 and not plan.shrinks  # a's workers are too young to move


def test_a_guest_waits_for_the_owners_home():
    # a and b name one home; a was admitted first, so it owns it: b (a queued job under static)
    # gets a worker once a no longer needs both. (Named no home, they would be co-tenants:
    # tests/test_core_cotenancy.py.)
    node = ClusterSpec(nodes=1, gpus_per_node=2)
    sched = Scheduler(node, "rlix", SchedulerConfig(min_residency_s=0.0, home_guarantee=True))
    register(sched, spec("b", range(2), range(2), slots=1, home=range(2)), spec("a", range(2), range(2), slots=1, home=range(2)))
    sched.step(0, [demand("a", 4)])
    assert owners(sched)["a"] == [0, 1]
    sched.step(5, [demand("a", 2, {0: 1, 1: 1}), demand("b", 50)])
    assert owners(sched) == {"a": [0, 1], "b": []}
    sched.step(10, [demand("a", 0, {0: 1}), demand("b", 50)])
    assert owners(sched) == {"a": [0], "b": [1]}


@pytest.mark.parametrize("guarantee", [False, True])
def test_a_guests_gang_stage_goes_after_the_owners(guarantee):
    # b's home lies in a's (a was admitted first): b asked first, a's training still goes first,
    # with or without the guarantee (under static b would not run at all while a does).
    sched = Scheduler(TWO_NODES, "rlix", SchedulerConfig(home_guarantee=guarantee))
    register(sched, spec("a", range(4), range(8), home=range(4)), spec("b", range(4), range(8), home=range(4)))
    sched.step(0, [demand("a", 8)])
    plan = sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("a", Stage.ACTOR_TRAIN)]
    assert sched.pending_requests() == [("b", Stage.ACTOR_TRAIN)]


def test_gang_stages_of_jobs_with_their_own_homes_go_in_request_order():
    # a and b own separate homes but train on the same GPUs: b asked first and goes first.
    sched = Scheduler(TWO_NODES, "rlix")
    register(sched, spec("a", range(4), range(8), home=range(4)), spec("b", range(4), range(8), home=range(4, 8)))
    sched.step(0, [demand("a", 8)])
    plan = sched.step(
        1, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)]
    )
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.ACTOR_TRAIN)]


@pytest.mark.parametrize("guarantee", [False, True])
def test_a_job_with_demand_and_no_worker_gets_one_whatever_its_work_per_worker(guarantee):
    # b's 40 one-second trajectories are not worth a 30 s switch, but b gets the one worker a
    # job with demand is never refused (its work is only an estimate from the mean), with or
    # without the guarantee, and no second one (tests/test_core_decisions.py).
    sched = Scheduler(TWO_NODES, "rlix", SchedulerConfig(min_residency_s=0.0, home_guarantee=guarantee))
    register(sched, spec("a", range(4), range(8)), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 100)])
    loads = {g: 4 for g in owners(sched)["a"]}
    short = ReportDemand(pipeline_id="b", pending=40, trajectory_s=1.0, switch_s=30.0, batch_size=40)
    plan = sched.step(5, [demand("a", 68, loads), short])
    assert len(plan.shrinks) == 1 and len(owners(sched)["b"]) == 1
    assert not sched.step(7, [demand("a", 68, loads), short]).shrinks


# --------------------------------------------------------------- guests' gang stages (guest_stage_fit)

ONE_NODE = ClusterSpec(nodes=1, gpus_per_node=4)


def _owner_after_one_step(config: SchedulerConfig = SchedulerConfig()) -> Scheduler:
    """a owns GPUs 0-3 (it trains on 0-1): its model load took 10 s, its first rollout 100 s, its
    training 10 s, released at t=120; b, a job queued for the same home, registers too."""
    sched = Scheduler(ONE_NODE, "rlix", config)
    register(sched, spec("a", (0, 1), range(4), home=range(4)), spec("b", (0, 1), range(4), home=range(4)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(10, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 40)])
    sched.step(110, [demand("a", 0), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    sched.step(120, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    return sched


def test_a_guests_gang_stage_waits_while_the_owners_rollout_is_unmeasured():
    # a's first rollout is under way and has never been measured: b's model load on a's GPUs waits.
    sched = Scheduler(ONE_NODE, "rlix")
    register(sched, spec("a", (0, 1), range(4), home=range(4)), spec("b", (0, 1), range(4), home=range(4)))
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(10, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 4, {2: 1})])
    plan = sched.step(20, [RequestStage(pipeline_id="b", stage=Stage.INIT)])
    assert not plan.grants and sched.pending_requests() == [("b", Stage.INIT)]


def test_a_guests_gang_stage_goes_when_it_ends_well_before_the_owner_asks_and_costs_it_no_worker():
    # a's rollout left (5 trajectories, 4 slots a worker: 2 workers) fits on GPUs 2-3, which b's
    # model load does not touch, and the load (10 s, as a's took) ends at 135 s, before 120 s
    # + 0.75 x a's shortest rollout (100 s): it goes.
    sched = _owner_after_one_step()
    plan = sched.step(125, [demand("a", 4, {2: 1}), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.INIT)]


@pytest.mark.parametrize(
    ("now", "pending", "fit"),
    [
        (190, 4, 0.75),  # it would end at 200 s, after 120 + 75 s
        (125, 12, 0.75),  # a's rollout left needs 4 workers: it would lose the two on b's GPUs
        (125, 4, 0.0),  # guests' stages wait for the owner to leave, as under static
    ],
)
def test_a_guests_gang_stage_that_would_cost_the_owner_waits(now, pending, fit):
    sched = _owner_after_one_step(SchedulerConfig(guest_stage_fit=fit))
    plan = sched.step(now, [demand("a", pending, {2: 1}), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    assert not plan.grants and sched.pending_requests() == [("b", Stage.INIT)]


def test_a_guests_gang_stage_goes_once_the_owner_has_left():
    sched = _owner_after_one_step(SchedulerConfig(guest_stage_fit=0.0))
    sched.step(125, [demand("a", 4, {2: 1}), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    plan = sched.step(130, [Unregister(pipeline_id="a")])
    assert [(g.pipeline_id, g.stage) for g in plan.grants] == [("b", Stage.INIT)]


def test_two_guests_do_not_take_the_room_the_owner_needs_between_them():
    # a needs 2 workers; b's and c's model loads each leave it 2 of its 4 home GPUs, but not both.
    sched = Scheduler(ONE_NODE, "rlix")
    a, b, c = (spec(p, train, range(4), home=range(4)) for p, train in (("a", (0, 1)), ("b", (0, 1)), ("c", (2, 3))))
    register(sched, a, b, c)
    sched.step(0, [RequestStage(pipeline_id="a", stage=Stage.INIT)])
    sched.step(10, [ReleaseStage(pipeline_id="a", stage=Stage.INIT), demand("a", 40)])
    sched.step(110, [demand("a", 0), RequestStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    sched.step(120, [ReleaseStage(pipeline_id="a", stage=Stage.ACTOR_TRAIN)])
    asks = [RequestStage(pipeline_id=p, stage=Stage.INIT) for p in ("b", "c")]
    plan = sched.step(125, [demand("a", 4, {2: 1}), *asks])
    assert len(plan.grants) == 1  # b's or c's, whichever goes first; the other waits
    later = sched.step(126, [demand("a", 4, {2: 1})])
    assert not later.grants


def test_a_guests_gang_stage_waits_for_room_a_borrower_holds():
    # GPUs 2-3 are the owner's room, but a worker of b (a borrower) holds GPU 3: no room for two.
    sched = _owner_after_one_step(SchedulerConfig(min_residency_s=1000.0))
    sched.step(121, [demand("b", 40)])
    assert 3 in owners(sched)["b"]
    plan = sched.step(125, [demand("a", 4, {2: 1}), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    assert not plan.grants


@pytest.mark.parametrize("fit", [1.5, -0.1, float("nan")])
def test_guest_stage_fit_outside_0_to_1_is_refused(fit):
    with pytest.raises(SchedulingError, match="guest_stage_fit"):
        Scheduler(ONE_NODE, "rlix", SchedulerConfig(guest_stage_fit=fit))


def _lending_run(config: SchedulerConfig, a_priority: int = 0) -> Scheduler:
    # a borrows b's idle home from t=0; b's model load takes 1 s. When b reports X seconds
    # of rollout done at full slots on its 4 home workers of 4 slots (16 x X trajectory-
    # seconds finished), static needs >= 1 + X s for them: b is 1 + X - t seconds ahead at t.
    sched = Scheduler(TWO_NODES, "rlix", config)
    register(sched, spec("a", range(4), range(8), priority=a_priority), spec("b", range(4, 8), range(8)))
    sched.step(0, [demand("a", 800), RequestStage(pipeline_id="b", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id="b", stage=Stage.INIT)])
    assert owners(sched)["a"] == list(range(8))
    return sched


def _b_did(rollout_s: float):
    return demand("b", 16, trajectory_s=10.0, finished=int(rollout_s * 16 / 10))


STAY = dict(home_guarantee=True, min_residency_s=1000.0)  # a's workers move only to give a home back


def test_a_job_far_ahead_of_its_static_pace_lends_its_home_until_its_lead_falls_back():
    sched = _lending_run(SchedulerConfig(**STAY, lend_ahead_s=60.0))
    plan = sched.step(5, [demand("a", 800), _b_did(140)])  # 136 s ahead, over 2 x 60: it lends
    assert not plan.shrinks and owners(sched)["b"] == []
    plan = sched.step(80, [demand("a", 800), _b_did(140)])  # 61 s: it still lends
    assert not plan.shrinks and owners(sched)["b"] == []
    plan = sched.step(90, [demand("a", 800), _b_did(140)])  # 51 s: its home comes back at once
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == [4, 5, 6, 7]
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}


@pytest.mark.parametrize("lend", [0.0, 60.0])
def test_a_job_not_far_enough_ahead_or_with_lending_off_takes_its_home_back_at_once(lend):
    # 100 s ahead: lending off; or on, but it starts to lend only above 2 x 60 s
    sched = _lending_run(SchedulerConfig(**STAY, lend_ahead_s=lend))
    plan = sched.step(5, [demand("a", 800), _b_did(104)])
    assert sorted(s.worker.gpus[0] for s in plan.shrinks) == [4, 5, 6, 7]


def test_the_time_a_gang_stage_holds_counts_towards_the_lead():
    # b trains 40 s: static rolls nothing out meanwhile, so b's 40 s of rollout take static
    # >= 1 + 40 + 40 s (without the training counted, b would be behind). a, of a higher
    # priority, has twice b's share of the 8 GPUs without the guarantee.
    config = SchedulerConfig(home_guarantee=True, lend_ahead_s=10.0, min_residency_s=0.0, small_first=0.0, path_halving_s=0.0)
    sched = _lending_run(config, a_priority=1)
    sched.step(2, [RequestStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)])
    sched.step(42, [ReleaseStage(pipeline_id="b", stage=Stage.ACTOR_TRAIN)])
    sched.step(60, [demand("a", 800), _b_did(40)])  # 81 - 60 = 21 s ahead: lent, b has its share only
    assert 0 < len(owners(sched)["b"]) < 4
    sched.step(75, [demand("a", 800), _b_did(40)])  # 6 s ahead: back
    assert owners(sched)["b"] == [4, 5, 6, 7]


def test_gang_stages_held_at_once_count_once():
    times = GangTimes()
    times.granted(Stage.INIT, 0.0)
    times.released(Stage.INIT, 1.0, holds_another=False)
    assert times.working(1.0) == 0.0  # the model load is counted apart
    times.granted(Stage.ACTOR_TRAIN, 2.0)
    times.granted(Stage.CRITIC_TRAIN, 2.0)
    times.released(Stage.ACTOR_TRAIN, 30.0, holds_another=True)
    assert times.working(35.0) == 33.0
    times.released(Stage.CRITIC_TRAIN, 42.0, holds_another=False)
    assert times.working(50.0) == 40.0


def test_a_job_that_rejoined_has_no_lead():
    entry = PipelineEntry.joining(spec("b", range(4, 8), range(8)), order=1, rollout_bundles=((4,), (5,), (6,), (7,)))
    entry.record_demand(_b_did(1000), 5.0)
    assert entry.lead_s(5.0) == float("-inf")  # registered_at unknown (a Rejoin builds it so)
    entry.registered_at = 0.0
    assert entry.lead_s(5.0) == 1000 - 5


def test_a_job_taking_workers_over_takes_its_own_home_first():
    # without the guarantee, b's share alone brings it workers: it takes them back from a
    # on its own home, not on a's (a takeover of one cost either way).
    config = SchedulerConfig(home_guarantee=False, min_residency_s=0.0, small_first=0.0, path_halving_s=0.0)
    sched = _lending_run(config)
    sched.step(5, [demand("a", 800), demand("b", 16)])
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}


def test_lend_ahead_s_below_0_is_refused():
    with pytest.raises(SchedulingError, match="lend_ahead_s"):
        Scheduler(TWO_NODES, "rlix", SchedulerConfig(lend_ahead_s=-1.0))


# --------------------------------------------------------------- an owner between its rollout and its stage


def _between_stages(config: SchedulerConfig = ON) -> tuple[Scheduler, object]:
    """s trains on GPU 0 of its home 0-1, l on GPU 2 of its home 2-3; both roll out anywhere. At t=10
    s has finished its rollout (nothing queued or running) and has not asked for its stage yet."""
    sched = Scheduler(ONE_NODE, "rlix", config)
    register(sched, spec("s", (0,), range(4), home=(0, 1)), spec("l", (2,), range(4), home=(2, 3)))
    sched.step(0, [RequestStage(pipeline_id="s", stage=Stage.INIT), RequestStage(pipeline_id="l", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id=p, stage=Stage.INIT) for p in ("s", "l")] + [demand("s", 8), demand("l", 800)])
    assert owners(sched) == {"s": [0, 1], "l": [2, 3]}
    return sched, sched.step(10, [demand("s", 0), demand("l", 800)])


def test_an_owner_about_to_ask_for_its_stage_keeps_that_stages_gpus_from_borrowers():
    # l may borrow GPU 1 (s's rollout-only GPU) for s's training, but not GPU 0, where s's stage is about
    # to start: l's worker there would be shrunk for it at once, and s's stage would wait for that.
    sched, plan = _between_stages()
    assert owners(sched) == {"s": [0], "l": [1, 2, 3]}
    plan = sched.step(10.3, [RequestStage(pipeline_id="s", stage=Stage.OLD_LOGPROBS)])
    assert [(g.pipeline_id, g.stage, g.gpus) for g in plan.grants] == [("s", Stage.OLD_LOGPROBS, (0,))]
    assert [s.worker.pipeline_id for s in plan.shrinks] == ["s"]  # its own idle worker only, as under static


def test_an_owner_quiet_for_longer_than_min_residency_s_lends_its_stages_gpus_too():
    sched, _ = _between_stages()
    sched.step(10 + ON.min_residency_s + 1, [demand("l", 800)])
    assert owners(sched) == {"s": [], "l": [0, 1, 2, 3]}


def test_without_the_guarantee_an_owner_between_stages_keeps_nothing():
    sched, _ = _between_stages(SchedulerConfig(home_guarantee=False))
    assert owners(sched) == {"s": [], "l": [0, 1, 2, 3]}


@pytest.mark.parametrize("tp", [1, 2])
def test_a_free_gpu_held_for_its_owners_stage_gets_no_borrower_alone_or_in_a_wide_bundle(tp):
    # s trains on GPU 0 and rolls out on GPU 1 only; it has loaded and reported nothing to roll out
    # yet, so GPU 0 is free and its stage comes next: l's workers (1 or 2 GPUs wide) stay off it.
    sched = Scheduler(ONE_NODE, "rlix", ON)
    register(sched, spec("s", (0,), (1,), home=(0, 1)), spec("l", (2,), range(4), tp=tp, home=(2, 3)))
    sched.step(0, [RequestStage(pipeline_id="s", stage=Stage.INIT), RequestStage(pipeline_id="l", stage=Stage.INIT)])
    sched.step(1, [ReleaseStage(pipeline_id=p, stage=Stage.INIT) for p in ("s", "l")] + [demand("s", 0), demand("l", 800)])
    assert all(0 not in w.gpus for w in sched.workers("l"))
    assert sorted(g for w in sched.workers("l") for g in w.gpus) == ([1, 2, 3] if tp == 1 else [2, 3])
