"""Core layer: what the scheduler remembers between plans.

Plain containers owned by :class:`rlix.core.Scheduler`; policies read them
through :class:`View` and write only to a :class:`rlix.core.ledger.Draft`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

from rlix.core.ledger import Ledger
from rlix.core.lifecycle import PipelineState, RequestState
from rlix.core.types import ClusterSpec, Gpus, Grant, PipelineSpec, ReportDemand, SchedulerConfig, Stage


def worker_loads(spec: PipelineSpec, report: ReportDemand) -> dict[int, int]:
    """Running trajectories per worker (first GPU) of ``report``, at most the slots a worker has."""
    return {load.first_gpu: min(load.active, spec.slots_per_worker) for load in report.loads}


SLOWDOWN_DAMP_S = 60.0  # seconds added to both sides of a slowdown (PipelineEntry.slowdown)


@dataclass(kw_only=True)
class GangTimes:
    """What the scheduler measures of a pipeline's gang stages, from its own grants and releases: how
    long each stage last held its GPUs, and how soon, at the soonest, it asked for a gang stage again
    after releasing each stage with none left (after the last stage of a step: its rollout)."""

    stage_s: dict[Stage, float] = field(default_factory=dict)
    granted_at: dict[Stage, float] = field(default_factory=dict)
    gap_after: dict[Stage, float] = field(default_factory=dict)
    working_s: float = 0.0  # seconds it held one gang stage or more other than its model load, up to work_since
    work_since: float | None = None  # since when it holds such a stage (None: it holds none)
    free_since: float | None = None  # holds no gang stage since then (None: it holds one, or never released one)
    last: Stage | None = None  # the stage it released then

    def granted(self, stage: Stage, now: float) -> None:
        self.granted_at[stage] = now
        self.free_since = None
        if stage is not Stage.INIT and self.work_since is None:
            self.work_since = now

    def released(self, stage: Stage, now: float, *, holds_another: bool) -> None:
        start = self.granted_at.pop(stage, None)
        if start is not None:
            self.stage_s[stage] = now - start
        if self.work_since is not None and all(s is Stage.INIT for s in self.granted_at):
            self.working_s += now - self.work_since
            self.work_since = None
        if not holds_another:
            self.free_since, self.last = now, stage

    def requested(self, now: float) -> None:
        if self.free_since is not None and self.last is not None:
            gap = now - self.free_since
            self.gap_after[self.last] = min(gap, self.gap_after.get(self.last, gap))

    def working(self, now: float) -> float:
        """Seconds it has held one gang stage or more other than its model load, until ``now``
        (stages held at once count once)."""
        return self.working_s + (now - self.work_since if self.work_since is not None else 0.0)

    def rollout_s(self) -> float | None:
        """How long it should go at the least before asking for a gang stage again, now that it holds
        none (None: it holds one, or nothing is measured yet): the shorter of the shortest stretch
        measured after the stage it last released and its first rollout (after the model load), which
        stands in for the first while a step's last stage has never been followed by a rollout."""
        if self.free_since is None or self.last is None:
            return None
        known = [g for g in (self.gap_after.get(self.last), self.gap_after.get(Stage.INIT)) if g is not None]
        return min(known, default=None)


