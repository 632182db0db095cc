"""Executor layer: turns a finished run's records into its outputs.

- ``timeline.json``: Chrome/Perfetto trace events, one track per GPU;
- ``trace.json``: what really happened, in the rlix-trace format (explicit
  steps from measured durations), built as the trace format's own model
  (:class:`rlix.trace.TraceModel`), so it is validated when written and
  ``rlix-sim replay`` reads back exactly what was written;
- ``metrics.json``: the brief's metrics, via :mod:`rlix.metrics`;
- ``timeline.png``: the GPU-by-time chart and utilization, drawn as
  ``rlix-sim replay --plot`` draws a replay (:mod:`rlix.plot`), when
  matplotlib can be imported.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlix.config import ClusterModel, JobModel, SchedulerModel
from rlix.core import Stage
from rlix.exec.config import JobConfig, RunConfig
from rlix.exec.error_text import os_error
from rlix.exec.messages import JobResult
from rlix.exec.records import ActivityChange, JobStatus, SwitchKind, TrajRecord
from rlix.job import JobShape, StepShape, lower_bounds
from rlix.metrics import Activity, PipelineTally, RunMetrics, UsageRecorder, summarize
from rlix.protocol import SchedulerStats
from rlix.trace import PipelineModel, StepModel, StreamModel, SwitchModel, TraceModel, dump_trace


@dataclass(frozen=True, kw_only=True)
class RunOutputs:
    metrics: RunMetrics
    wall_s: float
    control_overhead_fraction: float  # job time blocked on control-plane calls beyond GPU waits / job wall time
    results: dict[str, JobResult]
    files: dict[str, str]
    lines: tuple = ()  # per job, by name: its closing JobLine (rlix.exec.front.joblines), as the live view last showed it
    moved: str = ""  # the run's folder could not be written at the end: why, and where the outputs went instead


RUN_FILES = {"timeline": "timeline.json", "trace": "trace.json", "metrics": "metrics.json", "plot": "timeline.png"}  # by kind


def _write_run_files(folder: Path, cfg: RunConfig, rec, results, names, end: float, metrics_text: str) -> dict[str, str]:
    """timeline.json, trace.json, metrics.json (``metrics_text``) and timeline.png in ``folder`` (made if
    missing); returns their paths by kind."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"timeline": folder / RUN_FILES["timeline"], "metrics": folder / RUN_FILES["metrics"]}
    files["timeline"].write_text(json.dumps(timeline_json(rec, results)))
    trace = trace_model(cfg, results, names)
    if trace is not None:  # written by the trace format itself: what rlix-sim reads back
        files["trace"] = folder / RUN_FILES["trace"]
        dump_trace(trace, files["trace"])
    files["metrics"].write_text(metrics_text)
    if (plot := timeline_png(rec, end, cfg.policy, sorted(results), folder / RUN_FILES["plot"])) is not None:
        files["plot"] = plot
    return {k: str(v) for k, v in files.items()}


def usage_from_events(
    num_gpus: int,
    events: list[ActivityChange],
    unmet: tuple[tuple[float, bool], ...],
    end: float,
    homes: tuple[tuple[float, str, tuple[int, ...]], ...] = (),
) -> UsageRecorder:
    """The run's activity replayed into a recorder; ``homes``: (time, job, its home from then on, () once it left)."""
    rec = UsageRecorder(num_gpus, start=0.0)
    stream = [(t, 0, i, (pid, gpus)) for i, (t, pid, gpus) in enumerate(homes)]
    stream += [(e.t, 1, i, e) for i, e in enumerate(events)] + [(t, 2, i, u) for i, (t, u) in enumerate(unmet)]
    for t, kind, _, item in sorted(stream, key=lambda x: x[:3]):
        t = min(t, end)
        if kind == 0:
            rec.homes.set_home(t, *item)
        elif kind == 1:
            rec.set(item.gpus, t, item.activity, item.pipeline_id, item.stage)
        else:
            rec.set_unmet_demand(t, item)
    rec.close(end)
    return rec


def _homes(
    cfg: RunConfig, results: dict[str, JobResult], names: dict[str, str]
) -> tuple[tuple[float, str, tuple[int, ...]], ...]:
    """Each job's home from its arrival until it ended (rlix.lending)."""
    out = []
    for pid, res in sorted(results.items()):
        job = _job(cfg, names[pid])
        out += [(res.arrival_s, pid, job.pipeline_spec(pid).home_gpus), (max(res.finish_s, res.arrival_s), pid, ())]
    return tuple(out)


