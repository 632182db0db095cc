"""Executor layer: one pipeline's calls to the scheduler actor.

Owned by the pipeline coordinator; runs in its event loop. The calls go
through the public client library (:class:`rlix.client.Client`, which also
rejoins a restarted scheduler); this link adds what the job records of them:
control-plane seconds (beyond waiting for GPUs) and GPU waits, counted in
the recorder, and which stage waits since when (the live view). Every call
has a deadline except a gang request, which waits for GPUs as long as the
plan needs. What the GPUs of a held stage do is booked by the step machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rlix.client import Client
from rlix.core import ReportDemand, Role, Stage
from rlix.core.types import Gpus
from rlix.exec.config import LimitsConfig
from rlix.exec.deadline import call
from rlix.exec.recorder import Recorder
from rlix.protocol import GrantReply


class SchedulerLink:
    """Gang stages, releases, demand reports and other scheduler calls of one pipeline."""

    def __init__(
        self,
        *,
        pipeline_id: str,
        sched,
        recorder: Recorder,
        limits: LimitsConfig,
        now: Callable[[], float],
        workers: Callable[[], tuple[Gpus, ...]] = tuple,
        on_gone: Callable[[BaseException], None] | None = None,
        submitter: str = "",
    ) -> None:
        self.pid = pipeline_id
        self.client = Client(
            sched, pipeline_id, workers=workers, timeout_s=limits.call_timeout_s, on_gone=on_gone, submitter=submitter
        )
        self.held = self.client.held  # gang stages granted and not yet released
        self.rec = recorder
        self.limits = limits
        self.now = now
        self.waiting: dict[Stage, float] = {}  # gang stages asked for and not yet granted: since when

    async def control(self, coro) -> object:
        """A blocking control-plane call (a client coroutine) with a deadline; all of its time counts as overhead."""
        t = self.now()
        value = await call(coro, self.limits.call_timeout_s, "scheduler call")
        self.rec.counters.control_s += self.now() - t
        self.rec.counters.control_calls += 1
        return value

    async def acquire(self, stage: Stage, role: Role | None, *, after: Stage | None = None) -> Gpus:
        """Ask for ``stage``'s gang on ``role``'s mapping (None: the model load's GPUs); returns its
        GPUs once the plan grants them (no deadline: GPUs may be busy).

        ``after``: a stage this job holds, released in the same call, so the
        scheduler plans with both at once (a hand-over: the GPUs are not lent
        to another job for the moment between two stages of one step).
        """
        t = self.waiting[stage] = self.now()
        try:
            reply: GrantReply = await self.client.request(stage, role, after=after)
        finally:
            self.waiting.pop(stage, None)
        c = self.rec.counters
        c.control_s += max(0.0, self.now() - t - reply.queued_s)
        c.gpu_wait_s += reply.queued_s
        c.control_calls += 1
        return reply.gpus

    async def release(self, stage: Stage, report: ReportDemand | None = None) -> None:
        """Give ``stage``'s GPUs back; ``report``: the demand from now on, planned with the release."""
        await self.control(self.client.release(stage, report))

    async def report(self, report: ReportDemand) -> None:
        await self.control(self.client.report(report))

    async def report_loop(self, build: Callable[[], ReportDemand], changes: Callable[[], Awaitable], heartbeat_s: float) -> None:
        """Send ``build()`` when demand changes (bursts coalesced), and a heartbeat every ``heartbeat_s``."""
        last = None
        while True:
            try:
                await asyncio.wait_for(changes(), timeout=heartbeat_s)
            except asyncio.TimeoutError:
                last = None  # heartbeat: resend even if unchanged
            report = build()
            if report != last:
                await self.report(report)
                last = report
            await asyncio.sleep(0.02)  # coalesce bursts of changes (s)

    async def lost(self, first_gpu: int, failed: bool = True) -> None:
        """Report a rollout worker that died (a plan that shrank it first, or a scheduler gone, leaves nothing to do)."""
        try:
            await self.control(self.client.lost(first_gpu, failed))
        except Exception:  # noqa: BLE001 -- the scheduler is gone: nothing holds the GPUs any more
            pass

    async def note_loop(self, build: Callable[[], object], every_s: float) -> None:
        """Send ``build()`` (a progress note, for ``rlix status``) whenever it changed, checked every ``every_s``.
        Not a blocking call of the job's: not counted as control overhead."""
        last = None
        while True:
            note = build()
            if note != last:
                await self.client.note(note)
                last = note
            await asyncio.sleep(every_s)

    async def last_note(self, note) -> None:
        """The job's last progress note, as it ends (nothing if it never registered or the scheduler is gone)."""
        try:
            await asyncio.wait_for(self.client.note(note), self.limits.call_timeout_s)
        except Exception:  # noqa: BLE001 -- best effort: the job's own outputs have the figures
            pass

    def waiting_since(self) -> tuple[Stage, float] | None:
        """The stage that has waited longest for its GPUs, and since when (None: nothing waits)."""
        return min(self.waiting.items(), key=lambda kv: (kv[1], kv[0].value), default=None)

    def gpus_held(self) -> Gpus:
        return tuple(sorted(g for gpus in self.held.values() for g in gpus))
