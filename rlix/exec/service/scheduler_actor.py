"""Executor layer: the scheduler actor, a thin Ray shell around :mod:`rlix.core`.

It owns the one :class:`rlix.core.Scheduler`, turns calls from pipeline
coordinators into core events, re-plans after every event (and every
``plan_interval_s``, a knob of the config's scheduler block, for demand,
TTLs and residency), and carries each plan out: shrinks (awaited, so GPUs
are really free), then grants (the waiting ``request`` calls return), then
expands. It makes no decision of its own.

The lock guards only the core (submit + plan, no awaits inside). Plans are
carried out outside it, in order per GPU (:class:`~rlix.exec.control.gpu_order.GpuOrder`):
an action waits only for earlier actions on its own GPUs, so a slow shrink
(a worker finishing its wake) on some GPUs never delays a grant or an expand
on others, nor other pipelines' requests and reports, while a grant never
starts before the shrinks that free its GPUs. Every call to a coordinator has
a deadline; a coordinator that cannot be reached in time is treated as gone:
its pipeline is unregistered and the others carry on.

Carrying plans out is :class:`~rlix.exec.service.plan_execution.PlanExecution`.
The same actor, named and detached, is the cluster's shared scheduler
service; its service calls (claims, status, cancel, rejoining after a
restart) are :class:`rlix.exec.service.calls.ServiceCalls`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from rlix import protocol
from rlix.core import (
    ClusterSpec,
    PipelineSpec,
    Register,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    Stage,
    Unregister,
    WorkerLost,
)
from rlix.exec.control.gpu_order import GpuOrder
from rlix.exec.service.calls import TOTALS_KEY, ServiceCalls, kill_actor
from rlix.exec.service.history import History
from rlix.exec.service.jobs import JobLedger, job_number
from rlix.exec.service.plan_execution import PlanExecution
from rlix.exec.service.prom import Metrics
from rlix.exec.service.roster import Roster, kept
from rlix.exec.service.status import cluster_status
from rlix.exec.service.usage import ClusterUsage
from rlix.exec.service.web import Web
from rlix.protocol import GpuMap, GrantReply, SchedulerStats


def in_actor() -> bool:
    """Whether this code runs in a Ray actor (asked without starting Ray, as ``get_runtime_context`` would)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def reserve_gpus(cluster: ClusterSpec, names: str | None) -> tuple[GpuMap, str]:
    """The service's GPU reservation (:func:`rlix.exec.control.gpu_reservation.reserve`), and why it failed ("": it did not)."""
    if names is None or not in_actor():
        return GpuMap(), ""
    from rlix.exec.control.gpu_reservation import reserve
    from rlix.transport import ClusterError

    try:
        return reserve(cluster, names=names), ""
    except ClusterError as exc:
        return GpuMap(), str(exc)


def restarts_so_far() -> int:
    """How many times Ray restarted this actor (0 outside an actor, or on its first life)."""
    if not in_actor() or not ray.get_runtime_context().was_current_actor_reconstructed:
        return 0
    actor = ray.get_runtime_context().get_actor_id()
    try:  # the count is in the GCS actor table (read directly: no dashboard needed)
        from ray._private.state import actors

        return int(actors(actor_id=actor).get("NumRestarts", 1))
    except Exception:  # noqa: BLE001 -- restarted at least once, count unknown
        return 1


class WaitingWork:
    """When some pipeline had trajectories queued, from the demand reports: the times it starts and
    stops being so (what the outputs' ``stranded_fraction`` is measured against)."""

    def __init__(self) -> None:
        self.pending: dict[str, int] = {}  # last reported queued trajectories per pipeline
        self.changes: list[tuple[float, bool]] = []  # (seconds, some pipeline has trajectories queued)

    def note(self, pipeline_id: str, pending: int, now: float) -> None:
        self.pending[pipeline_id] = pending
        waiting = any(n > 0 for n in self.pending.values())
        if not self.changes or self.changes[-1][1] != waiting:
            self.changes.append((now, waiting))


def held_gpus(owner) -> dict[str, tuple[int, ...]]:
    """GPUs each pipeline holds, from the ledger's owner per GPU (None: free)."""
    out: dict[str, list[int]] = {}
    for g, holder in enumerate(owner):
        if holder is not None:
            out.setdefault(holder.pipeline_id, []).append(g)
    return {k: tuple(v) for k, v in sorted(out.items())}


def fail_waiting(waiting: dict, pipeline_id: str) -> None:
    """The stage requests ``pipeline_id`` still waits on fail: it was unregistered meanwhile."""
    for key in [k for k in waiting if k[0] == pipeline_id]:
        fut, _ = waiting.pop(key)
        if not fut.done():
            fut.set_exception(SchedulingError(f"pipeline '{pipeline_id}' was unregistered while waiting"))


