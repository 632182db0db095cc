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

The same actor, named and detached, is the cluster's shared scheduler
service: job names claimed per submitter under a lease, ``rlix cancel``, and
what keeps a shared cluster whole when a party disappears (submitters whose
lease runs out and pipelines whose endpoint no longer answers are
unregistered; a restarted scheduler waits for its pipelines to rejoin with
what they hold before it plans again, :class:`rlix.exec.service.roster.Roster`).
What the service records of its jobs (their records, usage, metrics,
history) is its books, :class:`rlix.exec.service.books.Books`, which the
actor writes to and ``rlix status`` reads.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from rlix import protocol
from rlix.core import (
    ClusterSpec,
    Expand,
    Grant,
    PipelineSpec,
    Register,
    Rejoin,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    Shrink,
    Stage,
    Unregister,
    WorkerLost,
)
from rlix.exec.control.gpu_order import GpuOrder
from rlix.exec.service.books import Books
from rlix.exec.service.endpoints import Endpoints, check_endpoint
from rlix.exec.service.history import KEEP_ENDED_S
from rlix.exec.service.jobs import Phase
from rlix.exec.service.roster import Roster
from rlix.exec.service.stage_requests import StageRequests
from rlix.exec.service.web import Web
from rlix.protocol import (
    CancelReply,
    ClusterStatus,
    GpuMap,
    GrantReply,
    HistoryRow,
    JobClaim,
    JobNote,
    LogChunk,
    Outcome,
    PipelineGone,
    PipelineUnknown,
    SchedulerStats,
    ServiceInfo,
    Stopped,
    TimelineReply,
)

LIVENESS_S = 2.0  # seconds between checks that every pipeline's endpoint answers
CANCEL_GRACE_S = 30.0  # a cancelled job still registered this long after its cancel is killed (s)
ERRORS_KEPT = 1000  # the scheduler's most recent errors, kept for its stats


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


