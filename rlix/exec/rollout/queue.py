"""Executor layer: one pipeline's rollout queue, the executor's side of its rollout book.

Pure (no Ray, no asyncio). What runs next and what follows each outcome is
the job's :class:`rlix.rollout_book.RolloutBook`, as in the simulator: the
order of :class:`rlix.lengths.PredictedQueue` (lengths in tokens; a job's
``dispatch: drawn`` keeps the drawn order), continuations at the front,
bounded retries, dropped batches, each batch's tally. This module keeps the
executor's units: :meth:`RolloutQueue.assign` hands queued trajectories to
free worker slots and returns the assignments; the shell runs them and
reports each outcome back through one method per outcome:

- finished: the trajectory is recorded (its generation seconds, segments and
  the oldest weight version that produced a token);
- aborted by a shrink, or its worker process died: it goes back to the front
  of the queue, continued from the tokens it has (never lost, never retried
  from scratch);
- an application error (the engine refused the request, the backend raised):
  retried up to ``max_tries`` times in all, then
  :class:`~rlix.rollout_book.TrajectoryFailed` fails the job with a one-line
  reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rlix.exec.data.recipe import Trajectory, continuation
from rlix.exec.messages import GenRequest, GenResult
from rlix.exec.records import TrajRecord
from rlix.exec.rollout.pool import Worker, WorkerPool
from rlix.lengths import NOT_STARTED, Group
from rlix.rollout_book import BatchTally, RolloutBook


@dataclass(kw_only=True, eq=False)  # an entry is itself: queues find it by identity
class Queued:
    """A trajectory waiting for (or running in) a slot, possibly the rest of an aborted one."""

    traj: Trajectory
    request: GenRequest  # what to send next (a continuation after an abort)
    gen_s: float = 0.0  # generation seconds of the segments so far
    segments: int = 0
    min_version: int = 1 << 30  # oldest weight version that produced a token so far
    need: int = 0  # its batch's weight version: no older full weights may produce its tokens
    idx: int = 0  # drawn order, unique in the book
    # Set by the rollout book: its batch's tally and its prompt's group; by its queue: what it was predicted, the
    # order it last started in, and whether it waits.
    tally: BatchTally | None = None
    group: Group | None = None
    predicted: float = math.nan
    served: int = NOT_STARTED
    queued: bool = False

    @property
    def traj_id(self) -> int:
        return self.traj.request.traj_id


class RolloutQueue:
    """A job's trajectories in executor terms (requests, tokens, records) over its rollout book."""

    def __init__(self, book: RolloutBook) -> None:
        """``book``: the job's, its step machine's (:func:`rlix.step.rollout_book`): a prompt's trajectories in a
        step are its group, so it keeps a length predictor."""
        if book.predictor is None:
            raise ValueError("the executor's trajectories carry prompts: their book predicts lengths")
        self.book = book
        self.queue = book.queue
        self._live: dict[int, Queued] = {}  # traj id -> its entry, until it finishes

    def __len__(self) -> int:
        return len(self.book)

    def waiting(self) -> list[int]:
        """Ids of the trajectories waiting for a slot, ascending."""
        return sorted(q.traj_id for q in self._live.values() if q.queued)

    def add(self, trajs: list[Trajectory], version: int = 0) -> BatchTally:
        """Queue a batch that needs weights ``version`` or newer: a prompt's samples in a step are its
        group (eval prompts apart from the trained ones). Returns the batch's tally."""
        made = [Queued(traj=t, request=t.request, idx=self.book.made + i, need=version) for i, t in enumerate(trajs)]
        self._live.update((q.traj_id, q) for q in made)
        prompts = [((t.request.adapter, t.eval), t.step, t.prompt.row) for t in trajs]
        return self.book.add(made, prompts)

    def drop(self, traj_ids: set[int]) -> None:
        """These trajectories' batch will never be trained: out of the queue, and never put back."""
        self.book.drop([self._live.pop(i) for i in sorted(traj_ids) if i in self._live])

    def assign(
        self,
        pool: WorkerPool,
        ready: Callable[[Worker, Queued], bool] = lambda w, q: True,
        startable: Callable[[Worker], bool] = lambda w: True,
    ) -> list[tuple[Worker, Queued]]:
        """Fill free slots of awake workers, in the book's order (:meth:`RolloutBook.fill_order`: lowest GPU
        first by default), while ``ready`` says the trajectory at the front may start on the worker (its
        weights: :func:`rlix.job.weight_gate`); the book's order is over the workers ``startable`` says
        any trajectory could start on now.

        Each assigned trajectory takes its slot at once (``worker.inflight``
        gets its id, with no task yet); the caller starts each pair's task.
        """
        out = []
        queue = self.queue
        workers = pool.free_slots()
        if self.book.longest_held:
            by_gpu = {w.first: w for w in workers if startable(w)}
            free = [(w.first, w.grant_seq, pool.slots_per_worker - len(w.inflight)) for w in by_gpu.values()]
            workers = [by_gpu[g] for g in self.book.fill_order(free)]
        for worker in workers:
            while queue and len(worker.inflight) < pool.slots_per_worker and ready(worker, queue[0]):
                q = queue.popleft()
                worker.inflight[q.traj_id] = None
                out.append((worker, q))
        return out

    # ------------------------------------------------------------ outcomes

    def finished(self, q: Queued, result: GenResult) -> tuple[TrajRecord, bool]:
        """``q`` finished with ``result``: its record, and whether its batch is rolled out now (``q.tally``)."""
        produced = _produced(q, result)
        record = TrajRecord(
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
        self._live.pop(q.traj_id, None)
        # Its length, in tokens, teaches its group; its oldest weights over every segment go to its batch's tally.
        return record, self.book.finished(q, max(len(result.token_ids), 1), record.weight_version)

    def aborted(self, q: Queued, result: GenResult | None) -> None:
        """Stopped by a shrink (``result`` holds its tokens) or lost with its worker (``None``)."""
        if result is not None and _produced(q, result):
            # Only a segment that produced tokens says which weights it used (a sleeping
            # worker hands the request back untouched, with no version).
            q.request = continuation(q.traj.request, result)
            q.gen_s += result.gen_s
            q.segments += 1
            q.min_version = min(q.min_version, result.weight_version)
        self.book.put_back([q], lost=result is None)

    def failed(self, q: Queued, reason: str) -> None:
        """An application error: retry from where it was, or raise once every try failed."""
        self.book.failed(q, reason, f"trajectory {q.traj_id} (step {q.traj.step})")


def _produced(q: Queued, result: GenResult) -> bool:
    return len(result.token_ids) > len(q.request.prefix_ids)