def timeline_json(rec: UsageRecorder, results: dict[str, JobResult]) -> dict:
    """Chrome trace events: process 'GPUs' with one thread per GPU, plus per-job step spans."""
    ev: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "GPUs"}}]
    for g in range(rec.num_gpus):
        ev.append({"ph": "M", "pid": 0, "tid": g, "name": "thread_name", "args": {"name": f"GPU {g}"}})
    for seg in rec.iter_segments():
        name = (
            f"{seg.pipeline_id}:{seg.stage or seg.activity.value}"
            if seg.activity is not Activity.HELD
            else f"{seg.pipeline_id}:held"
        )
        ev.append(
            {
                "ph": "X",
                "pid": 0,
                "tid": seg.gpu,
                "ts": seg.start * 1e6,
                "dur": (seg.end - seg.start) * 1e6,
                "name": name,
                "cat": seg.activity.value,
            }
        )
    ev.append({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "jobs"}})
    for i, (pid, res) in enumerate(sorted(results.items())):
        ev.append({"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": pid}})
        for s in res.steps:
            ev.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": i,
                    "ts": s.started_s * 1e6,
                    "dur": (s.finished_s - s.started_s) * 1e6,
                    "name": f"step {s.step + 1}",  # as in metrics.jsonl: the Nth trained step
                    "args": {"reward": s.mean_reward},
                }
            )
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def _mean(xs: list[float], default: float) -> float:
    return statistics.fmean(xs) if xs else default


def trace_model(cfg: RunConfig, results: dict[str, JobResult], names: dict[str, str]) -> TraceModel | None:
    """The run as an explicit rlix-trace (measured durations only); None when no job finished a step."""
    jobs = {j.name: j for j in cfg.jobs}
    pipelines = [_pipeline(jobs[names[pid]], pid, res) for pid, res in sorted(results.items()) if res.steps]
    if not pipelines:
        return None  # a trace holds at least one pipeline: nothing measured, nothing to replay
    return TraceModel(
        name="rlix-run",
        description=f"measured by rlix-run under policy {cfg.policy}",
        cluster=ClusterModel(nodes=cfg.cluster.nodes, gpus_per_node=cfg.cluster.gpus_per_node),
        # every field of the run's scheduler block (core knobs, plan interval, heartbeat): a replay plans at the run's cadence
        scheduler=SchedulerModel.model_validate(cfg.scheduler.model_dump()),
        pipelines=pipelines,
    )


def _pipeline(job: JobConfig, pid: str, res: JobResult) -> PipelineModel:
    """One measured job: its shared job fields as it registered them, measured costs and steps."""
    spec = job.pipeline_spec(pid)
    lora = job.kind == "multi_lora"
    return PipelineModel(
        **job.model_dump(include=set(JobModel.model_fields) - {"arrival_s", "home"}),  # as configured
        id=pid,
        arrival_s=round(res.arrival_s, 4),  # measured: when it really arrived
        home=list(spec.home),  # the home it named ([]: none, so a replay derives it as the run did)
        preempt="continue",  # the executor continues an aborted trajectory elsewhere
        init_s=round(res.init_s, 4),
        switch=_switch(res, lora),
        **_streams(res, [a.name for a in job.adapters] if lora else None),
    )


def _switch(res: JobResult, lora: bool) -> SwitchModel:
    """Mean measured seconds of each kind of switch (0 where none happened). Rollout workers' and
    stages' loads and offloads are kept apart, and so are the worker processes started on arrival
    (beside the model load) and those started once the model was loaded."""
    sw = {k: [s.seconds for s in res.switches if s.kind is k] for k in SwitchKind}
    loaded = res.arrival_s + res.init_s
    starts = [s for s in res.switches if s.kind is SwitchKind.PROCESS_START]
    early = [s.seconds for s in starts if s.t < loaded]
    later = [s.seconds for s in starts if s.t >= loaded]
    sync = round(_mean(sw[SwitchKind.SYNC], 0.0), 4)
    return SwitchModel(
        offload_s=round(_mean(sw[SwitchKind.SLEEP], 0.0), 4),
        load_s=round(_mean(sw[SwitchKind.WAKE], 0.0), 4),
        stage_offload_s=round(_mean(sw[SwitchKind.STAGE_OFFLOAD], 0.0), 4),
        stage_load_s=round(_mean(sw[SwitchKind.STAGE_LOAD], 0.0), 4),
        weight_sync_s=0.0 if lora else sync,
        **({"adapter_sync_s": sync} if lora else {}),
        resume_s=0.0,  # a continued trajectory's re-prefill is inside its measured segments' seconds
        start_s=round(_mean(early or later, 0.0), 4),
        start_later_s=round(_mean(later or early, 0.0), 4),
    )