@ray.remote(num_cpus=0, max_concurrency=1000)
class SchedulerActor:
    """The scheduler service: its calls, the plans made and carried out, and the pipelines' membership
    (endpoints, waiting requests, who left); what it records of its jobs is in ``self.books``."""

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
        keep_ended_s: float = KEEP_ENDED_S,
    ) -> None:
        self.core = Scheduler(cluster, policy=policy, config=config)
        # The service reserves the cluster's GPUs in Ray under ``gpu_names`` (found again after a restart)
        # for every submitter; a private run's driver reserves its own (None here).
        self.gpus, self.gpus_error = reserve_gpus(cluster, gpu_names)
        self.t0 = t0  # wall-clock epoch of the run (time.time() seconds)
        self.plan_interval_s = plan_interval_s  # seconds between periodic plans (config scheduler.plan_interval_s)
        self.errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        self.endpoints = Endpoints(call_timeout_s, self.errors)  # each pipeline's endpoint, and the calls made on them
        self.requests = StageRequests()  # gang-stage requests waiting for their grant
        self.lock = asyncio.Lock()
        self.plan_s = 0.0
        self.counts = {"shrinks": 0, "expands": 0, "grants": 0}
        self.waiting_work = WaitingWork()  # when some pipeline had trajectories queued (stranded_fraction)
        self.ticker: asyncio.Task | None = None
        self.order = GpuOrder(on_error=self._bug)  # plans' actions in order per GPU; every background task
        self.gone: set[str] = set()  # pipelines this scheduler unregistered (they must not rejoin)
        # Restarted by Ray: its pipelines rejoin with what they hold; no plan until they have (rejoin_s at most).
        restarts, persist = restarts_so_far(), in_actor()
        # What it records of its jobs: job records, usage, metrics, history (a restarted service's go on).
        self.books = Books(
            cluster.num_gpus,
            t0=t0,
            now=self.now(),
            restarts=restarts,
            persist=persist,
            lease_s=lease_s,
            history=history,
            keep_ended_s=keep_ended_s,
        )
        restarted = restarts > 0
        self.roster = Roster(restarted=restarted, persist=persist, now=self.now(), max_wait_s=rejoin_s)
        self.metrics_port = metrics_port  # where the service serves /metrics and /status (None: a free port)
        self.web = Web(metrics_port or 0) if pages else None  # its HTTP pages (the shared service's)
        self.life = uuid.uuid4().hex  # clients compare it to tell a restart from a lost call
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
        protocol.check_request(request)  # what it keeps must not break for every job later
        return await route(request)

    def _route_table(self) -> dict[type, Callable[[Any], Awaitable]]:
        """Each request type, and the call that answers it."""
        p = protocol
        return {
            p.Register: lambda r: self.register(r.spec, r.endpoint, r.submitter, r.user, r.endpoint_owns),
            p.RejoinPipeline: lambda r: self.rejoin(r.event, r.endpoint, r.user, r.endpoint_owns),
            p.RequestGang: lambda r: self.request(r.pipeline_id, r.stage, r.role, r.after),
            p.ReleaseGang: lambda r: self.release(r.pipeline_id, r.stage, r.demand),
            p.Report: lambda r: self.report(r.demand),
            p.Lost: lambda r: self.lost(r.event),
            p.Note: lambda r: self.note(r.note),
            p.Unregister: lambda r: self.unregister(r.pipeline_id, r.status, r.error, r.endpoint),
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

    # ------------------------------------------------------------ starting and stopping

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
        pages = {
            "/metrics": lambda: self.books.metrics_page(self.core, self.now()),
            "/status": lambda: self.books.status_page(self.core, self.now()),
        }
        try:
            await self.web.start(pages)
        except (OSError, OverflowError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise SchedulingError(f"--metrics-port {self.metrics_port}: {why}; pick a free port") from None

    async def stop(self) -> None:
        self.order.cancel()  # the ticker, queued and running plan actions, pending unregisters
        if self.web is not None:
            self.web.close()

    async def info(self) -> ServiceInfo:
        if self.gpus_error:  # a (restarted) service without its GPUs: nothing may be placed through it
            raise SchedulingError(f"the rlix scheduler has no GPU reservation: {self.gpus_error}")
        self._start_loops()
        c = self.core.cluster
        return ServiceInfo(
            nodes=c.nodes,
            gpus_per_node=c.gpus_per_node,
            policy=self.core.policy.name,
            started_at=self.t0,
            restarts=self.books.restarts,
            life=self.life,
            gpus=self.gpus,
        )

    # ------------------------------------------------------------ a pipeline's calls

    async def register(self, spec: PipelineSpec, coordinator, submitter: str = "", user: str = "", owns: bool = True) -> None:
        """Register a pipeline and its endpoint actor. ``submitter``: the ``rlix-run`` that claimed the
        job's name ("" for a pipeline that claimed none; a name someone else claimed is refused);
        ``owns``: killing the endpoint ends the pipeline's processes (:class:`rlix.protocol.Register`)."""
        check_endpoint(coordinator, spec.pipeline_id)
        await self._rejoin_window()
        jobs = self.books.jobs
        record = jobs.registering(spec.pipeline_id, submitter, user, spec.priority, self.now())
        try:
            await self._event(Register(spec=spec))
        except Exception as exc:  # refused by the core (or a bug): the job this call queued ends, saying why
            if spec.pipeline_id not in self.core.pipelines() and jobs.active(spec.pipeline_id) is record:
                jobs.end(spec.pipeline_id, Outcome.FAILED, str(exc), self.now())
            raise
        self.gone.discard(spec.pipeline_id)  # a name may run again once its job ended
        self._joined(spec, coordinator, owns)

    async def rejoin(self, event: Rejoin, endpoint, user: str = "", owns: bool = True) -> None:
        """A pipeline registered with this scheduler before its restart registers again with its holdings."""
        pid = event.spec.pipeline_id
        check_endpoint(endpoint, pid)
        if pid in self.core.pipelines():
            if self.endpoints.registered_by(pid, endpoint):
                return  # another of its calls rejoined first
            raise PipelineGone(f"pipeline '{pid}' is registered by another process now; stop this one")
        if event.admitted_at is None:  # when the previous life admitted it, as it kept it
            event = dataclasses.replace(event, admitted_at=self.roster.admitted_before(pid))
        if self.roster.was_dropped(pid):
            await self._rejoined_dropped(event, endpoint, owns)  # raises PipelineGone: it was dropped
        await self._event(event)
        self.books.jobs.rejoined(pid, user, event.admitted, self.now())
        self._joined(event.spec, endpoint, owns)
        if event.demand is not None:
            self.books.reported(event.demand)

    async def unregister(self, pipeline_id: str, status: Outcome = Outcome.FAILED, error: str = "", caller=None) -> None:
        """The pipeline leaves. ``caller``: the endpoint of the registration leaving; a leave from any other
        (a registration refused, lost or dropped; the name run again since) ends nothing (None: by name). A
        pipeline of a restarted scheduler's previous life that has not rejoined yet is told so: it rejoins, then
        leaves, and its job ends as it says rather than as one that never came back."""
        if caller is not None and pipeline_id not in self.core.pipelines() and self.roster.awaits(pipeline_id, self.now()):
            raise PipelineUnknown(f"pipeline '{pipeline_id}' has not rejoined the restarted scheduler; rejoin, then leave")
        endpoint = self.endpoints.of.get(pipeline_id)
        if caller is not None and not self.endpoints.registered_by(pipeline_id, caller):
            return
        self.books.jobs.end(pipeline_id, status, error, self.now())
        try:
            done = await self._event(Unregister(pipeline_id=pipeline_id))
        except SchedulingError:
            return  # already gone (idempotent: a killed job may be unregistered twice, concurrently too)
        self.gone.add(pipeline_id)
        if done is not None:  # its workers are shrunk (or found gone) before it is forgotten
            await asyncio.wait([done], timeout=self.endpoints.call_timeout_s)
        if self.endpoints.of.get(pipeline_id) is endpoint:  # not a new run of the same name registered meanwhile
            self._forget(pipeline_id)

    async def request(self, pipeline_id: str, stage: Stage, role: Role | None = None, after: Stage | None = None) -> GrantReply:
        """Ask for a gang stage; returns once the plan grants it.

        ``after``: a stage the pipeline holds, released in the same plan (a
        hand-over between two stages of one step: its GPUs are never lent to
        another pipeline in between, as in the simulator, where both events
        happen at one instant).
        """
        self._known(pipeline_id)
        key = (pipeline_id, stage)
        # Asked again (a retry, or a caller that gave up): the first request's grant answers it, waiting or given.
        if (asked := self.requests.asked(key)) is not None:
            return await asyncio.shield(asked)
        if (granted := self.core.ledger.gangs.get(key)) is not None and after is None:
            return GrantReply(gpus=granted, queued_s=0.0)
        fut = self.requests.open(key, self.now())
        handed = (ReleaseStage(pipeline_id=pipeline_id, stage=after),) if after is not None else ()
        try:
            await self._event(*handed, RequestStage(pipeline_id=pipeline_id, stage=stage, role=role))
        except BaseException as exc:  # refused: whoever asked again meanwhile hears it too
            self.requests.refused(key, fut, exc)
            raise
        return await asyncio.shield(fut)  # a caller that gives up leaves the grant to its retry

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
        self.books.reported(report)
        self.waiting_work.note(report.pipeline_id, report.pending, self.now())

    async def lost(self, event: WorkerLost) -> None:
        """A pipeline's rollout worker is gone (died, or killed for not waking): its GPUs are free."""
        self._known(event.pipeline_id)
        try:
            await self._event(event)
        except SchedulingError:
            pass  # a plan already shrank it (or the pipeline left): nothing to give back

    async def note(self, note: JobNote) -> None:
        self._known(note.pipeline_id)
        self.books.jobs.noted(note, self.now())

    async def alive(self, pipeline_id: str) -> None:
        """A pipeline's keep-alive: raises if this scheduler does not know it (it restarted, or dropped it)."""
        self._known(pipeline_id)

    async def knows(self, pipeline_id: str) -> bool:
        return pipeline_id in self.core.pipelines()

    async def rollout_bundles(self, pipeline_id: str) -> tuple[tuple[int, ...], ...]:
        """Bundles the policy may ever give this pipeline's rollout workers (to pre-start them)."""
        self._known(pipeline_id)
        return self.core.rollout_bundles(pipeline_id)

    async def admission_refusal(self, pipeline_id: str) -> str | None:
        """Why the pipeline's model load waits for its queues (one line), or None: see the core's own."""
        return self.core.admission_refusal(pipeline_id)

    async def holdings(self) -> dict[str, tuple[int, ...]]:
        """GPUs each pipeline holds now (rollout workers and gang stages), for tests and the console."""
        return held_gpus(self.core.ledger.owner)

    async def stats(self) -> SchedulerStats:
        return SchedulerStats(
            plans=self.core.plans_made,
            plan_s=self.plan_s,
            unmet=tuple(self.waiting_work.changes),
            errors=tuple(self.errors),
            **self.counts,
        )

    # ------------------------------------------------------------ submitters' and operators' calls

    async def claim(self, submitter: str, jobs: tuple[JobClaim, ...], user: str = "") -> tuple[str, ...]:
        """Claim job names for ``submitter`` (:class:`rlix.protocol.NameTaken` if one is in use); returns their ids.

        Waits while a restarted scheduler's pipelines rejoin: until they have, a name that is running may not look so."""
        await self._rejoin_window()
        return self.books.jobs.claim(submitter, user, jobs, set(self.core.pipelines()), self.now())

    async def renew(self, submitter: str, jobs: tuple[JobClaim, ...], user: str = "") -> tuple[tuple[str, Stopped], ...]:
        """``submitter``'s lease, with the jobs it has not seen end; returns those cancelled before they started, and why."""
        self.books.jobs.renew_claims(submitter, user, jobs, self.now())
        return self.books.jobs.renew(submitter, self.now())

    async def leave(self, submitter: str) -> None:
        """A submitter is done: its lease ends (its jobs stay listed as they ended)."""
        self.books.jobs.leave(submitter, self.now())

    async def cancel(self, job: str, why: Stopped = Stopped(), *, force: bool = False) -> CancelReply:
        """Cancel a job, by id or name: a running one is asked to stop (it ends cancelled; killed if it
        has not left within ``CANCEL_GRACE_S``); one not started never starts. ``why``: who asked, told to
        the job (its submitter prints it); another user's job only with ``force``."""
        record = self.books.jobs.find(job)
        if record is None and force and job in self.gone and job in self.core.pipelines():  # dropped before a restart
            await self._drop(job, Outcome.FAILED, "dropped")
            return CancelReply(found=True, message=f"job {job} (failed) gave its GPUs back")
        if record is None:
            return CancelReply(found=False, message=f"no job '{job}' on this cluster; see rlix status")
        if record.ended and force and record.name in self.gone and record.name in self.core.pipelines():
            await self._drop(record.name, Outcome.FAILED, record.error)  # dropped, not gone: its GPUs go back now
            return CancelReply(found=True, message=f"job {record.id} ({record.phase.value}) gave its GPUs back")
        if record.ended:
            return CancelReply(found=True, message=f"job {record.id} already {record.phase.value}")
        owner, asker = record.user.partition("@")[0], why.by.partition("@")[0]
        if owner and asker and owner != asker and not force:
            message = f"job {record.id} is {owner}'s (submitted from {record.user}); cancel it with --force"
            return CancelReply(found=True, refused=True, message=message)
        if record.phase is Phase.SUBMITTED:
            self.books.jobs.cancelled(record.name, why, self.now())
            return CancelReply(found=True, message=f"job {record.id} cancelled before it started")
        self.order.spawn(self._stop(record.name, why))
        return CancelReply(found=True, message=f"job {record.id} asked to stop")

    async def cancel_all(self, by: str = "") -> int:
        """Cancel every job not ended, the scheduler being stopped by ``by`` (``rlix scheduler stop --force``);
        returns how many."""
        names = await self.busy()
        for name in names:
            await self.cancel(name, Stopped(by=by, scheduler_stopped=True), force=True)
        return len(names)

    async def kill_all(self) -> list[str]:
        """Kill every pipeline still registered and give its GPUs back (a forced stop whose cancels
        were not obeyed in time); returns their names."""
        names = sorted(self.core.pipelines(), key=lambda name: (name not in self.gone, name))  # holds first
        for name in names:
            await self._drop(name, Outcome.CANCELLED, "killed: the scheduler was stopped")
        for name in self.books.jobs.open_jobs():
            self.books.jobs.end(name, Outcome.CANCELLED, "the scheduler was stopped", self.now())
        return names

    async def busy(self) -> list[str]:
        """Jobs not ended: registered pipelines and claimed jobs (``rlix scheduler stop`` refuses while any)."""
        return sorted(set(self.books.jobs.open_jobs()) | set(self.core.pipelines()))

    async def status(self) -> ClusterStatus:
        return self.books.status(self.core, self.now())

    async def timeline(self) -> TimelineReply:
        """The cluster's activity since the service started."""
        return self.books.timeline(self.core, self.now())

    async def job_history(self, user: str = "", since: float = 0.0) -> tuple[HistoryRow, ...]:
        """The jobs that ended (``rlix history``), oldest first: those written to the database, and any not written yet."""
        return self.books.job_history(self.core, self.now(), user=user, since=since)

    async def read_log(self, job: str, offset: int = 0) -> LogChunk:
        """A job's run log from ``offset``, where it lies on this node (``rlix logs`` from another host)."""
        return self.books.read_log(job, offset)

    # ------------------------------------------------------------ planning and carrying plans out

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

    def _plan(self) -> asyncio.Future | None:
        """Plan once and queue the plan's actions per GPU; returns a future done once all of them handed their GPUs on.

        Not while a restarted scheduler waits for its pipelines to rejoin (their GPUs are not known yet).
        """
        if self.roster.waiting(self.now()):
            return None
        t0 = time.perf_counter()
        plan = self.core.plan(self.now())
        took = time.perf_counter() - t0
        self.plan_s += took
        self.books.planned(took, plan.shrinks)
        if plan.empty:
            return None
        for pid in {g.pipeline_id for g in plan.grants} | {e.worker.pipeline_id for e in plan.expands}:
            self.roster.admitted(pid, plan.now)  # kept across a restart: who of a shared home came first
        after = self.order.after
        steps = [after(s.worker.gpus, lambda s=s: self._shrink(s)) for s in plan.shrinks]
        steps += [after(g.gpus, lambda g=g: self._grant(g)) for g in plan.grants]
        steps += [after(e.worker.gpus, lambda e=e: self._expand(e)) for e in plan.expands]
        return asyncio.gather(*steps)

    async def _shrink(self, shrink: Shrink) -> None:
        pid = shrink.worker.pipeline_id
        self.counts["shrinks"] += 1
        endpoint = self.endpoints.of.get(pid)
        if await self.endpoints.shrink(pid, shrink.worker.gpus, shrink.reason.value):
            return
        self.order.spawn(self._unreachable(pid))  # its GPUs are freed by unregistering it
        if pid in self.endpoints.unkillable:  # nothing can stop its process: these GPUs wait until it has left
            while pid in self.core.pipelines() and self.endpoints.of.get(pid) is endpoint:
                await asyncio.sleep(LIVENESS_S / 4)

    async def _grant(self, grant: Grant) -> None:
        self.books.jobs.granted(grant.pipeline_id, self.now())
        self.requests.granted(grant, self.now())
        self.counts["grants"] += 1

    async def _expand(self, expand: Expand):
        """Send the expand (the GPUs are handed on once it is sent); its answer is awaited after."""
        pid = expand.worker.pipeline_id
        self.counts["expands"] += 1
        answer = self.endpoints.expand(pid, expand.worker.gpus)
        return None if answer is None else self._expanded(pid, answer)

    async def _expanded(self, pipeline_id: str, answer) -> None:
        try:
            await answer
        except Exception as exc:  # noqa: BLE001 -- the pipeline died: unregistering it frees its GPUs
            self.errors.append(f"expand on '{pipeline_id}' failed: {type(exc).__name__}")
            if pipeline_id in self.endpoints.unkillable:
                await self._dropped_alive(pipeline_id, f"an expand failed: {type(exc).__name__}")
            else:
                await self._drop(pipeline_id, Outcome.FAILED, f"an expand failed: {type(exc).__name__}")

    def _account(self) -> None:
        """Book what the ledger holds now (after every plan, so the usage changes when the GPUs do)."""
        self.books.account(self.core, self.now())

    def _bug(self, exc: BaseException) -> None:
        """A failure in the scheduler's own background work (a plan's action, a liveness round, a cancel), kept for its stats."""
        self.errors.append(f"scheduler task failed: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ keeping the cluster whole

    async def _rejoin_window(self) -> None:
        """Wait until a restarted scheduler's pipelines have rejoined (no wait otherwise)."""
        while self.roster.waiting(self.now()):
            await asyncio.sleep(0.2)

    async def _watch(self) -> None:
        """Every ``LIVENESS_S``: drop submitters whose lease ran out, and pipelines whose endpoint is gone; write
        the jobs that ended to the history, and forget those there for ``keep_ended_s``."""
        jobs = self.books.jobs
        while True:
            await asyncio.sleep(LIVENESS_S)
            try:
                for submitter in jobs.expired(self.now()):
                    for name in jobs.jobs_of(submitter):
                        if name in self.core.pipelines():
                            self.order.spawn(self._drop(name, Outcome.FAILED, f"its submitter {submitter} is gone"))
                        jobs.end(name, Outcome.FAILED, f"its submitter {submitter} is gone", self.now())
                for pid in await self.endpoints.silent():
                    jobs.end(pid, Outcome.FAILED, "its process is gone", self.now())
                    self.order.spawn(self._unreachable(pid, dead=True))
                if self.roster.restarted_and_done(self.now()):  # once: the jobs that did not come back ended
                    jobs.unjoined(set(self.core.pipelines()), self.now())
                now = self.now()
                self.books.account(self.core, now)
                self.books.keep_totals(now)
                self.books.write_history(self.core, now)
                self.books.forget_ended(now)
            except Exception as exc:  # noqa: BLE001 -- recorded; the next round checks again
                self._bug(exc)

    async def _unreachable(self, pipeline_id: str, *, dead: bool = False) -> None:
        """A coordinator missed a shrink, or its process is gone (``dead``): it is killed (with the processes
        it owns) and its pipeline unregistered, and the others are planned again. One whose endpoint owns none
        of its processes and that may still run cannot be stopped so: :meth:`_dropped_alive`."""
        if pipeline_id in self.endpoints.unkillable and not dead:
            await self._dropped_alive(pipeline_id, "unreachable")
            return
        self.endpoints.kill(pipeline_id)
        async with self.lock:
            self._forget(pipeline_id)
            if pipeline_id in self.core.pipelines():
                self.gone.add(pipeline_id)
                self.books.jobs.end(pipeline_id, Outcome.FAILED, "unreachable", self.now())
                self.errors.append(f"pipeline '{pipeline_id}' unreachable; unregistered")
                self.core.submit(Unregister(pipeline_id=pipeline_id), self.now())
            self._plan()
            self._account()

    async def _dropped_alive(self, pipeline_id: str, why: str) -> None:
        """Drop a pipeline the scheduler cannot stop (its endpoint owns none of its processes, a TRL job's): it
        ends failed and its calls are refused, so it stops, but it keeps its GPUs until it leaves or its
        process dies (the liveness watch), so none is given to another job while it may still work there.
        It gets nothing more meanwhile: its waiting stage requests are withdrawn and its demand is none."""
        if pipeline_id not in self.core.pipelines() or pipeline_id in self.gone:
            return
        self.gone.add(pipeline_id)
        self.roster.drop(pipeline_id)
        self.books.jobs.end(pipeline_id, Outcome.FAILED, why, self.now())
        self.errors.append(f"pipeline '{pipeline_id}' {why}; it keeps its GPUs until it leaves (rlix cancel --force frees them)")
        withdrawn = [ReleaseStage(pipeline_id=pipeline_id, stage=stage) for stage in self.requests.stages_of(pipeline_id)]
        self.requests.fail(pipeline_id)
        await self._event(*withdrawn, ReportDemand(pipeline_id=pipeline_id, pending=0))

    async def _rejoined_dropped(self, event: Rejoin, endpoint, owns: bool) -> None:
        """A pipeline the previous life dropped while it still ran rejoins: it gets its holdings back, so none
        is given to another job while it may still work there, and nothing more; its job stays ended, and
        it is told again (:class:`PipelineGone`)."""
        pid = event.spec.pipeline_id
        await self._event(dataclasses.replace(event, demand=None))
        self._joined(event.spec, endpoint, owns)
        await self._dropped_alive(pid, "was dropped before the restart")
        raise PipelineGone(f"pipeline '{pid}' was unregistered by the scheduler before its restart; stop it")

    async def _drop(self, pipeline_id: str, status: Outcome, error: str) -> None:
        """Unregister a pipeline that no longer obeys: its endpoint (and the processes it owns) is
        killed first, so no GPU is given to another job while its processes still run there."""
        self.endpoints.kill(pipeline_id)
        await self.unregister(pipeline_id, status, error)

    async def _stop(self, name: str, why: Stopped) -> None:
        """Ask a registered job's endpoint to stop (once it has one: a job registering has it in a moment)."""
        for _ in range(100):
            endpoint = self.endpoints.of.get(name)
            if endpoint is not None or name not in self.core.pipelines() and self.books.jobs.active(name) is None:
                break
            await asyncio.sleep(0.1)
        if endpoint is not None:
            self.endpoints.stop(name, why)
            await self._stopped_or_killed(name, endpoint)

    async def _stopped_or_killed(self, name: str, endpoint) -> None:
        """A cancelled job that has not left within ``CANCEL_GRACE_S`` is killed, with its processes. One
        whose endpoint owns none (a callback inbox) cannot be: it keeps its GPUs until its process leaves
        or dies (its inbox dies with it), so none is given to another job while it still works there."""
        await asyncio.sleep(CANCEL_GRACE_S)
        if self.endpoints.of.get(name) is not endpoint or name not in self.core.pipelines():
            return
        if name in self.endpoints.unkillable:
            self.errors.append(
                f"'{name}' did not stop within {CANCEL_GRACE_S:g} s of its cancel; it keeps its GPUs until it leaves"
            )
            return
        await self._drop(name, Outcome.CANCELLED, f"did not stop within {CANCEL_GRACE_S:g} s of its cancel; killed")

    def _known(self, pipeline_id: str) -> None:
        if pipeline_id in self.gone:
            raise PipelineGone(f"pipeline '{pipeline_id}' was unregistered by the scheduler")
        if pipeline_id not in self.core.pipelines():
            raise PipelineUnknown(f"pipeline '{pipeline_id}' is not registered with this scheduler")

    def _joined(self, spec: PipelineSpec, endpoint, owns: bool) -> None:
        self.endpoints.joined(spec.pipeline_id, endpoint, owns)
        self.roster.joined(spec.pipeline_id, self.core.admitted_at(spec.pipeline_id))
        self.books.joined(spec, self.now())
        self._account()

    def _forget(self, pipeline_id: str) -> None:
        """What this shell keeps of a pipeline that left: its endpoint, waiting requests, demand and home."""
        self.endpoints.left(pipeline_id)
        self.requests.fail(pipeline_id)
        self.waiting_work.note(pipeline_id, 0, self.now())
        self.books.left(pipeline_id, self.now())
        self.roster.left(pipeline_id)
