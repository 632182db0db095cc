"""Simulator property: an honest job's demand never exceeds what it declares.

The core bounds the demand it weighs by each job's declared ``open_limit`` (its largest
batch times the batches that may roll out together) and ``total_trajectories`` (all its
steps), so that over-reporting gains nothing (:func:`rlix.core.shares.checked_counts`).
The bounds must never cut an honest report: on every shipped trace shape and on redraws
of them, each report's queued plus running trajectories and its open batches stay within
``open_limit``, and its backlog within what of ``total_trajectories`` it has neither
finished nor open; and both bounds are tight (some report reaches them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlix.core.shares import checked_counts
from rlix.sim.simulator import Simulation
from rlix.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ["two_jobs", "queued_cluster", "mixed_agentic", "async_disaggregated", "agentic_swe", "verl_dapo_colocated"]


def reports(trace) -> list[tuple]:
    """(spec, report, running) of every demand report of a replay."""
    sim = Simulation(trace, "rlix")
    seen = []
    for pipeline in sim.pipelines.values():

        def recorded(pipeline=pipeline, honest=pipeline.demand_report):
            r = honest()
            seen.append((pipeline.spec, r, sum(w.active for w in r.loads)))
            return r

        pipeline.demand_report = recorded
    sim.run()
    return seen


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("seed", [None, 1])
def test_honest_demand_stays_within_what_the_job_declared(name, seed):
    trace = load_trace(ROOT / "traces" / f"{name}.json")
    seen = reports(trace if seed is None else trace.reseeded(seed))
    assert seen and all(spec.open_limit > 0 and spec.total_trajectories > 0 for spec, _, _ in seen)
    cut = [
        (r, running)
        for spec, r, running in seen
        if checked_counts(spec, r, running) != (r.pending + running, r.batch_size, r.backlog)
    ]
    assert not cut, cut[:3]
    assert any(r.pending + running == spec.open_limit for spec, r, running in seen)  # tight, not vacuous
    assert any(r.backlog and r.backlog == spec.total_trajectories - r.finished - r.pending - running for spec, r, running in seen)
