"""Bundles a job reports ``starting`` (its worker process there is not up): no worker of it goes there."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import demand, owners, register, spec

from rlix.core import ClusterSpec, Scheduler, SchedulerConfig, SchedulingError, WorkerLost, check_ledger


def _starting(report, *firsts: int):
    return replace(report, starting=tuple(firsts))


def test_no_worker_goes_where_the_process_is_starting_until_a_report_leaves_it_out():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4), home=range(2)))
    sched.step(0, [_starting(demand("a", 40), 2, 3)])
    assert owners(sched) == {"a": [0, 1]}
    plan = sched.step(1, [_starting(demand("a", 40, loads={0: 4, 1: 4}), 3)])  # the process on GPU 2 is up
    assert [e.worker.gpus for e in plan.expands] == [(2,)]
    plan = sched.step(2, [demand("a", 40, loads={0: 4, 1: 4, 2: 4})])
    assert [e.worker.gpus for e in plan.expands] == [(3,)]
    check_ledger(sched.ledger)


def test_a_job_whose_processes_all_start_gets_no_worker_yet_and_its_home_is_lent_meanwhile():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4), home=range(2)), spec("b", range(3, 4), range(4), home=range(2, 4)))
    sched.step(0, [_starting(demand("a", 40), 0, 1, 2, 3), demand("b", 40)])
    assert owners(sched) == {"a": [], "b": [0, 1, 2, 3]}  # the other job's processes are up everywhere
    plan = sched.step(100, [_starting(demand("a", 40), 2, 3), demand("b", 40, loads=dict.fromkeys(range(4), 4))])
    assert {e.worker.gpus for e in plan.expands} == {(0,), (1,)}  # a's home, once its processes are up
    assert owners(sched) == {"a": [0, 1], "b": [2, 3]}


def test_a_bundle_both_cooling_and_starting_comes_back_once_both_are_over():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=10))
    register(sched, spec("a", range(1), range(4)))
    sched.step(0, [demand("a", 40)])
    lost = WorkerLost(pipeline_id="a", first_gpu=2)  # its process died; a new one is starting
    assert sched.step(1, [lost, _starting(demand("a", 40, loads={0: 4, 1: 4, 3: 4}), 2)]).expands == ()
    assert sched.step(11).expands == ()  # cooled down, still starting
    assert [e.worker.gpus for e in sched.step(12, [demand("a", 40, loads={0: 4, 1: 4, 3: 4})]).expands] == [(2,)]


def test_a_worker_lost_where_a_report_already_names_its_process_starting_still_cools_the_bundle():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(lost_cooldown_s=10))
    register(sched, spec("a", range(1), range(4)))
    sched.step(0, [demand("a", 40)])
    # the process on GPU 2 died and a new one starts: the report says so before the loss is reported
    sched.step(1, [_starting(demand("a", 40, loads={0: 4, 1: 4, 3: 4}), 2), WorkerLost(pipeline_id="a", first_gpu=2)])
    assert sched.step(2, [demand("a", 40, loads={0: 4, 1: 4, 3: 4})]).expands == ()  # up, but cooling
    assert [e.worker.gpus for e in sched.step(11).expands] == [(2,)]


def test_a_starting_gpu_that_begins_none_of_the_jobs_bundles_is_refused():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix")
    register(sched, spec("a", range(1), range(4), tp=2))
    with pytest.raises(SchedulingError, match="reports GPU 1 starting, which begins none of its rollout bundles"):
        sched.step(0, [_starting(demand("a", 40), 1)])
