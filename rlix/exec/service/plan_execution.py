"""Executor layer: carrying a plan out, the part of the scheduler actor that acts on coordinators.

Mixed into :class:`rlix.exec.service.scheduler_actor.SchedulerActor`. A plan's
actions are queued per GPU (:class:`~rlix.exec.control.gpu_order.GpuOrder`):
shrinks (awaited, so GPUs are really free), then grants (the waiting
``request`` calls return), then expands. Every call to a coordinator has a
deadline; one that cannot be reached in time is treated as gone.
"""

from __future__ import annotations

import asyncio
import time

from rlix.core import Expand, Grant, Shrink, ShrinkReason
from rlix.protocol import GrantReply


class PlanExecution:
    """Plans made and carried out (state: ``self.core``, ``self.order``, ``self.coordinators``, ``self.waiting``)."""

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
        self.metrics.plan_latency.observe(took)
        self._count_preemptions(plan.shrinks)
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
        coord = self.coordinators.get(pid)
        if coord is None:
            return  # pipeline already gone: nothing runs there
        try:
            await asyncio.wait_for(coord.shrink.remote(shrink.worker.gpus, shrink.reason.value), self.call_timeout_s)
        except Exception:  # noqa: BLE001 -- the pipeline died; its GPUs are freed by unregistering it
            self.order.spawn(self._unreachable(pid))

    async def _grant(self, grant: Grant) -> None:
        self.jobs.granted(grant.pipeline_id, self.now())
        entry = self.waiting.pop((grant.pipeline_id, grant.stage), None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(GrantReply(gpus=grant.gpus, queued_s=self.now() - entry[1]))
        self.counts["grants"] += 1

    async def _expand(self, expand: Expand):
        """Send the expand (the GPUs are handed on once it is sent); its answer is awaited after."""
        pid = expand.worker.pipeline_id
        self.counts["expands"] += 1
        coord = self.coordinators.get(pid)
        if coord is None:
            return None
        ref = coord.expand.remote(expand.worker.gpus)
        return self._expanded(pid, ref)

    async def _expanded(self, pipeline_id: str, ref) -> None:
        try:
            await asyncio.wait_for(ref, self.call_timeout_s)
        except Exception as exc:  # noqa: BLE001 -- the pipeline died: unregistering it frees its GPUs
            self.errors.append(f"expand on '{pipeline_id}' failed: {type(exc).__name__}")
            await self._drop(pipeline_id, "failed", f"an expand failed: {type(exc).__name__}")

    def _count_preemptions(self, shrinks) -> None:
        """Shrinks for another stage or job of workers that had trajectories running (as last reported)."""
        for s in shrinks:
            report = self.demands.get(s.worker.pipeline_id)
            loads = {w.first_gpu: w.active for w in report.loads} if report is not None else {}
            if s.reason is not ShrinkReason.UNREGISTER and loads.get(s.worker.gpus[0], 0) > 0:
                self.metrics.preemptions[self.jobs.id_of(s.worker.pipeline_id)] += 1