def _steps(res: JobResult, stream: str) -> list[StepModel]:
    """Measured steps of one stream: each trajectory's generation seconds and prompt, and the stage seconds."""
    by_step: dict[int, list[TrajRecord]] = {}
    for t in res.trajectories:
        if t.stream == stream:
            by_step.setdefault(t.step, []).append(t)
    out = []
    for s in (s for s in res.steps if s.stream == stream):
        trajs = by_step.get(s.step, [])
        prompts = [t.prompt for t in trajs]
        out.append(
            StepModel(
                trajectories=[round(max(t.gen_s, 1e-4), 4) for t in trajs] or [1e-4],
                prompts=prompts if prompts and min(prompts) >= 0 else None,
                stages={k: round(v, 4) for k, v in s.stages},
            )
        )
    return out


def _streams(res: JobResult, adapters: list[str] | None) -> dict:
    """``steps`` for a full finetune; ``adapters`` (one stream per adapter that trained) for multi-LoRA."""
    if adapters is None:
        return {"steps": _steps(res, "")}
    return {"adapters": [StreamModel(id=name, steps=steps) for name in adapters if (steps := _steps(res, name))]}


def _shape(cfg: RunConfig, pid: str, res: JobResult, names: dict[str, str]) -> JobShape:
    """A measured job as the job model's bounds see it (one stream per adapter)."""
    job = _job(cfg, names[pid])
    gen: dict[tuple[str, int], list[float]] = {}
    for t in res.trajectories:
        gen.setdefault((t.stream, t.step), []).append(t.gen_s)
    streams: dict[str, list[StepShape]] = {}
    for s in res.steps:
        g = gen.get((s.stream, s.step), [0.0])
        streams.setdefault(s.stream, []).append(
            StepShape(trajectory_s=sum(g), longest_s=max(g), stages=tuple((Stage(k), v) for k, v in s.stages))
        )
    return JobShape(
        spec=job.pipeline_spec(pid),
        arrival_s=res.arrival_s,
        init_s=res.init_s,
        staleness=job.staleness,
        streams=tuple(tuple(v) for _, v in sorted(streams.items())),
        streaming=job.rollout_mode == "streaming",
    )


def _reward_json(steps) -> dict:
    return {
        "reward_first": steps[0].mean_reward if steps else None,
        "reward_last": steps[-1].mean_reward if steps else None,
        "rewards": [round(s.mean_reward, 4) for s in steps],
    }


def _job_json(r: JobResult) -> dict:
    """One job's line of the executor's section of metrics.json (a multi-LoRA job's rewards per adapter only)."""
    adapters = sorted({s.stream for s in r.steps if s.stream})
    return {
        "status": r.status.value,
        "error": r.error,
        "steps": len(r.steps),  # trained by this run
        "steps_before": r.steps_before,  # held by its checkpoints when it started (trained by earlier runs)
        "steps_planned": r.steps_planned,  # steps_before included
        **(_reward_json(r.steps) if not adapters else {}),
        "adapters": {name: _reward_json([s for s in r.steps if s.stream == name]) for name in adapters},
        "requeued": r.requeued,
        "lost": r.lost,
        "workers_lost": r.workers_lost,
        "control_overhead_s": r.control_overhead_s,
        "gpu_wait_s": r.gpu_wait_s,
        "trainer_ranks": r.trainer_ranks,
        "switch_s": {k.value: round(sum(s.seconds for s in r.switches if s.kind is k), 4) for k in SwitchKind},
        "weight_loads": _weight_loads(r.switches),
        "warnings": list(r.warnings),
    }


def _weight_loads(switches) -> list[dict]:
    """Every load of the full weights by a rollout worker (a wake's or a live sync's): when, how long,
    the bytes, and the path they came by (``host`` or ``cuda_ipc``, :mod:`rlix.weightsync.handoff`)."""
    return [
        dict(t=round(s.t, 4), kind=s.kind.value, seconds=round(s.seconds, 4), bytes=s.synced_bytes, path=s.sync_path.value)
        for s in switches
        if s.sync_path is not None
    ]


def timeline_png(rec: UsageRecorder, end: float, policy: str, pipelines: list[str], path: Path) -> Path | None:
    """The run's GPU-by-time chart at ``path``, as the simulator draws a replay; None without matplotlib."""
    try:
        from rlix.plot import plot_runs
    except ImportError:  # matplotlib is optional for the executor: the JSON outputs say it all
        return None
    plot_runs({policy: (rec, end)}, pipelines, path, f"rlix-run: {len(pipelines)} jobs")
    return path


def _job(cfg: RunConfig, name: str):
    """The config's job of this name."""
    return next(j for j in cfg.jobs if j.name == name)


