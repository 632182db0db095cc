"""Executor layer: the scheduler actor's calls as a service shared by independent submitters.

Mixed into :class:`rlix.exec.service.scheduler_actor.SchedulerActor`: job
names claimed per submitter under a lease, progress notes, ``rlix status``,
``rlix cancel``, the timeline, and what keeps a shared cluster whole when
a party disappears: submitters whose lease runs out and pipelines whose
endpoint no longer answers are unregistered (their GPUs go to the others),
and a restarted scheduler waits for its pipelines to rejoin with what they
hold before it plans again (:class:`rlix.exec.service.roster.Roster`).
"""

from __future__ import annotations

import asyncio
import dataclasses

from rlix.core import Rejoin, SchedulingError, Stage
from rlix.exec.service.history import history_row
from rlix.exec.service.jobs import Phase
from rlix.exec.service.logs import chunk_here
from rlix.exec.service.roster import keep
from rlix.exec.service.status import cluster_status
from rlix.protocol import (
    CancelReply,
    ClusterStatus,
    HistoryRow,
    JobClaim,
    JobNote,
    LogChunk,
    PipelineGone,
    PipelineUnknown,
    ServiceInfo,
    Stopped,
    TimelineReply,
)

TOTALS_KEY = "rlix-scheduler/totals"  # each job's GPU-seconds and preemptions, kept for a restarted service
LIVENESS_S = 2.0  # seconds between checks that every pipeline's endpoint answers
LIVENESS_DEADLINE_S = 10.0  # an endpoint that does not answer within this is gone (s)
CANCEL_GRACE_S = 30.0  # a cancelled job still registered this long after its cancel is killed (s)


def same_actor(a, b) -> bool:
    """Whether two Ray actor handles name one actor."""
    return a is not None and b is not None and a._actor_id == b._actor_id


def kill_actor(handle) -> None:
    """Kill an actor (and what it owns), once and for all; quiet if it is gone already."""
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 -- already dead
        pass


