"""Simulator property: an honest job's demand is never cut by what the core checks.

The core bounds the demand it weighs by what it can check of each job
(:func:`rlix.core.shares.checked_counts`): the ``open_limit`` it declared (its largest
batch times the batches that may roll out together), the batches it credited
(:meth:`rlix.core.state.PipelineEntry.credit_batches`: finished + queued + running only
rises when a batch opens) and the ``total_trajectories`` it declared (all its steps), so
that over-reporting gains nothing. The bounds must never cut an honest report: on every
shipped trace shape and on redraws of them, every count the core weighs is the one the
job reported; and the bounds are tight (some report reaches them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import rlix.core.shares as shares
from rlix.sim.simulator import Simulation
from rlix.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ["two_jobs", "queued_cluster", "mixed_agentic", "async_disaggregated", "agentic_swe", "verl_dapo_colocated"]


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("seed", [None, 1])
def test_honest_demand_is_never_cut(name, seed, monkeypatch):
    weighed = []
    checked = shares.checked_counts

    def observed(spec, report, running, credit_end=None):  # the core's own check, recorded
        counts = checked(spec, report, running, credit_end)
        weighed.append((spec, report, running, credit_end, counts))
        return counts

    monkeypatch.setattr(shares, "checked_counts", observed)
    trace = load_trace(ROOT / "traces" / f"{name}.json")
    Simulation(trace if seed is None else trace.reseeded(seed), "rlix").run()
    assert weighed and all(spec.open_limit > 0 and spec.total_trajectories > 0 for spec, *_ in weighed)
    cut = [(s.pipeline_id, r, n, c, got) for s, r, n, c, got in weighed if got != (r.pending + n, r.batch_size, r.backlog)]
    assert not cut, cut[:3]
    assert any(r.pending + n == s.open_limit for s, r, n, _, _ in weighed)  # tight, not vacuous
    assert any(c is not None and r.pending + n == c - r.finished and r.finished for s, r, n, c, _ in weighed)
    assert any(r.backlog and r.backlog == s.total_trajectories - r.finished - r.pending - n for s, r, n, _, _ in weighed)