@dataclass(kw_only=True)
class PipelineEntry:
    spec: PipelineSpec
    order: int  # registration sequence number: the tie-breaker between pipelines
    rollout_bundles: tuple[Gpus, ...]  # where the policy lets its rollout workers go
    bundle_of: dict[int, Gpus]  # GPU -> the candidate bundle containing it
    bundle_rank: dict[Gpus, int]  # candidate bundle -> preference (lower first)
    home_workers: int = 0  # candidate bundles inside the pipeline's home GPUs
    state: PipelineState = PipelineState.ACTIVE
    admitted: bool = False  # it was granted GPUs (its INIT, or any stage or worker): its home is taken
    admitted_at: float = float("inf")  # when it was admitted: the first admitted owns a shared home
    registered_at: float = float("-inf")  # when it registered (-inf: unknown, as after a rejoin: it has no lead)
    lending: bool = False  # it lends its home guarantee this round, being far enough ahead of its static pace (lends)
    demand: ReportDemand | None = None
    reported_at: float = float("-inf")
    empty_since: float | None = None  # since when its reports have named no trajectory queued or running (None: some)
    # The last rollout need computed from ``demand`` (rebuilt only when a new report arrives):
    # an object of rlix.core.shares, typed loosely here to keep this module below it.
    need_cache: object = None
    cooling: dict[Gpus, float] = field(default_factory=dict)  # bundle -> until when no worker goes there (lost one)
    starting: frozenset[Gpus] = frozenset()  # bundles whose worker process is still starting: no worker goes there
    wanting_since: float = float("inf")  # since when it has had trajectories waiting and no rollout worker
    # The worker (first GPU) it got after starving, its finished count and the time then: no
    # rebalance takes that worker while busy until the job has finished a trajectory more, or
    # turn_limit_s has passed (its turn).
    turn: int | None = None
    turn_mark: int = 0
    turn_since: float = 0.0
    # The finished count its open batches end at, as the scheduler credits them (see credit_batches),
    # and whether it released a gang stage since that count was set (a new batch may open then).
    credit_end: int | None = None
    released: bool = False
    finished: int = 0  # the highest finished count it has reported: finished trajectories do not come back
    path_max: float = 0.0  # the longest chain of steps ahead it has reported (path_s): its time alone, at the least
    gang_times: GangTimes = field(default_factory=GangTimes)  # how long its gang stages and rollouts take

    @classmethod
    def joining(
        cls, spec: PipelineSpec, *, order: int, rollout_bundles: tuple[Gpus, ...], registered_at: float = float("-inf")
    ) -> PipelineEntry:
        """The entry of a pipeline that joins now, its rollout workers allowed on ``rollout_bundles``."""
        home = set(spec.home_gpus)
        return cls(
            spec=spec,
            order=order,
            rollout_bundles=rollout_bundles,
            bundle_of={g: b for b in rollout_bundles for g in b},
            bundle_rank={b: i for i, b in enumerate(rollout_bundles)},
            home_workers=sum(1 for b in rollout_bundles if home.issuperset(b)),
            registered_at=registered_at,
        )

    def cool(self, bundle: Gpus, until: float) -> None:
        """No rollout worker on ``bundle`` until ``until`` (its last one was lost): it leaves the candidates."""
        self.cooling[bundle] = until
        for g in bundle:
            self.bundle_of.pop(g, None)

    def warm_up(self, now: float) -> bool:
        """Bundles whose cooldown is over are candidates again; whether some still cool."""
        for bundle in [b for b, until in self.cooling.items() if until <= now]:
            del self.cooling[bundle]
            self._readmit(bundle)
        return bool(self.cooling)

    def set_starting(self, bundles: frozenset[Gpus]) -> None:
        """``bundles`` (its rollout bundles) have their worker process still starting: they leave the
        candidates until a report leaves them out."""
        if bundles == self.starting:
            return
        old, self.starting = self.starting, bundles
        for bundle in old - bundles:
            self._readmit(bundle)
        for bundle in bundles - old:
            for g in bundle:
                self.bundle_of.pop(g, None)

    def _readmit(self, bundle: Gpus) -> None:
        """``bundle`` is a candidate again, unless it still cools down or its process still starts."""
        if bundle not in self.cooling and bundle not in self.starting:
            self.bundle_of.update(dict.fromkeys(bundle, bundle))

    def is_candidate(self, bundle: Gpus) -> bool:
        """May a worker of this job go on ``bundle`` now (the policy allows it, not cooling, not starting)?"""
        return self.bundle_of.get(bundle[0]) == bundle

    def note_wanting(self, now: float, held: Collection[int], config: SchedulerConfig) -> None:
        """After a plan: start (or stop) the clock of waiting for a first rollout worker, and
        start (or end) the turn of a worker given after a wait of ``min_residency_s`` or more.

        ``held`` are the first GPUs of its rollout workers now. Turns are what make starving
        jobs that cannot all hold a worker at once progress: each keeps its worker until it
        has finished a trajectory (work a preemption would throw away is not lost in a loop),
        or ``turn_limit_s`` has passed (a job that never finishes one holds no one up for ever).
        """
        if self.turn is not None and (self.turn not in held or not self.in_turn(self.turn, now, config)):
            self.turn = None
        if held and self.turn is None and now - self.wanting_since >= config.min_residency_s:
            self.turn, self.turn_mark, self.turn_since = min(held), self._finished, now
        wants = self.demand is not None and self.demand.pending > 0
        if wants and not held:
            self.wanting_since = min(self.wanting_since, now)
        else:
            self.wanting_since = float("inf")

    def in_turn(self, first_gpu: int, now: float, config: SchedulerConfig) -> bool:
        """Is the worker on ``first_gpu`` this job's turn still (see :meth:`note_wanting`)?"""
        return self.turn == first_gpu and self._finished <= self.turn_mark and now - self.turn_since < config.turn_limit_s

    @property
    def _finished(self) -> int:
        return self.demand.finished if self.demand is not None else 0

    def lead_s(self, now: float) -> float:
        """Seconds the job is ahead of its own ``static`` pace, counted at the least.

        ``static`` runs its model load first, then its gang stages and its rollout by turns
        (never together), the rollout on its ``h`` home workers of ``slots`` each. So doing
        what the job has done (``W`` trajectory-seconds finished, ``G`` seconds holding gang
        stages) takes ``static`` at least ``init + G + W / (h x slots)`` from its arrival;
        the lead is that less the time since it registered. A job that reports less progress
        than it made only keeps its guarantee; one not measured (no report, no home of its
        own, rejoined after a scheduler restart) has no lead.
        """
        report = self.demand
        if report is None or not self.home_workers:
            return float("-inf")
        times = self.gang_times
        rollout = report.finished * report.trajectory_s / (self.home_workers * self.spec.slots_per_worker)
        return self.registered_at + times.stage_s.get(Stage.INIT, 0.0) + times.working(now) + rollout - now

    @property
    def slowdown_measured(self) -> bool:
        """Has it reported a chain of steps since it registered (else :meth:`slowdown` is 1.0, unmeasured)?"""
        return self.demand is not None and self.path_max > 0 and self.registered_at != float("-inf")

    def slowdown(self, now: float) -> float:
        """Its projected slowdown (finish-time fairness): the seconds since it registered plus its chain of
        steps still ahead (``path_s``, reported), over its model load plus the longest chain it has
        reported (its time alone, at the least), both plus ``SLOWDOWN_DAMP_S``. 1.0 until it reports a chain."""
        if not self.slowdown_measured:
            return 1.0
        report = self.demand
        init = self.gang_times.stage_s.get(Stage.INIT, 0.0)
        return (now - self.registered_at + report.path_s + SLOWDOWN_DAMP_S) / (init + self.path_max + SLOWDOWN_DAMP_S)

    def lends(self, now: float, config: SchedulerConfig) -> bool:
        """Does it lend its home guarantee now? From ``2 x lend_ahead_s`` of lead (``lead_s``) on,
        until the lead is back to ``lend_ahead_s`` (the gap keeps it from lending and taking back by turns)."""
        if not config.lend_ahead_s:
            return False
        return self.lead_s(now) > config.lend_ahead_s * (1.0 if self.lending else 2.0)

    def admit(self, now: float) -> None:
        """It holds GPUs from ``now`` on (if not already): its home is taken."""
        if not self.admitted:
            self.admitted = True
            self.admitted_at = now

    def record_demand(self, report: ReportDemand, now: float, placed: ReportDemand | None = None) -> None:
        """Keep ``report`` (already checked) as the pipeline's demand, received at ``now``; ``placed``: the same
        with only the loads on workers the job holds, which the split weighs (the batch credit counts every
        running trajectory, a worker's shrunk as the report was sent included, up to ``open_limit``). A
        finished count below one reported before is read as that one (a lower count would widen its credit)."""
        if report.finished < self.finished:
            report = replace(report, finished=self.finished)
            placed = placed and replace(placed, finished=self.finished)
        self.finished = report.finished
        self.demand = placed or report
        self.reported_at = now
        self.path_max = max(self.path_max, report.path_s)
        if report.pending or any(load.active for load in report.loads):
            self.empty_since = None
        elif self.empty_since is None:
            self.empty_since = now
        if report.starting or self.starting:
            self.set_starting(frozenset(b for b in self.rollout_bundles if b[0] in report.starting))
        self.credit_batches(report, opening=self.released, placed=placed)
        self.released = False

    def note_release(self) -> None:
        """It released a gang stage: a batch may open now, announced in the report it already
        sent (a shell may report just before releasing) or in the next one."""
        self.released = True
        if self.demand is not None:
            self.credit_batches(self.demand, opening=True)
            self.need_cache = None  # the same report now weighs its new credit

    def credit_batches(self, report: ReportDemand, *, opening: bool, placed: ReportDemand | None = None) -> None:
        """Set the finished count at which the job's open batches end, as far as the scheduler can check.

        Within a batch, finished + queued + running stays the same for an honest job: each
        trajectory moves from queued to running to finished. The count rises only when a
        batch opens, which for a job that declares ``batch_credit`` happens once the batches
        credited before have all finished, or after it released a gang stage (``opening``).
        Only then does the scheduler credit a new count (up to the declared ``open_limit``);
        in between, a report of more queued trajectories than the credited count leaves
        gains nothing. Undeclared: no credit kept. Every running trajectory the report lists counts
        (a worker's shrunk as it was sent, too); past ``open_limit`` only those on workers the job
        holds (``placed``) do.
        """
        if not (self.spec.open_limit and self.spec.batch_credit):
            return
        running = sum(worker_loads(self.spec, report).values())
        held = sum(worker_loads(self.spec, placed or report).values())  # past open_limit, only what its workers run
        if opening or self.credit_end is None or self.credit_end <= report.finished:
            self.credit_end = report.finished + min(report.pending + running, max(self.spec.open_limit, held))