class ServiceCalls:
    """Service calls of the scheduler actor (state: ``self.jobs``, ``self.usage``, ``self.gone``)."""

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
            restarts=self.restarts,
            life=self.life,
            gpus=self.gpus,
        )

    async def knows(self, pipeline_id: str) -> bool:
        return pipeline_id in self.core.pipelines()

    async def alive(self, pipeline_id: str) -> None:
        """A pipeline's keep-alive: raises if this scheduler does not know it (it restarted, or dropped it)."""
        self._known(pipeline_id)

    async def rejoin(self, event: Rejoin, endpoint, user: str = "") -> None:
        """A pipeline registered with this scheduler before its restart registers again with its holdings."""
        pid = event.spec.pipeline_id
        if pid in self.core.pipelines():
            if same_actor(self.coordinators.get(pid), endpoint):
                return  # another of its calls rejoined first
            raise PipelineGone(f"pipeline '{pid}' is registered by another process now; stop this one")
        if event.admitted_at is None:  # when the previous life admitted it, as it kept it
            event = dataclasses.replace(event, admitted_at=self.roster.admitted_before(pid))
        await self._event(event)
        self.jobs.rejoined(pid, user, event.admitted, self.now())
        self._joined(event.spec, endpoint)
        if event.demand is not None:
            self.demands[pid] = event.demand

    async def note(self, note: JobNote) -> None:
        self._known(note.pipeline_id)
        self.jobs.noted(note, self.now())

    async def claim(self, submitter: str, jobs: tuple[JobClaim, ...], user: str = "") -> tuple[str, ...]:
        """Claim job names for ``submitter`` (:class:`rlix.protocol.NameTaken` if one is in use); returns their ids.

        Waits while a restarted scheduler's pipelines rejoin: until they have, a name that is running may not look so."""
        await self._rejoin_window()
        return self.jobs.claim(submitter, user, jobs, set(self.core.pipelines()), self.now())

    async def renew(self, submitter: str, jobs: tuple[JobClaim, ...], user: str = "") -> tuple[tuple[str, Stopped], ...]:
        """``submitter``'s lease, with the jobs it has not seen end; returns those cancelled before they started, and why."""
        self.jobs.renew_claims(submitter, user, jobs, self.now())
        return self.jobs.renew(submitter, self.now())

    async def leave(self, submitter: str) -> None:
        """A submitter is done: its lease ends (its jobs stay listed as they ended)."""
        self.jobs.leave(submitter, self.now())

    async def cancel(self, job: str, why: Stopped = Stopped(), *, force: bool = False) -> CancelReply:
        """Cancel a job, by id or name: a running one is asked to stop (it ends cancelled; killed if it
        has not left within ``CANCEL_GRACE_S``); one not started never starts. ``why``: who asked, told to
        the job (its submitter prints it); another user's job only with ``force``."""
        record = self.jobs.find(job)
        if record is None:
            return CancelReply(found=False, message=f"no job '{job}' on this cluster; see rlix status")
        if record.ended:
            return CancelReply(found=True, message=f"job {record.id} already {record.phase.value}")
        owner, asker = record.user.partition("@")[0], why.by.partition("@")[0]
        if owner and asker and owner != asker and not force:
            message = f"job {record.id} is {owner}'s (submitted from {record.user}); cancel it with --force"
            return CancelReply(found=True, refused=True, message=message)
        if record.phase is Phase.SUBMITTED:
            self.jobs.cancelled(record.name, why, self.now())
            return CancelReply(found=True, message=f"job {record.id} cancelled before it started")
        self.order.spawn(self._stop(record.name, why))
        return CancelReply(found=True, message=f"job {record.id} asked to stop")

    async def cancel_all(self, by: str = "") -> int:
        """Cancel every job not ended, the scheduler being stopped by ``by`` (``rlix scheduler stop --force``);
        returns how many."""
        names = sorted(set(self.jobs.open_jobs()) | set(self.core.pipelines()))
        for name in names:
            await self.cancel(name, Stopped(by=by, scheduler_stopped=True), force=True)
        return len(names)

    async def kill_all(self) -> list[str]:
        """Kill every pipeline still registered and give its GPUs back (a forced stop whose cancels
        were not obeyed in time); returns their names."""
        names = sorted(self.core.pipelines())
        for name in names:
            await self._drop(name, "cancelled", "killed: the scheduler was stopped")
        for name in self.jobs.open_jobs():
            self.jobs.end(name, "cancelled", "the scheduler was stopped", self.now())
        return names

    async def busy(self) -> list[str]:
        """Jobs not ended: registered pipelines and claimed jobs (``rlix scheduler stop`` refuses while any)."""
        return sorted(set(self.jobs.open_jobs()) | set(self.core.pipelines()))

    async def status(self) -> ClusterStatus:
        self._account()
        return cluster_status(self, self.now())

    async def job_history(self, user: str = "", since: float = 0.0) -> tuple[HistoryRow, ...]:
        """The jobs that ended (``rlix history``), oldest first: those written to the database, and any not written yet."""
        self._write_history()
        if self.history is None:
            raise SchedulingError("this rlix scheduler keeps no history (a private run's scheduler)")
        return tuple(self.history.query(user=user, since=since))

    async def read_log(self, job: str, offset: int = 0) -> LogChunk:
        """A job's run log from ``offset``, where it lies on this node (``rlix logs`` from another host)."""
        record = self.jobs.find(job)
        if record is None:
            raise SchedulingError(f"no job '{job}' on this cluster; see rlix status")
        return chunk_here(record.log, offset, record.ended)

    def _write_history(self) -> None:
        """Write the jobs that ended and hold no GPU any more to the history (once each, with their final figures)."""
        if self.history is None:
            return
        self._account()
        self.usage.integrate(self.now())
        for record in self.jobs.records.values():
            if record.ended and record.id not in self.in_history and self._settled(record):
                self.history.write(history_row(record, self.usage, self.t0))
                self.in_history.add(record.id)

    def _settled(self, record) -> bool:
        """Whether an ended job's GPUs are all back: its pipeline left the core, or its name is another job's now."""
        if record.name not in self.core.pipelines():
            return True
        active = self.jobs.active(record.name)
        return active is not None and active.id != record.id

    async def timeline(self) -> TimelineReply:
        """The cluster's activity since the service started."""
        now = self.now()
        self._account()
        rec = self.usage.timeline(now)
        util = cluster_status(self, now).utilization
        return TimelineReply(recorder=rec, now=now, start=self.began, jobs=tuple(sorted(rec.by_pipeline)), utilization=util)

    # ------------------------------------------------------------ keeping the cluster whole

    async def _rejoin_window(self) -> None:
        """Wait until a restarted scheduler's pipelines have rejoined (no wait otherwise)."""
        while self.roster.waiting(self.now()):
            await asyncio.sleep(0.2)

    async def _drop(self, pipeline_id: str, status: str, error: str) -> None:
        """Unregister a pipeline that no longer obeys: its endpoint (and the processes it owns) is
        killed first, so no GPU is given to another job while its processes still run there."""
        endpoint = self.coordinators.get(pipeline_id)
        if endpoint is not None:
            kill_actor(endpoint)
        await self.unregister(pipeline_id, status, error)

    async def _stop(self, name: str, why: Stopped) -> None:
        """Ask a registered job's endpoint to stop (once it has one: a job registering has it in a moment)."""
        for _ in range(100):
            endpoint = self.coordinators.get(name)
            if endpoint is not None or name not in self.core.pipelines() and self.jobs.active(name) is None:
                break
            await asyncio.sleep(0.1)
        if endpoint is not None:
            endpoint.stop.remote(why)
            await self._stopped_or_killed(name, endpoint)

    async def _stopped_or_killed(self, name: str, endpoint) -> None:
        """A cancelled job that has not left within ``CANCEL_GRACE_S`` is killed."""
        await asyncio.sleep(CANCEL_GRACE_S)
        if self.coordinators.get(name) is endpoint and name in self.core.pipelines():
            await self._drop(name, "cancelled", f"did not stop within {CANCEL_GRACE_S:g} s of its cancel; killed")

    def _known(self, pipeline_id: str) -> None:
        if pipeline_id in self.gone:
            raise PipelineGone(f"pipeline '{pipeline_id}' was unregistered by the scheduler")
        if pipeline_id not in self.core.pipelines():
            raise PipelineUnknown(f"pipeline '{pipeline_id}' is not registered with this scheduler")

    def _joined(self, spec, endpoint) -> None:
        self.coordinators[spec.pipeline_id] = endpoint
        self.roster.joined(spec.pipeline_id, self.core.admitted_at(spec.pipeline_id))
        self.specs[spec.pipeline_id] = spec
        self.usage.set_home(self.now(), self.jobs.id_of(spec.pipeline_id), spec.home_gpus)
        self._account()

    async def _watch(self) -> None:
        """Every ``LIVENESS_S``: drop submitters whose lease ran out, and pipelines whose endpoint is gone."""
        while True:
            await asyncio.sleep(LIVENESS_S)
            try:
                for submitter in self.jobs.expired(self.now()):
                    for name in self.jobs.jobs_of(submitter):
                        if name in self.core.pipelines():
                            self.order.spawn(self._drop(name, "failed", f"its submitter {submitter} is gone"))
                        self.jobs.end(name, "failed", f"its submitter {submitter} is gone", self.now())
                endpoints = list(self.coordinators.items())
                answers = await asyncio.gather(*(self._answers(e) for _, e in endpoints))
                for (pid, _), alive in zip(endpoints, answers):
                    if not alive:
                        self.jobs.end(pid, "failed", "its process is gone", self.now())
                        self.order.spawn(self._unreachable(pid))
                if self.roster.restarted_and_done(self.now()):  # once: the jobs that did not come back ended
                    self.jobs.unjoined(set(self.core.pipelines()), self.now())
                self._account()
                self._keep_totals(self.now())
                self._write_history()
            except Exception as exc:  # noqa: BLE001 -- recorded; the next round checks again
                self._bug(exc)

    async def _answers(self, endpoint) -> bool:
        """Whether a pipeline's endpoint actor is alive (a dead one fails at once; a hung one within the deadline)."""
        from ray.exceptions import RayActorError

        try:
            await asyncio.wait_for(endpoint.__ray_ready__.remote(), LIVENESS_DEADLINE_S)
        except (RayActorError, asyncio.TimeoutError):
            return False
        return True

    def _holders(self) -> list:
        """What holds each GPU now, as the usage accounting books it: by job id (two runs of one name apart)."""
        from rlix.core.types import GangHolder
        from rlix.metrics import Activity

        out = []
        for holder in self.core.ledger.owner:
            if holder is None:
                out.append(None)
                continue
            job = self.jobs.id_of(holder.pipeline_id)
            if isinstance(holder, GangHolder):
                out.append((job, holder.stage.value, Activity.WORK))
            else:
                report = self.demands.get(holder.pipeline_id)
                loads = {w.first_gpu: w.active for w in report.loads} if report is not None else {}
                busy = loads.get(holder.gpus[0], 1) > 0
                out.append((job, Stage.ROLLOUT.value, Activity.WORK if busy else Activity.HELD))
        return out

    def _keep_totals(self, now: float) -> None:
        """Each job's GPU-seconds and counts up to ``now``, where a restarted service finds them (so what a scrape
        read never falls back after a restart)."""
        if self.persist:
            keep(TOTALS_KEY, {"usage": self.usage.totals(now), "preemptions": dict(self.metrics.preemptions)})

    def _account(self) -> None:
        self.usage.update(self.now(), self._holders())
