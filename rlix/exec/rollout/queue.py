"""Executor layer: one pipeline's rollout queue (what runs next, what continues after an abort).

Pure (no Ray, no asyncio), in the manner of an engine scheduler: :meth:`assign`
hands queued trajectories to free worker slots and returns the assignments;
the shell runs them and reports each outcome back through one method per
outcome:

- finished: the trajectory is recorded (its generation seconds, segments and
  the oldest weight version that produced a token);
- aborted by a shrink, or its worker process died: it goes back to the front
  of the queue, continued from the tokens it has (never lost, never retried
  from scratch);
- an application error (the engine refused the request, the backend raised):
  retried up to ``max_tries`` times in all, then :class:`TrajectoryFailed`
  fails the job with a one-line reason.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from rlix.exec.data.recipe import Trajectory, continuation
from rlix.exec.messages import GenRequest, GenResult
from rlix.exec.records import TrajRecord
from rlix.exec.rollout.pool import Worker, WorkerPool


class TrajectoryFailed(RuntimeError):
    """A trajectory failed on every try (an application error, not a lost worker)."""


@dataclass(kw_only=True)
class Queued:
    """A trajectory waiting for (or running in) a slot, possibly the rest of an aborted one."""

    traj: Trajectory
    request: GenRequest  # what to send next (a continuation after an abort)
    gen_s: float = 0.0  # generation seconds of the segments so far
    segments: int = 0
    min_version: int = 1 << 30  # oldest weight version that produced a token so far
    errors: int = 0  # application errors so far

    @property
    def traj_id(self) -> int:
        return self.traj.request.traj_id


class RolloutQueue:
    """FIFO of trajectories; continuations go to the front (they hold a batch back)."""

    def __init__(self, *, max_tries: int) -> None:
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        self.max_tries = max_tries
        self.queue: collections.deque[Queued] = collections.deque()
        self.requeued = 0  # trajectories put back after an abort or a dead worker
        self.orphaned = 0  # of those, put back because their worker died
        self.dropped: set[int] = set()  # trajectories of batches that will never be trained

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, trajs: list[Trajectory]) -> None:
        self.queue.extend(Queued(traj=t, request=t.request) for t in trajs)

    def drop(self, traj_ids: set[int]) -> None:
        """These trajectories' batch will never be trained: out of the queue, and never put back."""
        self.dropped |= traj_ids
        self.queue = collections.deque(q for q in self.queue if q.traj_id not in traj_ids)

    def assign(self, pool: WorkerPool) -> list[tuple[Worker, Queued]]:
        """Fill free slots of awake workers, lowest GPU first.

        Each assigned trajectory takes its slot at once (``worker.inflight``
        gets its id, with no task yet); the caller starts each pair's task.
        """
        out = []
        for worker in pool.free_slots():
            while self.queue and len(worker.inflight) < pool.slots_per_worker:
                q = self.queue.popleft()
                worker.inflight[q.traj_id] = None
                out.append((worker, q))
        return out

    # ------------------------------------------------------------ outcomes

    def finished(self, q: Queued, result: GenResult) -> TrajRecord:
        produced = _produced(q, result)
        return TrajRecord(
            traj_id=q.traj_id,
            stream=q.traj.request.adapter,
            step=q.traj.step,
            gen_s=q.gen_s + result.gen_s,
            segments=q.segments + 1,
            tokens=len(result.token_ids),
            weight_version=min(q.min_version, result.weight_version) if produced else q.min_version,
            prompt=q.traj.prompt.row,
        )

    def aborted(self, q: Queued, result: GenResult | None) -> None:
        """Stopped by a shrink (``result`` holds its tokens) or lost with its worker (``None``)."""
        if result is not None and _produced(q, result):
            # Only a segment that produced tokens says which weights it used (a sleeping
            # worker hands the request back untouched, with no version).
            q.request = continuation(q.traj.request, result)
            q.gen_s += result.gen_s
            q.segments += 1
            q.min_version = min(q.min_version, result.weight_version)
        if q.traj_id in self.dropped:
            return
        self.requeued += 1
        self.orphaned += result is None
        self.queue.appendleft(q)

    def failed(self, q: Queued, reason: str) -> None:
        """An application error: retry from where it was, or raise once every try failed."""
        if q.traj_id in self.dropped:
            return
        q.errors += 1
        if q.errors >= self.max_tries:
            raise TrajectoryFailed(f"trajectory {q.traj_id} (step {q.traj.step}) failed {q.errors} times: {reason}")
        self.queue.appendleft(q)


def _produced(q: Queued, result: GenResult) -> bool:
    return len(result.token_ids) > len(q.request.prefix_ids)
