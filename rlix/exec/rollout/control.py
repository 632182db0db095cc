"""Executor layer: carries out the plan's expand/shrink on one pipeline's rollout workers.

Owned by the pipeline coordinator; runs in its event loop. It moves each
worker through the pool's lifecycle table, calls the worker processes (every
call with a deadline), has its :class:`~rlix.exec.rollout.lifecycle.WorkerLifecycle`
start and kill them, and has its :class:`~rlix.exec.rollout.dispatch.Dispatch`
run queued trajectories on awake workers and sort each outcome:

- a worker process that dies (``RayActorError``) or misses a deadline is
  killed and marked dead; its GPUs go back to the scheduler's ledger
  (``WorkerLost``) and its trajectories are continued on other workers;
- an application error in a rollout (``RayTaskError``) is retried a bounded
  number of times by the rollout queue, then fails the job (one line).

Worker processes are started *warm* (see :mod:`rlix.exec.rollout.lifecycle`):
one per bundle the job may use, those in its home at once, the others once its
model is loaded (:func:`rlix.job.warm_order`).

The process boundary is explicit: worker handles (``handle.method.remote(...)``)
come from the coordinator's ``spawn`` hook, and killing a process and telling
a dead one from an application error go through :class:`Processes` (Ray's by
default), so the races here are tested without Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses

from rlix.core.types import Gpus
from rlix.exec.deadline import call
from rlix.exec.device_memory import NotEnoughMemoryError
from rlix.exec.messages import SwitchTiming
from rlix.exec.recorder import Recorder
from rlix.exec.records import SwitchKind
from rlix.exec.rollout.dispatch import Dispatch, book_worker
from rlix.exec.rollout.hooks import Deadlines, Hooks, Processes, WeightRule, ray_processes
from rlix.exec.rollout.lifecycle import WorkerLifecycle
from rlix.exec.rollout.pool import Worker, WorkerPool, WorkerState
from rlix.exec.rollout.queue import Queued, RolloutQueue
from rlix.job import WeightGate, WorkerPhase, weight_gate


class RolloutControl:
    """Expand, shrink, dispatch and weight pushes for one pipeline's rollout workers."""

    def __init__(
        self,
        *,
        pool: WorkerPool,
        queue: RolloutQueue,
        recorder: Recorder,
        hooks: Hooks,
        deadlines: Deadlines,
        model_dir: str,
        procs: Processes | None = None,
        rule: WeightRule = WeightRule(),
    ) -> None:
        self.pool = pool
        self.rec = recorder
        self.hooks = hooks
        self.deadlines = deadlines
        procs = procs or ray_processes()
        self.life = WorkerLifecycle(
            pool=pool, recorder=recorder, hooks=hooks, deadlines=deadlines, model_dir=model_dir, procs=procs
        )
        self.runner = Dispatch(
            pool=pool,
            queue=queue,
            recorder=recorder,
            hooks=hooks,
            procs=procs,
            rollout_s=deadlines.rollout_s,
            kill=self.life.kill,
            ready=self.ready,
            startable=self.startable,
        )
        self.rule = rule
        self.locks: dict[int, asyncio.Lock] = {}
        self.syncs: dict[int, asyncio.Task] = {}  # first GPU -> the weight sync its gate started

    def _mark(self, w: Worker, phase: WorkerPhase) -> None:
        book_worker(self.rec, self.hooks.now(), w, phase)

    # ------------------------------------------------------------ processes

    def warm(self, bundles, *, spare: bool = False) -> None:
        """Start a sleeping process on every bundle, in the background (no GPU held, no waiting);
        ``spare``: outside the home, started once the home's processes are up."""
        self.life.warm(bundles, spare=spare)

    def starts(self) -> list:
        """The tasks starting worker processes or syncing their weights (teardown cancels them: a spare
        waiting its turn never starts)."""
        return [*self.life.starting.values(), *self.syncs.values()]

    def end(self) -> list:
        """The job is over: the handles of every worker process it started, for teardown to kill
        (see :meth:`WorkerLifecycle.end`)."""
        return self.life.end()

    # ------------------------------------------------------------ plan calls

    async def expand(self, gpus: Gpus) -> None:
        """The plan gave us a worker on ``gpus``: wait for its process, wake it with the newest weights."""
        w = self.pool.get(tuple(gpus))
        gen = self.pool.bump(w)
        self.pool.grant(w)
        t = self.hooks.now()
        if w.state in (None, WorkerState.STARTING, WorkerState.DEAD):  # not warm (yet): wait for its process
            self._mark(w, WorkerPhase.START)
            if not await self._started(w) or w.generation != gen:
                return  # dead, the job ended, or shrunk meanwhile (the shrink booked the GPUs)
            self.rec.switch(SwitchKind.COLD_START, t, self.hooks.now() - t)  # GPU held while the process started
        self._mark(w, WorkerPhase.LOAD)
        async with self.locks.setdefault(w.first, asyncio.Lock()):
            if w.generation != gen or w.state is not WorkerState.ASLEEP:
                return  # shrunk meanwhile, or lost
            self.pool.move(w, WorkerState.WAKING)
            t = self.hooks.now()
            try:
                timing = await self._wake(w)
            except NotEnoughMemoryError as exc:  # refused before loading anything: the process stays, asleep
                self.life.stand_down(w, gen, str(exc).strip().splitlines()[-1])
                return
            except Exception as exc:  # noqa: BLE001 -- dead, hung or failing: no worker here
                self.life.kill(w, f"wake failed: {exc}")
                return
            self.pool.move(w, WorkerState.AWAKE)
            w.version = timing.version
            kind = SwitchKind.COLD_START if timing.cold else SwitchKind.WAKE  # an engine built on the GPUs is no wake
            self.rec.switch(kind, t, self.hooks.now() - t, timing.synced_bytes, timing.sync_path)
            if w.generation == gen:
                self._mark(w, WorkerPhase.IDLE)
                self.dispatch()

    async def _started(self, w: Worker) -> bool:
        """Whether ``w``'s process is up, once its start ends: False if it died, or if the job ended
        and teardown cancelled the start (an expand still waiting for it then ends quietly: the
        scheduler would take an expand raising for a dead coordinator)."""
        start = self.life.start(w)
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            if not start.cancelled() or _cancelling():
                raise  # this expand itself was cancelled
            return False

    async def _wake(self, w: Worker) -> SwitchTiming:
        full, version, adapters = self.hooks.weights()
        refs = [ref for _, ref, _ in adapters]
        handoff = self.hooks.handoff(version)
        timing = await call(w.handle.wake.remote(full, *refs, handoff=handoff), self.deadlines.wake_s, "wake")
        path = timing.sync_path
        # Newer versions may have appeared while waking: the next batch never meets old weights.
        while (cur := self.hooks.weights())[1] > timing.version:
            sync = w.handle.update_weights.remote(cur[0], handoff=self.hooks.handoff(cur[1]))
            timing = await call(sync, self.deadlines.call_s, "weight sync")
            path = timing.sync_path or path
        for name, ref, v in self.hooks.weights()[2]:
            if timing.adapter_version(name) < v:
                timing = await call(w.handle.update_adapter.remote(ref), self.deadlines.call_s, "adapter sync")
        return dataclasses.replace(timing, sync_path=path)  # how the full weights came, whichever call loaded them

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        """The plan takes ``gpus`` back: abort, drop weights, re-queue what was running."""
        w = self.pool.workers.get(gpus[0])
        if w is None:
            return
        gen = self.pool.bump(w)
        # The plan has taken the GPUs back already: a death while draining is no WorkerLost
        # (the ledger may have placed a new worker there meanwhile).
        held, w.granted = w.granted, False
        if w.state is WorkerState.AWAKE:  # the running trajectories come back to the book as they stop
            book = self.runner.queue.book
            book.preempted(sum(task is not None for task in w.inflight.values()))
            self.rec.counters.preemptions = book.preemptions
        if w.state in (None, WorkerState.STARTING, WorkerState.DEAD):
            self._release(w, gen, held)  # nothing on the GPUs yet (or any more)
            return
        w.leaving += 1
        try:
            async with self.locks.setdefault(w.first, asyncio.Lock()):
                if w.state is WorkerState.AWAKE:
                    await self._drain(w)
        finally:
            w.leaving -= 1
        self._release(w, gen, held)
        if self.pool.freed_after_rejoin(w, gen):  # a rejoin reported it while it was leaving: free it now
            self.hooks.lost(w.gpus, False)  # drained, not failed: no cooldown on its bundle

    def _release(self, w: Worker, gen: int, held: bool) -> None:
        if w.generation == gen and held:  # a newer expand keeps the GPUs
            self._mark(w, WorkerPhase.GONE)
            self.hooks.changed()

    async def _drain(self, w: Worker) -> None:
        self.pool.move(w, WorkerState.DRAINING)
        self._mark(w, WorkerPhase.OFFLOAD)
        t = self.hooks.now()
        try:
            await call(w.handle.sleep.remote(), self.deadlines.call_s, "sleep")  # aborts in-flight generations first
        except Exception as exc:  # noqa: BLE001
            self.life.kill(w, f"sleep failed: {exc}")
        tasks = [task for task in w.inflight.values() if task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.deadlines.call_s)
        self.rec.switch(SwitchKind.SLEEP, t, self.hooks.now() - t)
        if w.state is WorkerState.DRAINING:
            self.pool.move(w, WorkerState.ASLEEP)

    # ------------------------------------------------------------ rollout

    def dispatch(self) -> None:
        """Start queued trajectories on free slots of awake workers."""
        self.runner.dispatch()

    def startable(self, w: Worker) -> bool:
        """Could a trajectory start on ``w`` now, whichever it is: the plan still gives it the job and no
        weight sync is under way there (:meth:`ready` then asks the weight gate about the trajectory)."""
        return w.granted and not w.leaving and not (self.rule.full and w.first in self.syncs)

    def ready(self, w: Worker, q: Queued) -> bool:
        """May ``q`` start on ``w`` now? :func:`rlix.job.weight_gate` decides, as in the simulator; a worker
        it sends to sync first starts its sync here. A sync brings the newest weights, the only version
        the trainer's cache keeps. A LoRA job's base never changes: its adapters reach live workers when
        they are published, and load beside running trajectories. Nothing starts on a worker the plan
        has taken back (a shrink waiting for its lock)."""
        if not self.startable(w):
            return False
        if not self.rule.full:
            return True
        newest = self.hooks.weights()[1]
        gate, version = self._gate(w, q.need, newest)
        if gate is WeightGate.SYNC:
            if version > newest:  # a batch is queued only once its weights are published
                raise RuntimeError(f"trajectory {q.traj_id} needs weights {q.need}; the newest published are {newest}")
            self._sync(w)
            return False
        return gate is WeightGate.START

    def _gate(self, w: Worker, need: int, newest: int) -> tuple[WeightGate, int]:
        rule = self.rule
        return weight_gate(w.version, need, newest, idle=not w.inflight, streaming=rule.streaming, partial=rule.partial)

    def _sync(self, w: Worker) -> asyncio.Task:
        """Sync ``w`` to the newest full weights; once it has them, queued trajectories may start on it."""
        task = self.syncs[w.first] = asyncio.get_running_loop().create_task(self._push(w, ""))
        task.add_done_callback(lambda t: self._synced(w.first, t))
        return task

    def _synced(self, first: int, task: asyncio.Task) -> None:
        if self.syncs.get(first) is task:
            del self.syncs[first]
        if not task.cancelled() and not self.life.ended:  # teardown cancels syncs: nothing more starts then
            self.dispatch()

    # ------------------------------------------------------------ weight pushes

    async def push(self, adapter: str) -> None:
        """A new version is published: an adapter goes to every awake worker; new full weights only
        where :func:`rlix.job.weight_gate` moves a worker with no trajectory waiting for them (an idle
        one under streaming). The others sync when a trajectory that needs them is to start on them."""
        live = self.pool.in_state(WorkerState.AWAKE)
        if adapter or not self.rule.full:
            await asyncio.gather(*(self._push(w, adapter) for w in live), return_exceptions=True)
            return
        newest = self.hooks.weights()[1]
        moved = [w for w in live if w.first not in self.syncs and self._gate(w, -1, newest)[0] is WeightGate.SYNC]
        await asyncio.gather(*(self._sync(w) for w in moved), return_exceptions=True)

    async def _push(self, w: Worker, adapter: str) -> None:
        async with self.locks.setdefault(w.first, asyncio.Lock()):
            if w.state is not WorkerState.AWAKE:
                return
            full, version, adapters = self.hooks.weights()
            if not adapter and w.version >= version:
                return  # it has them already
            t = self.hooks.now()
            ref = next((r for n, r, _ in adapters if n == adapter), None) if adapter else None
            # The sync's GPU-seconds are switching, as the simulator books a live sync (switch_overhead_fraction).
            self._mark(w, WorkerPhase.WEIGHT_SYNC)
            try:
                if adapter:
                    timing = await call(w.handle.update_adapter.remote(ref), self.deadlines.call_s, "adapter sync")
                else:
                    sync = w.handle.update_weights.remote(full, handoff=self.hooks.handoff(version))
                    timing = await call(sync, self.deadlines.call_s, "weight sync")
                    if timing.version < version:
                        raise RuntimeError(f"it holds version {timing.version} after a sync to {version}")
                    w.version = timing.version
            except Exception as exc:  # noqa: BLE001
                self.life.kill(w, f"weight sync failed: {exc}")
                return
            if w.granted and w.state is WorkerState.AWAKE:  # a shrink meanwhile books the GPUs itself
                busy = any(task is not None for task in w.inflight.values())
                self._mark(w, WorkerPhase.BUSY if busy else WorkerPhase.IDLE)
            if timing.synced_bytes:
                self.rec.switch(SwitchKind.SYNC, t, self.hooks.now() - t, timing.synced_bytes, timing.sync_path)


def _cancelling() -> bool:
    """Whether the running task was asked to cancel (Python 3.11+; before, only the start's own state tells)."""
    task = asyncio.current_task()
    return task is not None and getattr(task, "cancelling", lambda: 0)() > 0
