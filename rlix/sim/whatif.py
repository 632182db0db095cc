"""Simulator layer: what one more job would do to a trace (``rlix-sim whatif``).

The trace is replayed under each policy twice, as it is and with the job
added as its last pipeline, exactly as if the job had been written into the
trace file by hand. What comes back is the new job's predicted JCT and, for
every job already in the trace, its JCT before and after (seconds), and the
makespan before and after. Nothing here decides anything: the numbers are two
ordinary replays side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlix.config import one_line, read_document
from rlix.metrics import RunMetrics
from rlix.sim.simulator import replay
from rlix.trace import PipelineModel, Trace, TraceError, pipeline_topology_error

WHATIF_FORMAT = "rlix-whatif"

OnReplay = Callable[[str, str], None]  # (policy, "before" | "after"), called as each replay starts


@dataclass(frozen=True, kw_only=True)
class Change:
    """One number before and after the job is added (seconds)."""

    name: str
    before_s: float
    after_s: float

    @property
    def change_s(self) -> float:
        return self.after_s - self.before_s

    @property
    def change_pct(self) -> float | None:
        """Change as a percentage of ``before_s`` (None when that is 0)."""
        return 100.0 * self.change_s / self.before_s if self.before_s > 0 else None

    def to_json(self) -> dict:
        return {"before_s": self.before_s, "after_s": self.after_s, "change_s": self.change_s, "change_pct": self.change_pct}


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A job of the added entry (one, or one per arrival of a template) as the replay with it predicts it."""

    name: str
    arrival_s: float
    jct_s: float
    queue_delay_s: float  # arrival to the grant of its model load


@dataclass(frozen=True, kw_only=True)
class PolicyWhatIf:
    """One policy's answer: the new jobs' JCTs, every existing job's JCT change, and the makespan's."""

    policy: str
    new_jobs: tuple[NewJob, ...]
    existing: tuple[Change, ...]
    makespan: Change

    def to_json(self) -> dict:
        return {
            "new_jobs": {
                j.name: {"arrival_s": j.arrival_s, "jct_s": j.jct_s, "queue_delay_s": j.queue_delay_s} for j in self.new_jobs
            },
            "existing": {c.name: c.to_json() for c in self.existing},
            "makespan": self.makespan.to_json(),
        }


def load_job(path: str | Path, at: float | None = None) -> PipelineModel:
    """One pipeline entry, as a trace's ``pipelines`` list holds it, from a JSON file; ``at`` replaces its
    ``arrival_s`` (a template's listed arrival times move with it: its first copy arrives at ``at``)."""
    raw = read_document(path, "json", TraceError, "a JSON file holding one pipeline as a trace lists it")
    if not isinstance(raw, dict):
        raise TraceError(f"{path}: expected one pipeline (a JSON object with id, kind, roles, steps), got {type(raw).__name__}")
    if "pipelines" in raw:
        raise TraceError(f"{path}: this is a whole trace; give one pipeline entry (one element of a trace's 'pipelines')")
    if at is not None:
        raw = {**raw, "arrival_s": at}
        times = raw.get("arrivals", {}).get("times_s") if isinstance(raw.get("arrivals"), dict) else None
        if isinstance(times, list) and times and all(isinstance(t, (int, float)) for t in times):
            raw["arrivals"] = {**raw["arrivals"], "times_s": [at + t - min(times) for t in times]}
    try:
        return PipelineModel.model_validate(raw)
    except ValidationError as e:
        raise TraceError(f"{path}: {one_line(e)}") from None


def add_job(trace: Trace, job: PipelineModel, job_source: str) -> Trace:
    """``trace`` with ``job`` as its last pipeline; the job's ids must be new and its mappings fit the trace's cluster."""
    taken = {p.id for p in trace.jobs}
    clash = [i for i in job.job_ids() if i in taken]
    if clash:
        raise TraceError(f"{job_source}: id: '{clash[0]}' is already a pipeline of {trace.source}; give the job another id")
    problem = pipeline_topology_error(trace.cluster, job)
    if problem is not None:
        c = trace.cluster
        raise TraceError(
            f"{job_source}: {problem} (the trace's cluster has {c.num_gpus} GPUs, {c.nodes}x{c.gpus_per_node}); "
            "fit the job's roles to it"
        )
    try:
        return trace.replaced(pipelines=[*trace.model.pipelines, job])
    except TraceError as e:  # the job's own field, as its file has it (the job is the trace's last pipeline)
        raise TraceError(f"{job_source}: {str(e).removeprefix(f'pipelines[{len(trace.model.pipelines)}].')}") from None


def compare(before: RunMetrics, after: RunMetrics, new_ids: list[str]) -> PolicyWhatIf:
    """The two replays of one policy side by side."""
    new_jobs = tuple(
        NewJob(name=i, arrival_s=p.arrival_s, jct_s=p.jct_s, queue_delay_s=p.queue_delay_s)
        for i in new_ids
        for p in (after.pipelines[i],)
    )
    existing = tuple(
        Change(name=pid, before_s=before.pipelines[pid].jct_s, after_s=after.pipelines[pid].jct_s)
        for pid in sorted(before.pipelines)
    )
    makespan = Change(name="makespan", before_s=before.makespan_s, after_s=after.makespan_s)
    return PolicyWhatIf(policy=before.policy, new_jobs=new_jobs, existing=existing, makespan=makespan)


def whatif(base: Trace, with_job: Trace, new_ids: list[str], policies: list[str], on_replay: OnReplay | None = None):
    """Each policy's :class:`PolicyWhatIf`: ``base`` and ``with_job`` (``base`` plus the job) replayed under it."""
    out = []
    for policy in policies:
        runs = []
        for label, trace in (("before", base), ("after", with_job)):
            if on_replay is not None:
                on_replay(policy, label)
            runs.append(replay(trace, policy))
        out.append(compare(runs[0], runs[1], new_ids))
    return tuple(out)


def whatif_json(trace_name: str, source: str, job_source: str, results: tuple[PolicyWhatIf, ...]) -> dict:
    return {
        "format": WHATIF_FORMAT,
        "version": 1,
        "trace": trace_name,
        "source": source,
        "job": job_source,
        "policies": {r.policy: r.to_json() for r in results},
    }


def _pct(change: Change) -> str:
    return "-" if change.change_pct is None else f"{change.change_pct:+.1f}%"


def print_whatif(console: Console, results: tuple[PolicyWhatIf, ...]) -> None:
    """A table per policy: the new jobs, then each existing job's JCT before, after and the change, then the makespan."""
    for r in results:
        table = Table(title=f"{r.policy}: JCT (s) without and with the job", title_justify="left")
        for header in ("pipeline", "before", "after", "change (s)", "change"):
            table.add_column(header, justify="left" if header == "pipeline" else "right")
        for j in r.new_jobs:
            table.add_row(Text(f"+ {j.name} (new, arrives {j.arrival_s:,.0f} s)"), "-", f"{j.jct_s:,.0f}", "-", "-")
        for c in r.existing:
            table.add_row(Text(c.name), f"{c.before_s:,.0f}", f"{c.after_s:,.0f}", f"{c.change_s:+,.0f}", _pct(c))
        table.add_section()
        m = r.makespan
        table.add_row("makespan", f"{m.before_s:,.0f}", f"{m.after_s:,.0f}", f"{m.change_s:+,.0f}", _pct(m))
        console.print(table)
