"""The core's WorkerLost event: a rollout worker that is gone gives its GPUs back without a shrink."""

from __future__ import annotations

import pytest
from helpers import demand, owners, register, spec

from rlix.core import ClusterSpec, Scheduler, SchedulingError, WorkerLost, check_ledger


def test_a_lost_worker_frees_its_gpus_and_the_next_plan_may_place_another():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4)))
    sched.step(0, [demand("a", 40)])
    assert owners(sched) == {"a": [0, 1, 2, 3]}
    plan = sched.step(1, [WorkerLost(pipeline_id="a", first_gpu=2), demand("a", 40, loads={0: 4, 1: 4, 3: 4})])
    assert plan.shrinks == ()  # nothing to shrink: the worker is already gone
    assert [e.worker.gpus for e in plan.expands] == [(2,)]  # its GPUs were free again for the plan
    check_ledger(sched.ledger)


def test_losing_a_worker_the_pipeline_does_not_have_is_refused():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4)))
    with pytest.raises(SchedulingError, match="no rollout worker at GPU 1"):
        sched.step(0, [WorkerLost(pipeline_id="a", first_gpu=1)])