def _tally(res: JobResult, tenant: str) -> PipelineTally:
    tally = PipelineTally(
        arrival_s=res.arrival_s, finish_s=res.finish_s if res.status is JobStatus.FINISHED else None, tenant=tenant
    )
    tally.step_latencies = [s.finished_s - s.started_s for s in res.steps]
    tally.trajectories = len(res.trajectories)
    tally.preemptions = res.preemptions
    return tally


def run_metrics(
    cfg: RunConfig, results: dict[str, JobResult], names: dict[str, str], events: list[ActivityChange], stats, end: float
) -> tuple[UsageRecorder, RunMetrics]:
    """The run's recorded activity and its metrics, in the simulator's vocabulary (of the jobs it ran: one
    whose checkpoints held all its steps did nothing here)."""
    results = {pid: res for pid, res in results.items() if not res.trained_already}
    num_gpus = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    rec = usage_from_events(num_gpus, events, stats.unmet, end, _homes(cfg, results, names))
    work, crit = lower_bounds([_shape(cfg, pid, res, names) for pid, res in sorted(results.items())], num_gpus)
    metrics = summarize(
        policy=cfg.policy,
        usage=rec,
        start=0.0,
        end=end,
        tallies={pid: _tally(res, _job(cfg, names[pid]).tenant) for pid, res in results.items()},
        lower_bound_work_s=work,
        lower_bound_critical_path_s=crit,
        trajectories_requeued=sum(r.requeued for r in results.values()),
        trajectories_lost=sum(r.lost for r in results.values()),
        plans=stats.plans,
    )
    return rec, metrics


def build_outputs(
    cfg: RunConfig,
    results: dict[str, JobResult],
    names: dict[str, str],
    events: list[ActivityChange],
    stats: SchedulerStats,
    end: float,
    out_dir: Path,
    stopped_at: float | None = None,
    *,
    started_at: float = 0.0,
    shared: bool = False,
) -> RunOutputs:
    """The run's metrics (the simulator's vocabulary, from the recorded activity), timeline.json,
    trace.json (replayable by rlix-sim), metrics.json with the executor's own figures and timeline.png.

    ``stopped_at``: the run was stopped then (Ctrl-C). metrics.json says its figures are partial when any
    job did not finish (stopped, cancelled, failed or killed), and names those jobs; a stop that came once
    every job had finished cut nothing.
    ``started_at``: the run's start (Unix seconds; every time in the outputs counts from it).
    ``shared``: the jobs ran under the cluster's shared scheduler, beside other submissions' jobs."""
    rec, metrics = run_metrics(cfg, results, names, events, stats, end)
    unfinished = sorted(pid for pid, r in results.items() if r.status is not JobStatus.FINISHED)
    job_wall = sum(max(r.finish_s - r.arrival_s, 1e-9) for r in results.values())
    overhead = sum(r.control_overhead_s for r in results.values()) / max(job_wall, 1e-9)
    extra = {
        # a job that did not run all its steps (stopped, cancelled, failed or killed): the figures cover what ran
        "partial": bool(unfinished),
        "unfinished_jobs": unfinished,
        "stopped_at_s": stopped_at,
        "started_at_unix_s": started_at,
        # under the shared scheduler, the cluster-wide fractions count this run's jobs only (other submissions'
        # use shows as idle) and the scheduler's counts cover every job since it started: see rlix status
        "shared": shared,
        "wall_s": end,
        "control_overhead_fraction": overhead,
        "scheduler_plan_s": stats.plan_s,
        "scheduler_errors": list(stats.errors),
        "jobs": {pid: _job_json(r) for pid, r in sorted(results.items())},
    }

    text = json.dumps({**metrics.to_json(), "executor": extra}, indent=1) + "\n"
    moved = ""
    try:
        paths = _write_run_files(out_dir, cfg, rec, results, names, end, text)
    except OSError as exc:  # the folder went away or filled up during the run: the outputs are kept elsewhere
        try:
            elsewhere = Path(tempfile.mkdtemp(prefix="rlix-outputs-"))
            paths = _write_run_files(elsewhere, cfg, rec, results, names, end, text)
        except OSError as again:  # what was written in out_dir stays: it is all there is
            paths = {k: str(out_dir / name) for k, name in RUN_FILES.items() if (out_dir / name).is_file()}
            moved = f"{out_dir} could not be written whole ({os_error(exc)}), nor a temporary folder ({os_error(again)})"
        else:
            for name in RUN_FILES.values():  # what this run wrote there before it failed: not to be taken for a run's
                try:
                    (out_dir / name).unlink(missing_ok=True)
                except OSError:
                    pass
            moved = f"{out_dir} could not be written ({os_error(exc)}); the run's outputs are in {elsewhere}"
    return RunOutputs(metrics=metrics, wall_s=end, control_overhead_fraction=overhead, results=results, files=paths, moved=moved)
