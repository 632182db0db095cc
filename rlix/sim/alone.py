"""Simulator layer: each job's slowdown against running alone on the same GPUs.

Co-tenants share their GPUs the way processors are shared: fairness among
them means each sees about the same slowdown against its time alone. The
simulator finds that time by replaying each job alone (the same trace with
every other job left out, the same arrival, knobs and policy), not by
estimating it.
"""

from __future__ import annotations

from rlix.core import Policy
from rlix.metrics import RunMetrics
from rlix.sim.simulator import replay
from rlix.trace import Trace, TraceModel


def alone(trace: Trace, job_id: str) -> Trace:
    """``trace`` with job ``job_id`` (a template's copies expanded) as its only job."""
    job = next(p for p in trace.jobs if p.id == job_id)
    model = trace.model.model_copy(update={"pipelines": [job]})
    return Trace(TraceModel.model_validate(model.model_dump(exclude_none=True)), f"{trace.source} ({job_id} alone)")


def alone_runs(trace: Trace, policy: str | Policy) -> dict[str, RunMetrics]:
    """Each job's run replayed alone under ``policy``, by job id."""
    return {p.id: replay(alone(trace, p.id), policy) for p in trace.jobs}


def alone_jcts(trace: Trace, policy: str | Policy) -> dict[str, float]:
    """Each job's completion time (seconds from its arrival) replayed alone under ``policy``."""
    return {pid: run.pipelines[pid].jct_s for pid, run in alone_runs(trace, policy).items()}


def slowdowns(run: RunMetrics, alone_jct: dict[str, float]) -> dict[str, float]:
    """Each job's JCT in ``run`` over its JCT alone (1.0: not slowed at all)."""
    return {pid: p.jct_s / alone_jct[pid] for pid, p in sorted(run.pipelines.items()) if alone_jct.get(pid)}