@dataclass(kw_only=True)
class GangRequest:
    pipeline_id: str
    stage: Stage
    gpus: Gpus
    seq: int  # arrival sequence number: FIFO among equal priorities
    job_priority: int = 0  # the pipeline's priority: higher goes first
    state: RequestState = RequestState.PENDING
    passed: int = 0  # plans that granted another job's stage on its GPUs while it waited (its age)
    asked_at: float = 0.0  # when it was asked for (s)

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        """Higher job priority first, then the request passed over most often (aging: no job's stage waits
        behind another job's stages twice in a row), then the stage's priority, then arrival (unique)."""
        return (-self.job_priority, -self.passed, self.stage.priority, self.seq)

    def note_passed(self, grants: Iterable[Grant]) -> None:
        """Count a plan that granted another job's stage overlapping this request's GPUs while it waited; one
        that granted its own job a stage there starts the count again (its job had its turn on them). A
        model load is admission, which stays first come, first served: it does not age."""
        mine = set(self.gpus)
        there = [g.pipeline_id for g in grants if mine.intersection(g.gpus)]
        if self.pipeline_id in there:
            self.passed = 0
        if self.stage is not Stage.INIT and any(pid != self.pipeline_id for pid in there):
            self.passed += 1


@dataclass(kw_only=True)
class View:
    """Read-only picture of the scheduler handed to a policy."""

    cluster: ClusterSpec
    config: SchedulerConfig
    ledger: Ledger
    now: float
    pipelines: dict[str, PipelineEntry] = field(default_factory=dict)
    pending: list[GangRequest] = field(default_factory=list)  # sorted by sort_key
    departed: list[str] = field(default_factory=list)  # unregistered since the last plan
    memo: dict[str, object] = field(default_factory=dict)  # results the passes may reuse while their inputs are the same objects

    def active(self) -> list[PipelineEntry]:
        """Active pipelines in registration order."""
        return sorted(
            (e for e in self.pipelines.values() if e.state is PipelineState.ACTIVE),
            key=lambda e: e.order,
        )


def own_home(spec: PipelineSpec, others: Iterable[PipelineSpec]) -> Gpus:
    """The GPUs ``spec`` is guaranteed, given the other active jobs: its explicit ``home``; or, where it
    names none, the GPUs of its default home (:attr:`PipelineSpec.home_gpus`) that no
    other job's home or gang mappings cover. Jobs whose mappings overlap are co-tenants: they
    time-share those GPUs, and none of them owns them."""
    if spec.home:
        return spec.home
    shared = {g for o in others for g in (*o.home_gpus, *o.init_gpus)}
    return tuple(g for g in spec.home_gpus if g not in shared)


def homeless(view: View) -> frozenset[str]:
    """Active jobs with no home of their own (:func:`own_home` empty): co-tenants of others on every
    GPU they may train on, whose fairness is a shared slowdown rather than a guarantee."""
    key = tuple(e.order for e in view.pipelines.values() if e.state is PipelineState.ACTIVE)
    memo = view.memo.get("homeless")
    if isinstance(memo, tuple) and memo[0] == key:
        return memo[1]
    active = view.active()
    out = frozenset(e.spec.pipeline_id for e in active if not own_home(e.spec, (o.spec for o in active if o is not e)))
    view.memo["homeless"] = (key, out)
    return out
