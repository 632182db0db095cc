"""Executor layer: the scheduler service's books, what it records of the jobs apart from planning them.

One record per job (:class:`~rlix.exec.service.jobs.JobLedger`), the
GPU-seconds each job used, lent and borrowed (:class:`~rlix.exec.service.usage.ClusterUsage`),
the counters Prometheus reads beside the status (:class:`~rlix.exec.service.prom.Metrics`),
the ended jobs written to the history, and the totals kept for a restarted
service. ``rlix status``, ``/metrics``, ``/status``, the timeline and
``rlix history`` are projections of them.

An ended job stays in the status (and its series in ``/metrics``) for
``keep_ended_s`` after it is in the history, then the books forget it, as
``slurmctld`` forgets a job after ``MinJobAge``: a service that runs for months
keeps its status short, and its records and per-job figures do not grow with
every job it ever ran (its timeline still grows with every switch, and
``rlix logs`` reads a job's log only while it is listed). Its GPU-seconds stay in the
cluster's busy total (``forgotten_gpu_s`` in the status), so the rows and the
forgotten jobs still add up to it; ``rlix history`` has every job. A restarted
service forgets at once the jobs its earlier life saw end (it keeps no record
of them).

The scheduler actor owns the books and writes to them as it plans and as
jobs come and go; nothing here plans, and no plan depends on them. What the
GPUs hold now is the core's ledger: the calls that read it take the core as
an argument (the books keep no reference to it, nor to the actor).
"""

from __future__ import annotations

import dataclasses
import json

from rlix.core import PipelineSpec, ReportDemand, Scheduler, SchedulingError, ShrinkReason, Stage
from rlix.core.types import GangHolder
from rlix.exec.service.history import KEEP_ENDED_S, History, history_row
from rlix.exec.service.jobs import JobLedger, job_number
from rlix.exec.service.logs import chunk_here
from rlix.exec.service.prom import Metrics
from rlix.exec.service.roster import keep, kept
from rlix.exec.service.status import cluster_status
from rlix.exec.service.usage import KINDS, ClusterUsage
from rlix.metrics import Activity
from rlix.protocol import ClusterStatus, HistoryRow, LogChunk, TimelineReply

TOTALS_KEY = "rlix-scheduler/totals"  # each job's GPU-seconds and preemptions, kept for a restarted service


