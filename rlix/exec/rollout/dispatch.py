"""Executor layer: one pipeline's queued trajectories run on its awake rollout workers.

The trajectory side of :class:`~rlix.exec.rollout.control.RolloutControl`
(which owns one and keeps the workers' side: start, wake, drain, kill). It
fills free slots from the rollout queue, calls each worker's ``generate``
with a deadline, and sorts each outcome:

- finished: handed to the coordinator;
- aborted by a shrink, or lost with a worker process that died or missed the
  deadline (that worker is killed): back to the queue, continued from the
  tokens it has;
- an application error in a live worker: retried by the queue a bounded
  number of times, then the job fails (one line).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlix.exec.deadline import WorkerTimeout, call
from rlix.exec.recorder import Recorder
from rlix.exec.rollout.hooks import Hooks, Processes
from rlix.exec.rollout.pool import Worker, WorkerPool, WorkerState
from rlix.exec.rollout.queue import Queued, RolloutQueue
from rlix.job import WorkerPhase, worker_booking
from rlix.rollout_book import TrajectoryFailed


def book_worker(rec: Recorder, now: float, w: Worker, phase: WorkerPhase) -> None:
    """Book ``w``'s GPUs for ``phase``, as the job model says (:func:`rlix.job.worker_booking`)."""
    activity, label = worker_booking(phase)
    rec.mark(now, w.gpus, activity, label)


class Dispatch:
    """Starts queued trajectories on free slots and sorts what comes back."""

    def __init__(
        self,
        *,
        pool: WorkerPool,
        queue: RolloutQueue,
        recorder: Recorder,
        hooks: Hooks,
        procs: Processes,
        rollout_s: float,
        kill: Callable[[Worker, str], None],
        ready: Callable[[Worker, Queued], bool],
        startable: Callable[[Worker], bool],
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.rec = recorder
        self.hooks = hooks
        self.procs = procs
        self.rollout_s = rollout_s  # deadline of one trajectory segment (seconds)
        self.kill = kill  # the control's: kill the worker, give its GPUs back
        self.ready = ready  # the control's: may this trajectory start on this worker now (its weights)?
        self.startable = startable  # the control's: may any start there now (granted, no sync under way)?

    def dispatch(self) -> None:
        idle = {w.first for w in self.pool.free_slots() if not w.inflight}
        for w, q in self.queue.assign(self.pool, self.ready, self.startable):
            if w.first in idle:
                idle.discard(w.first)
                book_worker(self.rec, self.hooks.now(), w, WorkerPhase.BUSY)
            w.inflight[q.traj_id] = asyncio.get_running_loop().create_task(self._run(w, q))
        self.hooks.changed()

    async def _run(self, w: Worker, q: Queued) -> None:
        try:
            result = await call(w.handle.generate.remote(q.request), self.rollout_s, "rollout")
        except self.procs.died:
            result = None
            self.kill(w, "worker process died")
        except self.procs.refused as exc:
            result = exc
        except WorkerTimeout as exc:
            result = None
            self.kill(w, str(exc))
        w.inflight.pop(q.traj_id, None)
        if not w.inflight and w.state is WorkerState.AWAKE:
            book_worker(self.rec, self.hooks.now(), w, WorkerPhase.IDLE)
        self._sort(q, result)
        self.dispatch()

    def _sort(self, q: Queued, result) -> None:
        if isinstance(result, self.procs.refused):
            try:
                self.queue.failed(q, _one_line(result))
            except TrajectoryFailed as exc:
                self.hooks.fatal(exc)
        elif result is None or result.aborted or not result.finished:
            self.queue.aborted(q, result)  # continued elsewhere from where it stopped
            self.rec.counters.requeued = self.queue.book.requeued
            self.rec.counters.orphaned = self.queue.book.orphaned
        else:
            self.hooks.finished(q, result)


def _one_line(exc: BaseException) -> str:
    """The innermost error of a remote failure, on one line."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"
