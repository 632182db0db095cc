"""The core's WorkerLost event: a rollout worker that is gone gives its GPUs back without a shrink."""

from __future__ import annotations

import pytest
from helpers import demand, owners, register, spec

from rlix.core import ClusterSpec, Scheduler, SchedulerConfig, SchedulingError, WorkerLost, check_ledger


def test_a_lost_worker_frees_its_gpus_and_its_bundle_cools_down_before_the_job_gets_it_again():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=30))
    register(sched, spec("a", range(1), range(4)))
    register(sched, spec("b", range(3, 4), range(4)))
    sched.step(0, [demand("a", 40)])
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": []}
    plan = sched.step(1, [WorkerLost(pipeline_id="a", first_gpu=2), demand("a", 40, loads={0: 4, 1: 4, 3: 4})])
    assert plan.shrinks == () and plan.expands == ()  # already gone, and not placed there again at once
    assert sched.step(30.9).expands == ()
    assert [e.worker.gpus for e in sched.step(31).expands] == [(2,)]  # the cooldown is over
    check_ledger(sched.ledger)
    # another job may use the GPU meanwhile: the cooldown is the losing job's only
    plan = sched.step(32, [WorkerLost(pipeline_id="a", first_gpu=2), demand("b", 40)])
    placed = {e.worker.gpus: e.worker.pipeline_id for e in plan.expands}
    assert placed[(2,)] == "b"
    check_ledger(sched.ledger)


def test_a_worker_reported_drained_not_failed_gets_no_cooldown():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=30))
    register(sched, spec("a", range(1), range(4)))
    sched.step(0, [demand("a", 40)])
    lost = WorkerLost(pipeline_id="a", first_gpu=2, failed=False)  # drained while the scheduler restarted
    plan = sched.step(1, [lost, demand("a", 40, loads={0: 4, 1: 4, 3: 4})])
    assert [e.worker.gpus for e in plan.expands] == [(2,)]


def test_without_a_cooldown_the_next_plan_places_a_worker_where_one_was_lost():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=0))
    register(sched, spec("a", range(1), range(4)))
    sched.step(0, [demand("a", 40)])
    plan = sched.step(1, [WorkerLost(pipeline_id="a", first_gpu=2), demand("a", 40, loads={0: 4, 1: 4, 3: 4})])
    assert [e.worker.gpus for e in plan.expands] == [(2,)]
    with pytest.raises(SchedulingError, match="lost_cooldown_s"):
        Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=-1))


def test_losing_a_worker_the_pipeline_does_not_have_is_refused():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4)))
    with pytest.raises(SchedulingError, match="no rollout worker at GPU 1"):
        sched.step(0, [WorkerLost(pipeline_id="a", first_gpu=1)])