@ray.remote(num_cpus=0, max_concurrency=1000)
class SchedulerActor(ServiceCalls, PlanExecution):
    def __init__(
        self,
        cluster: ClusterSpec,
        policy: str,
        config: SchedulerConfig,
        t0: float,
        plan_interval_s: float,
        call_timeout_s: float = 300.0,
        lease_s: float = 15.0,
        rejoin_s: float = 30.0,
        gpu_names: str | None = None,
        metrics_port: int | None = None,
        history: str | None = None,
        pages: bool = False,
    ) -> None:
        self.core = Scheduler(cluster, policy=policy, config=config)
        # The service reserves the cluster's GPUs in Ray under ``gpu_names`` (found again after a restart)
        # for every submitter; a private run's driver reserves its own (None here).
        self.gpus, self.gpus_error = reserve_gpus(cluster, gpu_names)
        self.t0 = t0  # wall-clock epoch of the run (time.time() seconds)
        self.plan_interval_s = plan_interval_s  # seconds between periodic plans (config scheduler.plan_interval_s)
        self.coordinators: dict[str, ray.actor.ActorHandle] = {}
        self.waiting: dict[tuple[str, Stage], tuple[asyncio.Future, float]] = {}
        self.lock = asyncio.Lock()
        self.plan_s = 0.0
        self.counts = {"shrinks": 0, "expands": 0, "grants": 0}
        self.errors: list[str] = []
        self.specs: dict[str, PipelineSpec] = {}  # each pipeline's latest registered topology, by name
        self.waiting_work = WaitingWork()  # when some pipeline had trajectories queued (stranded_fraction)
        self.ticker: asyncio.Task | None = None
        self.call_timeout_s = call_timeout_s  # deadline of a shrink/expand call to a coordinator
        self.order = GpuOrder(on_error=self._bug)  # plans' actions in order per GPU; every background task
        self.gone: set[str] = set()  # pipelines this scheduler unregistered (they must not rejoin)
        self.demands: dict[str, ReportDemand] = {}  # each pipeline's latest demand report
        # Restarted by Ray: its pipelines rejoin with what they hold; no plan until they have (rejoin_s at most).
        self.restarts = restarts_so_far()
        restarted, self.persist = self.restarts > 0, in_actor()
        self.history = History(history) if history else None  # the jobs that ended, in SQLite (None: not kept)
        self.in_history = self.history.written() if self.history is not None else set()  # ids written there
        counted = max((job_number(i) for i in self.in_history), default=0)  # ids go on above the history's
        self.jobs = JobLedger(lease_s, persist=self.persist, restarted=restarted, counted=counted, now=self.now())
        self.roster = Roster(restarted=restarted, persist=self.persist, now=self.now(), max_wait_s=rejoin_s)
        totals = (kept(TOTALS_KEY) if restarted and self.persist else None) or {}  # what the previous life counted
        # GPU-seconds per job id and the timeline; a restarted service's go on from its previous life's
        self.usage = ClusterUsage(cluster.num_gpus, start=0.0 if restarted else self.now(), totals=totals.get("usage"))
        self.metrics = Metrics(totals.get("preemptions"))  # counted for Prometheus beside the status
        self.metrics_port = metrics_port  # where the service serves /metrics and /status (None: a free port)
        self.web = Web(metrics_port or 0) if pages else None  # its HTTP pages (the shared service's)
        self.life = uuid.uuid4().hex  # clients compare it to tell a restart from a lost call
        self.began = self.now()  # when this life began (its timeline starts there)
        self._routes = self._route_table()  # each request type of the protocol, and the call that answers it

    def now(self) -> float:
        return time.time() - self.t0

    # ------------------------------------------------------------ the protocol

    async def handle(self, request: protocol.Request, version: int):
        """The one call clients make (:mod:`rlix.protocol`): the reply to ``request``, or its typed error."""
        protocol.check_version(version)
        try:
            route = self._routes[type(request)]
        except KeyError:
            raise TypeError(f"not a request of rlix protocol {protocol.PROTOCOL_VERSION}: {type(request).__name__}") from None
        return await route(request)

    def _route_table(self) -> dict[type, Callable[[Any], Awaitable]]:
        """Each request type, and the call that answers it."""
        p = protocol
        return {
            p.Register: lambda r: self.register(r.spec, r.endpoint, r.submitter, r.user),
            p.RejoinPipeline: lambda r: self.rejoin(r.event, r.endpoint, r.user),
            p.RequestGang: lambda r: self.request(r.pipeline_id, r.stage, r.role, r.after),
            p.ReleaseGang: lambda r: self.release(r.pipeline_id, r.stage, r.demand),
            p.Report: lambda r: self.report(r.demand),
            p.Lost: lambda r: self.lost(r.event),
            p.Note: lambda r: self.note(r.note),
            p.Unregister: lambda r: self.unregister(r.pipeline_id, r.status, r.error),
            p.Alive: lambda r: self.alive(r.pipeline_id),
            p.Knows: lambda r: self.knows(r.pipeline_id),
            p.RolloutBundles: lambda r: self.rollout_bundles(r.pipeline_id),
            p.AdmissionRefusal: lambda r: self.admission_refusal(r.pipeline_id),
            p.Info: lambda r: self.info(),
            p.Claim: lambda r: self.claim(r.submitter, r.jobs, r.user),
            p.Renew: lambda r: self.renew(r.submitter, r.jobs, r.user),
            p.Leave: lambda r: self.leave(r.submitter),
            p.Start: lambda r: self.start(),
            p.Status: lambda r: self.status(),
            p.Timeline: lambda r: self.timeline(),
            p.Cancel: lambda r: self.cancel(r.job, p.Stopped(by=r.by), force=r.force),
            p.CancelAll: lambda r: self.cancel_all(r.by),
            p.KillAll: lambda r: self.kill_all(),
            p.Busy: lambda r: self.busy(),
            p.Stats: lambda r: self.stats(),
            p.Holdings: lambda r: self.holdings(),
            p.Stop: lambda r: self.stop(),
            p.JobHistory: lambda r: self.job_history(r.user, r.since),
            p.ReadLog: lambda r: self.read_log(r.job, r.offset),
        }

    # ------------------------------------------------------------ the calls

    async def start(self) -> None:
        """Start planning, and serving metrics (:class:`SchedulingError` if the service could not reserve its
        GPUs, or its metrics port is taken)."""
        if self.gpus_error:
            raise SchedulingError(self.gpus_error)
        self._start_loops()
        await self._serve_metrics()

    def _start_loops(self) -> None:
        """The periodic plan, the liveness watch and the metrics (a restarted actor starts them on its first event)."""
        if self.ticker is None:
            self.ticker = self.order.spawn(self._tick())
            self.order.spawn(self._watch())
            self.order.spawn(self._serve_metrics())

    async def _serve_metrics(self) -> None:
        """Serve ``/metrics`` and ``/status`` (once; nothing for a private run's scheduler)."""
        if self.web is None:
            return
        pages = {"/metrics": self._metrics_page, "/status": self._status_page}
        try:
            await self.web.start(pages)
        except (OSError, OverflowError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise SchedulingError(f"--metrics-port {self.metrics_port}: {why}; pick a free port") from None

    def _metrics_page(self) -> tuple[str, str]:
        now = self.now()
        self._account()
        page = self.metrics.text(cluster_status(self, now))
        self._keep_totals(now)  # what this scrape read is where a restarted service goes on from
        return "text/plain; version=0.0.4", page

    def _status_page(self) -> tuple[str, str]:
        self._account()
        return "application/json", json.dumps(dataclasses.asdict(cluster_status(self, self.now())))

    async def register(self, spec: PipelineSpec, coordinator, submitter: str = "", user: str = "") -> None:
        """Register a pipeline and its endpoint actor. ``submitter``: the ``rlix-run`` that claimed the
        job's name ("" for a pipeline that claimed none; a name someone else claimed is refused)."""
        await self._rejoin_window()
        record = self.jobs.registering(spec.pipeline_id, submitter, user, spec.priority, self.now())
        try:
            await self._event(Register(spec=spec))
        except SchedulingError as exc:  # refused by the core: the job this call queued ends, saying why
            if spec.pipeline_id not in self.core.pipelines() and self.jobs.active(spec.pipeline_id) is record:
                self.jobs.end(spec.pipeline_id, "failed", str(exc), self.now())
            raise
        self.gone.discard(spec.pipeline_id)  # a name may run again once its job ended
        self._joined(spec, coordinator)

    async def unregister(self, pipeline_id: str, status: str = "failed", error: str = "") -> None:
        self.jobs.end(pipeline_id, status, error, self.now())
        endpoint = self.coordinators.get(pipeline_id)
        try:
            done = await self._event(Unregister(pipeline_id=pipeline_id))
        except SchedulingError:
            return  # already gone (idempotent: a killed job may be unregistered twice, concurrently too)
        self.gone.add(pipeline_id)
        if done is not None:  # its workers are shrunk (or found gone) before it is forgotten
            await asyncio.wait([done], timeout=self.call_timeout_s)
        if self.coordinators.get(pipeline_id) is endpoint:  # not a new run of the same name registered meanwhile
            self._forget(pipeline_id)

    async def request(self, pipeline_id: str, stage: Stage, role: Role | None = None, after: Stage | None = None) -> GrantReply:
        """Ask for a gang stage; returns once the plan grants it.

        ``after``: a stage the pipeline holds, released in the same plan (a
        hand-over between two stages of one step: its GPUs are never lent to
        another pipeline in between, as in the simulator, where both events
        happen at one instant).
        """
        self._known(pipeline_id)
        fut = asyncio.get_running_loop().create_future()
        key = (pipeline_id, stage)
        self.waiting[key] = (fut, self.now())
        handed = (ReleaseStage(pipeline_id=pipeline_id, stage=after),) if after is not None else ()
        try:
            await self._event(*handed, RequestStage(pipeline_id=pipeline_id, stage=stage, role=role))
        except SchedulingError:
            self.waiting.pop(key, None)
            raise
        return await fut

    async def release(self, pipeline_id: str, stage: Stage, report: ReportDemand | None = None) -> None:
        """Release a gang stage; ``report``: the pipeline's demand from now on, planned with the
        release (the rollout batch its training opens: the GPUs are not lent out in between)."""
        self._known(pipeline_id)
        if report is None:
            await self._event(ReleaseStage(pipeline_id=pipeline_id, stage=stage))
            return
        await self._event(report, ReleaseStage(pipeline_id=pipeline_id, stage=stage))
        self._demand(report)

    async def report(self, report: ReportDemand) -> None:
        self._known(report.pipeline_id)
        await self._event(report)
        self._demand(report)

    def _demand(self, report: ReportDemand) -> None:
        self.demands[report.pipeline_id] = report
        self.waiting_work.note(report.pipeline_id, report.pending, self.now())

    async def lost(self, event: WorkerLost) -> None:
        """A pipeline's rollout worker is gone (died, or killed for not waking): its GPUs are free."""
        self._known(event.pipeline_id)
        try:
            await self._event(event)
        except SchedulingError:
            pass  # a plan already shrank it (or the pipeline left): nothing to give back

    async def rollout_bundles(self, pipeline_id: str) -> tuple[tuple[int, ...], ...]:
        """Bundles the policy may ever give this pipeline's rollout workers (to pre-start them)."""
        self._known(pipeline_id)
        return self.core.rollout_bundles(pipeline_id)

    async def stats(self) -> SchedulerStats:
        return SchedulerStats(
            plans=self.core.plans_made,
            plan_s=self.plan_s,
            unmet=tuple(self.waiting_work.changes),
            errors=tuple(self.errors),
            **self.counts,
        )

    async def admission_refusal(self, pipeline_id: str) -> str | None:
        """Why the pipeline's model load waits for its queues (one line), or None: see the core's own."""
        return self.core.admission_refusal(pipeline_id)

    async def holdings(self) -> dict[str, tuple[int, ...]]:
        """GPUs each pipeline holds now (rollout workers and gang stages), for tests and the console."""
        return held_gpus(self.core.ledger.owner)

    async def stop(self) -> None:
        self.order.cancel()  # the ticker, queued and running plan actions, pending unregisters
        if self.web is not None:
            self.web.close()

    # ------------------------------------------------------------ planning

    async def _event(self, *events) -> asyncio.Future | None:
        """Submit the events and plan once; returns a future done once that plan is carried out (None: nothing to do)."""
        self._start_loops()
        async with self.lock:  # no await inside: the core is pure and fast
            now = self.now()
            try:
                for event in events:
                    self.core.submit(event, now)
            finally:  # a refused event still leaves the ones before it planned
                done = self._plan()
                self._account()
            return done

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.plan_interval_s)
            async with self.lock:
                try:
                    self._plan()
                    self._account()
                except Exception as exc:  # noqa: BLE001 -- recorded; the next tick plans again
                    self._bug(exc)

    async def _unreachable(self, pipeline_id: str) -> None:
        """A coordinator missed a shrink: it is killed (with the processes it owns) and its pipeline
        unregistered, and the others are planned again."""
        endpoint = self.coordinators.get(pipeline_id)
        if endpoint is not None:
            kill_actor(endpoint)
        async with self.lock:
            self._forget(pipeline_id)
            if pipeline_id in self.core.pipelines():
                self.gone.add(pipeline_id)
                self.jobs.end(pipeline_id, "failed", "unreachable", self.now())
                self.errors.append(f"pipeline '{pipeline_id}' unreachable; unregistered")
                self.core.submit(Unregister(pipeline_id=pipeline_id), self.now())
            self._plan()
            self._account()

    def _forget(self, pipeline_id: str) -> None:
        """What this shell keeps of a pipeline that left: its endpoint, waiting requests, demand and home."""
        self.coordinators.pop(pipeline_id, None)
        fail_waiting(self.waiting, pipeline_id)
        self.waiting_work.note(pipeline_id, 0, self.now())
        self.demands.pop(pipeline_id, None)
        self.usage.set_home(self.now(), self.jobs.id_of(pipeline_id), ())
        self.roster.left(pipeline_id)

    def _bug(self, exc: BaseException) -> None:
        self.errors.append(f"plan execution failed: {type(exc).__name__}: {exc}")
