"""Shared layer: one metrics vocabulary for the simulator, executor and notebooks.

Both shells feed a :class:`UsageRecorder` with what every GPU is doing; at
the end :func:`summarize` turns that into :class:`RunMetrics`, whose field
names are the design brief's. Every GPU-second falls in exactly one bucket:

- ``work``: stage work running (a gang stage computing, or a rollout worker
  with at least one trajectory in flight) -> ``gpu_utilization``;
- ``switch``: offloading, loading or syncing weights -> ``switch_overhead_fraction``;
- ``held``: allocated but with nothing to run (a rollout worker whose slots
  are all empty) -> ``held_idle_fraction``;
- ``free``: nothing allocated -> ``idle_fraction``.

``stranded_fraction`` is the part of ``free`` during which some pipeline had
trajectories waiting for a slot: capacity that placement rules kept from it.

Two views across the buckets: ``slot_utilization`` weighs ``work`` by the
share of a rollout worker's slots that are generating (a worker running 1 of
its 64 slots counts 1/64; a gang stage counts fully), so the within-worker
tail shows; ``held_while_waiting_gpu_s`` is the ``held`` GPU-seconds of one
pipeline while another pipeline had trajectories waiting for a slot.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import asdict, dataclass, field

from rlix.lending import HomeBook


def utilization(busy_gpu_s: float, num_gpus: int, seconds: float) -> float:
    """The scheduler service's utilization: GPU-seconds some job held (any activity) over GPUs x seconds.
    ``rlix status``, ``rlix timeline`` and the ``rlix_utilization`` metric all read this one figure (a run's
    ``gpu_utilization`` is narrower: the ``work`` bucket only)."""
    return busy_gpu_s / (num_gpus * seconds) if seconds > 0 else 0.0


class Activity(enum.Enum):
    FREE = "free"
    WORK = "work"
    SWITCH = "switch"
    HELD = "held"


@dataclass(frozen=True, kw_only=True)
class Segment:
    """GPU ``gpu`` did ``activity`` for ``pipeline_id``/``stage`` from ``start`` to ``end`` (s)."""

    gpu: int
    start: float
    end: float
    activity: Activity
    pipeline_id: str
    stage: str


class UsageRecorder:
    """Integrates per-GPU activity over time; optionally keeps the segments."""

    def __init__(self, num_gpus: int, *, start: float = 0.0, keep_segments: bool = True) -> None:
        self.num_gpus = num_gpus
        self.keep_segments = keep_segments
        self._act = [Activity.FREE] * num_gpus
        self._who: list[tuple[str, str]] = [("", "")] * num_gpus
        self._since = [start] * num_gpus
        self.totals = {a: 0.0 for a in Activity}
        self.by_pipeline: dict[str, dict[Activity, float]] = {}
        self.segments: list[tuple[int, float, float, Activity, str, str]] = []
        self._free = num_gpus
        self._unmet = False
        self._mark = start
        self.stranded = 0.0
        self._fill = [0.0] * num_gpus  # share of the GPU's slots generating while it works
        self._fill_since = [start] * num_gpus
        self.slot_work = 0.0  # GPU-seconds of work weighted by fill
        self._waiting: set[str] = set()  # pipelines with trajectories waiting for a slot
        self._held_by: dict[str, int] = {}  # pipeline -> GPUs it holds idle now
        self._held = 0
        self.held_while_waiting = 0.0
        self.homes = HomeBook(num_gpus, start)  # GPU-seconds used, lent and borrowed per pipeline

    def set(self, gpus, now: float, activity: Activity, pipeline_id: str = "", stage: str = "", fill: float = 1.0) -> None:
        """From ``now`` on, ``gpus`` do ``activity`` (for ``pipeline_id``'s ``stage``).

        ``fill``: for work, the share of the worker's slots generating (1.0 for a gang stage).
        """
        self._flush_stranded(now)
        who = (pipeline_id, stage)
        f_new = fill if activity is Activity.WORK else 0.0
        fills, acts, whos = self._fill, self._act, self._who  # locals: a replay calls this once per trajectory
        for g in gpus:
            if f_new != fills[g]:
                self.slot_work += fills[g] * (now - self._fill_since[g])
                fills[g] = f_new
                self._fill_since[g] = now
            if acts[g] is activity and whos[g] == who:
                continue  # the same activity for the same owner: at most its fill changed
            self._switch(g, now, activity, who)

    def doing(self, g: int) -> tuple[Activity, str, str]:
        """What GPU ``g`` does now: (activity, pipeline id, stage)."""
        return (self._act[g], *self._who[g])

    def _switch(self, g: int, now: float, activity: Activity, who: tuple[str, str]) -> None:
        """GPU ``g`` starts ``activity`` for ``who`` (pipeline, stage) at ``now``: close what it did before."""
        old = self._act[g]
        self._close(g, now)
        self.homes.hold(g, now, "" if activity is Activity.FREE else who[0])
        if (old is Activity.FREE) != (activity is Activity.FREE):
            self._free += 1 if activity is Activity.FREE else -1
        if old is Activity.HELD:
            self._count_held(self._who[g][0], -1)
        if activity is Activity.HELD:
            self._count_held(who[0], 1)
        self._act[g] = activity
        self._who[g] = who
        self._since[g] = now

    def set_unmet_demand(self, now: float, unmet: bool) -> None:
        """Whether some pipeline has trajectories waiting for a rollout slot."""
        if unmet != self._unmet:
            self._flush_stranded(now)
            self._unmet = unmet

    def set_waiting(self, now: float, pipeline_id: str, waiting: bool) -> None:
        """Whether ``pipeline_id`` has trajectories waiting for a rollout slot (implies the unmet flag)."""
        if waiting == (pipeline_id in self._waiting):
            return
        self._flush_stranded(now)
        if waiting:
            self._waiting.add(pipeline_id)
        else:
            self._waiting.discard(pipeline_id)
        self._unmet = bool(self._waiting)

    def _count_held(self, pipeline_id: str, delta: int) -> None:
        self._held += delta
        self._held_by[pipeline_id] = self._held_by.get(pipeline_id, 0) + delta

    def rebook(self, pipeline_id: str, seconds: float, src: Activity, dst: Activity) -> None:
        """Move ``seconds`` GPU-seconds of ``pipeline_id`` from ``src`` to ``dst`` (e.g. an
        adapter load timed inside a busy worker's work, which was really switching)."""
        if seconds <= 0:
            return
        self.totals[src] -= seconds
        self.totals[dst] += seconds
        per = self.by_pipeline.setdefault(pipeline_id, {a: 0.0 for a in Activity})
        per[src] -= seconds
        per[dst] += seconds

    def close(self, now: float) -> None:
        self._flush_stranded(now)
        self.homes.settle(now)
        for g in range(self.num_gpus):
            self._close(g, now)
            self._since[g] = now
            self.slot_work += self._fill[g] * (now - self._fill_since[g])
            self._fill_since[g] = now

    def _flush_stranded(self, now: float) -> None:
        if self._unmet:
            self.stranded += self._free * (now - self._mark)
            waiting = self._waiting
            if len(waiting) > 1:
                self.held_while_waiting += self._held * (now - self._mark)
            elif waiting:
                (only,) = waiting
                self.held_while_waiting += (self._held - self._held_by.get(only, 0)) * (now - self._mark)
        self._mark = now

    def _close(self, g: int, now: float) -> None:
        dt = now - self._since[g]
        if dt <= 0:
            return
        act = self._act[g]
        self.totals[act] += dt
        pid, stage = self._who[g]
        if pid:
            per = self.by_pipeline.get(pid)
            if per is None:  # not setdefault: its default would be built on every call
                per = self.by_pipeline[pid] = {a: 0.0 for a in Activity}
            per[act] += dt
        if self.keep_segments and act is not Activity.FREE:
            self.segments.append((g, self._since[g], now, act, pid, stage))

    def iter_segments(self):
        for g, s, e, a, pid, stage in self.segments:
            yield Segment(gpu=g, start=s, end=e, activity=a, pipeline_id=pid, stage=stage)


@dataclass(frozen=True, kw_only=True)
class PipelineMetrics:
    arrival_s: float
    finish_s: float
    jct_s: float
    steps: int
    trajectories: int
    step_latency_mean_s: float
    step_latency_p50_s: float
    step_latency_p99_s: float
    gpu_seconds_work: float
    gpu_seconds_used: float  # held, any activity (rlix.lending)
    gpu_seconds_lent: float  # of its home, held by other jobs while it was there
    gpu_seconds_borrowed: float  # held outside its home
    preemptions: int
    queue_delay_s: float  # arrival to the grant of its model load (the job's admission)
    tenant: str = ""  # the tenant it belongs to ("" for none)
    length_rank_correlation: float | None = None  # Spearman, predicted vs actual trajectory length (rlix.lengths)


@dataclass(frozen=True, kw_only=True)
class TenantMetrics:
    """A tenant's jobs together: GPU-seconds used, lent and borrowed (sums of its jobs')."""

    jobs: int
    gpu_seconds_used: float
    gpu_seconds_lent: float
    gpu_seconds_borrowed: float


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    policy: str
    gpus: int
    makespan_s: float
    makespan_lower_bound_s: float
    lower_bound_work_s: float
    lower_bound_critical_path_s: float
    gpu_utilization: float
    slot_utilization: float
    idle_fraction: float
    held_idle_fraction: float
    switch_overhead_fraction: float
    stranded_fraction: float
    held_while_waiting_gpu_s: float
    throughput_steps_per_hour: float
    trajectories_per_hour: float
    tasks_per_hour: float  # jobs finished per hour of makespan
    queue_delay_mean_s: float  # arrival to admission, mean over jobs
    queue_delay_p99_s: float
    steps_completed: int
    trajectories_completed: int
    preemptions: int
    trajectories_requeued: int
    trajectories_lost: int
    plans: int
    pipelines: dict[str, PipelineMetrics] = field(default_factory=dict)
    tenants: dict[str, TenantMetrics] = field(default_factory=dict)  # only where jobs name tenants

    def to_json(self) -> dict:
        out = asdict(self)
        out["pipelines"] = {k: asdict(v) for k, v in sorted(self.pipelines.items())}
        out["tenants"] = {k: asdict(v) for k, v in sorted(self.tenants.items())}
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass(kw_only=True)
class PipelineTally:
    """Counts a shell keeps per pipeline while it runs."""

    arrival_s: float
    admitted_s: float | None = None  # when its model load was granted (None: at arrival)
    finish_s: float | None = None
    step_latencies: list[float] = field(default_factory=list)
    trajectories: int = 0
    preemptions: int = 0
    tenant: str = ""
    length_rank_correlation: float | None = None  # None: its trajectories carry no prompt ids

    def to_metrics(self, usage: UsageRecorder, pipeline_id: str, end: float) -> PipelineMetrics:
        finish = self.finish_s if self.finish_s is not None else end
        lat = self.step_latencies
        return PipelineMetrics(
            arrival_s=self.arrival_s,
            finish_s=finish,
            jct_s=finish - self.arrival_s,
            steps=len(lat),
            trajectories=self.trajectories,
            step_latency_mean_s=statistics.fmean(lat) if lat else 0.0,
            step_latency_p50_s=percentile(lat, 50),
            step_latency_p99_s=percentile(lat, 99),
            gpu_seconds_work=usage.by_pipeline.get(pipeline_id, {}).get(Activity.WORK, 0.0),
            gpu_seconds_used=usage.homes.used.get(pipeline_id, 0.0),
            gpu_seconds_lent=usage.homes.lent.get(pipeline_id, 0.0),
            gpu_seconds_borrowed=usage.homes.borrowed.get(pipeline_id, 0.0),
            preemptions=self.preemptions,
            queue_delay_s=(self.arrival_s if self.admitted_s is None else self.admitted_s) - self.arrival_s,
            tenant=self.tenant,
            length_rank_correlation=self.length_rank_correlation,
        )


def summarize(
    *,
    policy: str,
    usage: UsageRecorder,
    start: float,
    end: float,
    tallies: dict[str, PipelineTally],
    lower_bound_work_s: float,
    lower_bound_critical_path_s: float,
    trajectories_requeued: int,
    trajectories_lost: int,
    plans: int,
) -> RunMetrics:
    """Fold a finished run into :class:`RunMetrics` (``usage`` must be closed at ``end``)."""
    makespan = max(end - start, 1e-12)
    capacity = usage.num_gpus * makespan
    t = usage.totals
    pipelines = {pid: tally.to_metrics(usage, pid, end) for pid, tally in sorted(tallies.items())}
    steps = sum(p.steps for p in pipelines.values())
    trajectories = sum(p.trajectories for p in pipelines.values())
    delays = [p.queue_delay_s for p in pipelines.values()]
    return RunMetrics(
        policy=policy,
        gpus=usage.num_gpus,
        makespan_s=makespan,
        makespan_lower_bound_s=max(lower_bound_work_s, lower_bound_critical_path_s),
        lower_bound_work_s=lower_bound_work_s,
        lower_bound_critical_path_s=lower_bound_critical_path_s,
        gpu_utilization=t[Activity.WORK] / capacity,
        slot_utilization=usage.slot_work / capacity,
        idle_fraction=t[Activity.FREE] / capacity,
        held_idle_fraction=t[Activity.HELD] / capacity,
        switch_overhead_fraction=t[Activity.SWITCH] / capacity,
        stranded_fraction=usage.stranded / capacity,
        held_while_waiting_gpu_s=usage.held_while_waiting,
        throughput_steps_per_hour=steps * 3600.0 / makespan,
        trajectories_per_hour=trajectories * 3600.0 / makespan,
        tasks_per_hour=sum(1 for t in tallies.values() if t.finish_s is not None) * 3600.0 / makespan,
        queue_delay_mean_s=statistics.fmean(delays) if delays else 0.0,
        queue_delay_p99_s=percentile(delays, 99),
        steps_completed=steps,
        trajectories_completed=trajectories,
        preemptions=sum(p.preemptions for p in pipelines.values()),
        trajectories_requeued=trajectories_requeued,
        trajectories_lost=trajectories_lost,
        plans=plans,
        pipelines=pipelines,
        tenants=tenant_totals(pipelines),
    )


def tenant_totals(pipelines: dict[str, PipelineMetrics]) -> dict[str, TenantMetrics]:
    """Per tenant named by some job, its jobs' GPU-seconds summed (in pipeline-id order)."""
    out: dict[str, TenantMetrics] = {}
    for name in sorted({p.tenant for p in pipelines.values() if p.tenant}):
        mine = [p for _, p in sorted(pipelines.items()) if p.tenant == name]
        out[name] = TenantMetrics(
            jobs=len(mine),
            gpu_seconds_used=sum(p.gpu_seconds_used for p in mine),
            gpu_seconds_lent=sum(p.gpu_seconds_lent for p in mine),
            gpu_seconds_borrowed=sum(p.gpu_seconds_borrowed for p in mine),
        )
    return out