class Books:
    """The service's books: job records, usage, metrics, history and the totals a restart goes on from.

    Times are the scheduler's clock (seconds since ``t0``, its Unix epoch), given by the caller.
    """

    def __init__(
        self,
        num_gpus: int,
        *,
        t0: float,
        now: float,
        restarts: int,
        persist: bool,
        lease_s: float,
        history: str | None,
        keep_ended_s: float = KEEP_ENDED_S,
    ) -> None:
        """``restarts``: Ray's restarts of the actor so far (a restarted service reads what its earlier life
        kept, when ``persist``: it runs in a Ray actor); ``history``: the SQLite file of ended jobs (None: kept
        nowhere, and no job is forgotten); ``keep_ended_s``: how long an ended job stays once it is in the history."""
        restarted = restarts > 0
        self.keep_ended_s = keep_ended_s
        self.t0 = t0  # wall-clock epoch of the scheduler's clock (time.time() seconds)
        self.restarts = restarts
        self.began = now  # when this life began (its timeline starts there)
        self.persist = persist
        self.history = History(history) if history else None  # the jobs that ended, in SQLite (None: not kept)
        self.in_history = self.history.written() if self.history is not None else set()  # ids written there
        self.written_at: dict[str, float] = {}  # when this life wrote an ended job there (it is forgotten later)
        counted = max((job_number(i) for i in self.in_history), default=0)  # ids go on above the history's
        self.jobs = JobLedger(lease_s, persist=persist, restarted=restarted, counted=counted, now=now)
        totals = (kept(TOTALS_KEY) if restarted and persist else None) or {}  # what the previous life counted
        # GPU-seconds per job id and the timeline; a restarted service's go on from its previous life's
        self.usage = ClusterUsage(num_gpus, start=0.0 if restarted else now, totals=totals.get("usage"))
        self.metrics = Metrics(totals.get("preemptions"))  # counted for Prometheus beside the status
        if restarted:  # the jobs an earlier life saw end have no record now: their figures are forgotten at once
            figured = set(self.metrics.preemptions).union(*(getattr(self.usage, kind) for kind in KINDS))
            for job_id in sorted(figured - set(self.jobs.records)):
                self._forget_figures(job_id)
        self.specs: dict[str, PipelineSpec] = {}  # each pipeline's latest registered topology, by name
        self.demands: dict[str, ReportDemand] = {}  # each pipeline's latest demand report (its workers' loads)

    # ------------------------------------------------------------ what the scheduler tells them

    def joined(self, spec: PipelineSpec, now: float) -> None:
        """A pipeline registered (or rejoined): its topology, and its home GPUs from ``now`` on."""
        self.specs[spec.pipeline_id] = spec
        self.usage.set_home(now, self.jobs.id_of(spec.pipeline_id), spec.home_gpus)

    def left(self, pipeline_id: str, now: float) -> None:
        """A pipeline left: its demand is forgotten and it has no home from ``now`` on."""
        self.demands.pop(pipeline_id, None)
        self.usage.set_home(now, self.jobs.id_of(pipeline_id), ())

    def reported(self, report: ReportDemand) -> None:
        self.demands[report.pipeline_id] = report

    def planned(self, seconds: float, shrinks) -> None:
        """The core made a plan in ``seconds`` with these shrinks: its latency, and the preemptions among them
        (shrinks for another stage or job of workers that had trajectories running, as last reported)."""
        self.metrics.plan_latency.observe(seconds)
        for s in shrinks:
            if s.reason is not ShrinkReason.UNREGISTER and self._active(s.worker.pipeline_id, s.worker.gpus[0], 0) > 0:
                self.metrics.preemptions[self.jobs.id_of(s.worker.pipeline_id)] += 1

    def account(self, core: Scheduler, now: float) -> None:
        """Book what holds each GPU from ``now`` on (the core's ledger), by job id."""
        self.usage.update(now, self._holders(core))

    # ------------------------------------------------------------ what is read from them

    def status(self, core: Scheduler, now: float) -> ClusterStatus:
        """The status snapshot at ``now``, its usage booked up to then."""
        self.account(core, now)
        return cluster_status(self, core, now)

    def status_page(self, core: Scheduler, now: float) -> tuple[str, str]:
        return "application/json", json.dumps(dataclasses.asdict(self.status(core, now)))

    def metrics_page(self, core: Scheduler, now: float) -> tuple[str, str]:
        page = self.metrics.text(self.status(core, now))
        self.keep_totals(now)  # what this scrape read is where a restarted service goes on from
        return "text/plain; version=0.0.4", page

    def timeline(self, core: Scheduler, now: float) -> TimelineReply:
        """The cluster's activity since this life began."""
        self.account(core, now)
        rec = self.usage.timeline(now)
        util = cluster_status(self, core, now).utilization
        return TimelineReply(recorder=rec, now=now, start=self.began, jobs=tuple(sorted(rec.by_pipeline)), utilization=util)

    def job_history(self, core: Scheduler, now: float, user: str = "", since: float = 0.0) -> tuple[HistoryRow, ...]:
        """The jobs that ended, oldest first: those written to the database, and any not written yet."""
        self.write_history(core, now)
        if self.history is None:
            raise SchedulingError("this rlix scheduler keeps no history (a private run's scheduler)")
        return tuple(self.history.query(user=user, since=since))

    def read_log(self, job: str, offset: int = 0) -> LogChunk:
        """A job's run log from ``offset``, where it lies on this node."""
        record = self.jobs.find(job)
        if record is not None:
            return chunk_here(record.log, offset, record.ended)
        ended = self.history.find(job) if self.history is not None else None  # forgotten here: its row says where
        if ended is None:
            raise SchedulingError(f"no job '{job}' on this cluster; see rlix status")
        return chunk_here(ended.log, offset, True)

    # ------------------------------------------------------------ what outlives the service

    def write_history(self, core: Scheduler, now: float) -> None:
        """Write the jobs that ended and hold no GPU any more to the history (once each, with their final figures)."""
        if self.history is None:
            return
        self.account(core, now)
        self.usage.integrate(now)
        registered = set(core.pipelines())
        for record in self.jobs.records.values():
            if record.ended and record.id not in self.in_history and self._settled(record, registered):
                self.history.write(history_row(record, self.usage, self.t0))
                self.in_history.add(record.id)
                self.written_at[record.id] = now

    def forget_ended(self, now: float) -> list[str]:
        """Forget the jobs in the history for ``keep_ended_s`` by ``now`` (their records, figures and series);
        returns their ids."""
        # a job whose pipeline has not left yet (its workers' shrink still under way) keeps its home: not yet
        old = sorted(i for i, t in self.written_at.items() if now - t >= self.keep_ended_s and not self.usage.has_home(i))
        for job_id in old:
            del self.written_at[job_id]
            self.jobs.forget(job_id)
            self._forget_figures(job_id)
        return old

    def _forget_figures(self, job_id: str) -> None:
        self.usage.forget(job_id)
        self.metrics.preemptions.pop(job_id, None)

    def keep_totals(self, now: float) -> None:
        """Each job's GPU-seconds and counts up to ``now``, where a restarted service finds them (so what a scrape
        read never falls back after a restart)."""
        if self.persist:
            keep(TOTALS_KEY, {"usage": self.usage.totals(now), "preemptions": dict(self.metrics.preemptions)})

    # ------------------------------------------------------------ helpers

    def _settled(self, record, registered: set[str]) -> bool:
        """Whether an ended job's GPUs are all back: its pipeline left the core, or its name is another job's now."""
        if record.name not in registered:
            return True
        active = self.jobs.active(record.name)
        return active is not None and active.id != record.id

    def _active(self, pipeline_id: str, first_gpu: int, unknown: int) -> int:
        """Trajectories the pipeline last reported running on its worker at ``first_gpu`` (``unknown``: none said)."""
        report = self.demands.get(pipeline_id)
        loads = {w.first_gpu: w.active for w in report.loads} if report is not None else {}
        return loads.get(first_gpu, unknown)

    def _holders(self, core: Scheduler) -> list:
        """What holds each GPU now, as the usage accounting books it: by job id (two runs of one name apart)."""
        out = []
        for holder in core.ledger.owner:
            if holder is None:
                out.append(None)
                continue
            job = self.jobs.id_of(holder.pipeline_id)
            if isinstance(holder, GangHolder):
                out.append((job, holder.stage.value, Activity.WORK))
            else:
                busy = self._active(holder.pipeline_id, holder.gpus[0], 1) > 0
                out.append((job, Stage.ROLLOUT.value, Activity.WORK if busy else Activity.HELD))
        return out
