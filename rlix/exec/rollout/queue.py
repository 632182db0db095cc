"""Executor layer: one pipeline's rollout queue (what runs next, what continues after an abort).

Pure (no Ray, no asyncio), in the manner of an engine scheduler: :meth:`assign`
hands queued trajectories to free worker slots, in the order of
:class:`rlix.lengths.PredictedQueue` (continuations first, then as drawn until
lengths are seen to repeat with their prompts, then predicted-longest first,
lengths in tokens; a job's ``dispatch: drawn`` keeps the drawn order), and returns the assignments;
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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlix.exec.data.recipe import Trajectory, continuation
from rlix.exec.messages import GenRequest, GenResult
from rlix.exec.records import TrajRecord
from rlix.exec.rollout.pool import Worker, WorkerPool
from rlix.lengths import Group, LengthPredictor, PredictedQueue

if TYPE_CHECKING:
    from rlix.exec.config import JobConfig


class TrajectoryFailed(RuntimeError):
    """A trajectory failed on every try (an application error, not a lost worker)."""


@dataclass(kw_only=True, eq=False)  # an entry is itself: queues find it by identity
class Queued:
    """A trajectory waiting for (or running in) a slot, possibly the rest of an aborted one."""

    traj: Trajectory
    request: GenRequest  # what to send next (a continuation after an abort)
    gen_s: float = 0.0  # generation seconds of the segments so far
    segments: int = 0
    min_version: int = 1 << 30  # oldest weight version that produced a token so far
    errors: int = 0  # application errors so far
    need: int = 0  # its batch's weight version: no older full weights may produce its tokens
    group: Group | None = None  # its prompt's group in its step (the PredictedQueue's, with the three below)
    idx: int = 0  # drawn order, unique in the queue
    predicted: float = math.nan
    queued: bool = False

    @property
    def traj_id(self) -> int:
        return self.traj.request.traj_id


class RolloutQueue:
    """Waiting trajectories by predicted length; continuations go to the front (they hold a batch back)."""

    def __init__(self, *, max_tries: int, ordered: bool = True) -> None:
        """``ordered``: predicted-longest first once the predictor is trusted (the job's ``dispatch: predicted``);
        False serves the drawn order throughout, the predictor still learning and scored (``dispatch: drawn``)."""
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        self.max_tries = max_tries
        self.predictor = LengthPredictor()
        self.queue = PredictedQueue(self.predictor, ordered=ordered)
        self._waiting: dict[int, Queued] = {}  # traj id -> its entry, while queued
        self._made = 0
        self.requeued = 0  # trajectories put back after an abort or a dead worker
        self.orphaned = 0  # of those, put back because their worker died
        self.dropped: set[int] = set()  # trajectories of batches that will never be trained

    @classmethod
    def for_job(cls, job: JobConfig) -> RolloutQueue:
        """The queue a job's rollout uses: its tries per trajectory, and its ``dispatch`` order."""
        return cls(max_tries=job.limits.rollout_tries, ordered=job.dispatch == "predicted")

    def __len__(self) -> int:
        return len(self.queue)

    def waiting(self) -> list[int]:
        """Ids of the trajectories waiting for a slot, ascending."""
        return sorted(self._waiting)

    def add(self, trajs: list[Trajectory], version: int = 0) -> None:
        """Queue a batch that needs weights ``version`` or newer: a prompt's samples in a step are its
        group (eval prompts apart from the trained ones).

        Trained samples name their group; eval ones have none (-1) and are grouped by their row.
        """
        groups: dict[tuple, Group] = {}
        made = []
        for t in trajs:
            key = (t.request.adapter, t.eval, t.step, t.prompt.row if t.eval else t.group)
            q = Queued(traj=t, request=t.request, idx=self._made, need=version)
            q.group = groups.get(key) or groups.setdefault(key, Group(key[:2], t.step, t.prompt.row, q.idx))
            self._made += 1
            self._waiting[q.traj_id] = q
            made.append(q)
        self.queue.extend(made)

    def drop(self, traj_ids: set[int]) -> None:
        """These trajectories' batch will never be trained: out of the queue, and never put back."""
        self.dropped |= traj_ids
        self.queue.discard([self._waiting.pop(i) for i in sorted(traj_ids) if i in self._waiting])

    def assign(
        self, pool: WorkerPool, ready: Callable[[Worker, Queued], bool] = lambda w, q: True
    ) -> list[tuple[Worker, Queued]]:
        """Fill free slots of awake workers, lowest GPU first, while ``ready`` says the trajectory at
        the front may start on the worker (its weights: :func:`rlix.job.weight_gate`).

        Each assigned trajectory takes its slot at once (``worker.inflight``
        gets its id, with no task yet); the caller starts each pair's task.
        """
        out = []
        for worker in pool.free_slots():
            while self.queue and len(worker.inflight) < pool.slots_per_worker and ready(worker, self.queue[0]):
                q = self.queue.popleft()
                del self._waiting[q.traj_id]
                worker.inflight[q.traj_id] = None
                out.append((worker, q))
        return out

    # ------------------------------------------------------------ outcomes

    def finished(self, q: Queued, result: GenResult) -> TrajRecord:
        produced = _produced(q, result)
        self.queue.finished(q, max(len(result.token_ids), 1))  # its length, in tokens, teaches its group
        return TrajRecord(
            traj_id=q.traj_id,
            stream=q.traj.request.adapter,
            step=q.traj.step,
            gen_s=q.gen_s + result.gen_s,
            segments=q.segments + 1,
            tokens=len(result.token_ids),
            weight_version=min(q.min_version, result.weight_version) if produced else q.min_version,
            prompt=q.traj.prompt.row,
            predicted=None if math.isnan(q.predicted) else q.predicted,
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
        self._put_back(q)

    def failed(self, q: Queued, reason: str) -> None:
        """An application error: retry from where it was, or raise once every try failed."""
        if q.traj_id in self.dropped:
            return
        q.errors += 1
        if q.errors >= self.max_tries:
            raise TrajectoryFailed(f"trajectory {q.traj_id} (step {q.traj.step}) failed {q.errors} times: {reason}")
        self._put_back(q)

    def _put_back(self, q: Queued) -> None:
        self._waiting[q.traj_id] = q
        self.queue.extendleft([q])


def _produced(q: Queued, result: GenResult) -> bool:
    return len(result.token_ids) > len(q.request.prefix_ids)
