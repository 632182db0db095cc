"""Simulator property: over-reporting demand gains a job nothing.

Each job in turn reports twice its queued trajectories, its open batches and its backlog
(``benchmarks/overreport.py`` does the same over any trace); the core weighs only what it
can check (:func:`rlix.core.shares.checked_counts`) and gives every job the same
entitlement, so the liar finishes no sooner, and no other job later, by more than 2%: on
``two_jobs`` and its redraws, and on random small traces of several jobs on their own
homes (those of ``tests/test_sim_fairness.py``), with and without ``home_guarantee``.
(A multi-LoRA job with staleness in batch mode can still claim up to its declared
``open_limit``: docs/benchmarks.md say what that costs.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_sim_fairness import random_trace

from rlix.sim.simulator import Simulation
from rlix.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parent.parent
TWO_JOBS = load_trace(ROOT / "traces" / "two_jobs.json")


def jcts(trace: Trace, liar: str | None = None) -> dict[str, float]:
    sim = Simulation(trace, "rlix")
    if liar is not None:
        honest = sim.pipelines[liar].demand_report

        def inflated():
            r = honest()
            return dataclasses.replace(r, pending=2 * r.pending, batch_size=2 * r.batch_size, backlog=2 * r.backlog)

        sim.pipelines[liar].demand_report = inflated
    return {pid: m.jct_s for pid, m in sim.run().pipelines.items()}


def assert_no_lie_pays(trace: Trace, seed) -> None:
    honest = jcts(trace)
    for liar in sorted(honest):
        lied = jcts(trace, liar)
        assert lied[liar] >= honest[liar] / 1.02, (seed, liar, honest[liar], lied[liar])
        for other in sorted(set(honest) - {liar}):
            assert lied[other] <= honest[other] * 1.02, (seed, liar, other, honest[other], lied[other])


@pytest.mark.parametrize("seed", [None, *range(8)])
def test_a_job_of_two_jobs_that_reports_twice_its_demand_gains_nothing(seed):
    assert_no_lie_pays(TWO_JOBS if seed is None else TWO_JOBS.reseeded(seed), seed)


@pytest.mark.parametrize("guarantee", ["false", "true"])
@pytest.mark.parametrize("seed", range(20))
def test_on_random_traces_a_job_that_reports_twice_its_demand_gains_nothing(seed, guarantee):
    assert_no_lie_pays(random_trace(seed).with_scheduler({"home_guarantee": guarantee}), seed)
