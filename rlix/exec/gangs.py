"""Executor layer: one pipeline's calls to the scheduler actor, and the gang stages they book.

Owned by the pipeline coordinator; runs in its event loop. Every call has a
deadline except a gang request, which waits for GPUs as long as the plan
needs; control-plane seconds (beyond waiting for GPUs) are counted in the
recorder, and each held GPU's activity is marked through a stage's phases:
load (switch), work, offload (switch), released (free), as the job model
books them (:func:`rlix.job.gang_activity`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rlix.core import PipelineSpec, ReportDemand, Stage
from rlix.core.types import Gpus
from rlix.exec.config import LimitsConfig
from rlix.exec.recorder import Recorder
from rlix.exec.records import GrantReply, SwitchKind
from rlix.exec.rollout_control import call
from rlix.job import GangPhase, gang_activity, stage_role


class SchedulerLink:
    """Gang stages, releases, demand reports and other scheduler calls of one pipeline."""

    def __init__(self, *, pipeline_id: str, spec: PipelineSpec, sched, recorder: Recorder, limits: LimitsConfig, now: Callable[[], float]) -> None:
        self.pid = pipeline_id
        self.spec = spec
        self.sched = sched  # the scheduler actor's handle
        self.rec = recorder
        self.limits = limits
        self.now = now
        self.held: dict[Stage, Gpus] = {}  # gang stages granted and not yet released

    async def control(self, ref) -> object:
        """A blocking control-plane call with a deadline; all of its time counts as overhead."""
        t = self.now()
        value = await call(ref, self.limits.call_timeout_s, "scheduler call")
        self.rec.counters.control_s += self.now() - t
        self.rec.counters.control_calls += 1
        return value

    async def acquire(self, stage: Stage, *, after: Stage | None = None) -> Gpus:
        """Ask for ``stage``'s gang; returns its GPUs once the plan grants them (no deadline: GPUs may be busy).

        ``after``: a stage this job holds, released in the same call, so the
        scheduler plans with both at once (a hand-over: the GPUs are not lent
        to another job for the moment between two stages of one step).
        """
        role = None if stage is Stage.INIT else stage_role(self.spec, stage)
        if after is not None:
            self._mark(after, self.held.pop(after), GangPhase.RELEASED)
        t = self.now()
        reply: GrantReply = await self.sched.request.remote(self.pid, stage, role, after)
        c = self.rec.counters
        c.control_s += max(0.0, self.now() - t - reply.queued_s)
        c.gpu_wait_s += reply.queued_s
        c.control_calls += 1
        self.held[stage] = reply.gpus
        self._mark(stage, reply.gpus, GangPhase.LOAD)
        return reply.gpus

    async def release(self, stage: Stage, report: ReportDemand | None = None) -> None:
        """Give ``stage``'s GPUs back; ``report``: the demand from now on, planned with the release."""
        gpus = self.held.pop(stage)
        self._mark(stage, gpus, GangPhase.RELEASED)  # before the call: the next holder may start right after
        await self.control(self.sched.release.remote(self.pid, stage, report))

    async def report(self, report: ReportDemand) -> None:
        await self.control(self.sched.report.remote(report))

    async def run(self, stage: Stage, trainer, work: Callable[[], Awaitable], *, after: Stage | None = None, keep: bool = False) -> tuple[object, float]:
        """Run ``work`` on the trainer while ``stage`` holds its GPUs; returns (value, compute seconds).

        ``after``: a held stage handed over to this one (see :meth:`acquire`);
        ``keep``: the GPUs stay held once offloaded, for the caller to release.
        """
        gpus = await self.acquire(stage, after=after)
        t = self.now()
        await call(trainer.reload.remote(), self.limits.call_timeout_s, "stage load")
        self.rec.switch(SwitchKind.STAGE_LOAD, t, self.now() - t)
        self._mark(stage, gpus, GangPhase.WORK)
        t_work = self.now()
        value = await call(work(), self.limits.stage_timeout_s, f"stage {stage.value}")
        secs = self.now() - t_work
        self._mark(stage, gpus, GangPhase.OFFLOAD)
        t = self.now()
        await call(trainer.offload.remote(), self.limits.call_timeout_s, "stage offload")
        self.rec.switch(SwitchKind.STAGE_OFFLOAD, t, self.now() - t)
        if not keep:
            await self.release(stage)
        return value, secs

    async def report_loop(self, build: Callable[[], ReportDemand], changes: Callable[[], Awaitable]) -> None:
        """Send ``build()`` when demand changes (bursts coalesced), and a heartbeat every second."""
        last = None
        while True:
            try:
                await asyncio.wait_for(changes(), timeout=1.0)
            except asyncio.TimeoutError:
                last = None  # heartbeat: resend even if unchanged
            report = build()
            if report != last:
                await self.report(report)
                last = report
            await asyncio.sleep(0.02)  # coalesce bursts of changes (s)

    def gpus_held(self) -> Gpus:
        return tuple(sorted(g for gpus in self.held.values() for g in gpus))

    def _mark(self, stage: Stage, gpus: Gpus, phase: GangPhase) -> None:
        activity = gang_activity(stage, phase)
        self.rec.mark(self.now(), gpus, activity, stage.value)
