"""Simulator property: an honest job's demand never exceeds the ``open_limit`` it declares.

The core bounds the demand it weighs by each job's declared ``open_limit`` (its largest
batch times the batches that may roll out together), so that over-reporting gains nothing.
The bound must never cut an honest report: on every shipped trace shape and on redraws of
them, each report's queued plus running trajectories, and its open batches, stay within it,
and the bound is tight (some job reaches it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlix.sim.simulator import Simulation
from rlix.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ["two_jobs", "queued_cluster", "mixed_agentic", "async_disaggregated", "agentic_swe", "verl_dapo_colocated"]


def reports_against_limits(trace) -> list[tuple[str, int, int, int]]:
    """(job, queued + running, open batches, declared open_limit) of every demand report of a replay."""
    sim = Simulation(trace, "rlix")
    seen = []
    for pid, pipeline in sim.pipelines.items():

        def recorded(pid=pid, pipeline=pipeline, honest=pipeline.demand_report):
            r = honest()
            seen.append((pid, r.pending + sum(w.active for w in r.loads), r.batch_size, pipeline.spec.open_limit))
            return r

        pipeline.demand_report = recorded
    sim.run()
    return seen


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("seed", [None, 1])
def test_honest_demand_stays_within_the_declared_open_limit(name, seed):
    trace = load_trace(ROOT / "traces" / f"{name}.json")
    trace = trace if seed is None else trace.reseeded(seed)
    seen = reports_against_limits(trace)
    assert seen and all(limit > 0 for *_, limit in seen)
    over = [(pid, remaining, batch, limit) for pid, remaining, batch, limit in seen if max(remaining, batch) > limit]
    assert not over, over[:3]
    assert any(remaining == limit for _, remaining, _, limit in seen)  # the bound is tight, not vacuous
