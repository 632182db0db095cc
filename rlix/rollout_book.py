"""Shared layer: a job's rollout book, the one owner of its trajectories from their batch's arrival to their finish.

The job's step machine holds it (``StepMachine.book``, made from the job's
plan) and reads its waiting trajectories into each demand report. Both shells
drive it: the simulator's engine in seconds, the executor's queue in tokens.
It is sans-IO: it holds no clock and calls nothing. The shell says
what happened to a trajectory (its batch arrived, it started, finished, was
taken off its worker, failed) and the book says what follows. The rules it
holds are written here once:

- **Order.** Waiting trajectories start in the order of
  :class:`~rlix.lengths.PredictedQueue` where they carry prompt groups
  (predicted-longest first once lengths are seen to repeat), as drawn
  otherwise. Trajectories taken off a worker wait at the front, ahead of any
  new work: they hold their batch back.
- **Placement.** Free slots fill lowest GPU first. A job placed
  ``longest_held`` fills the workers it has held longest first wherever the
  waiting trajectories fill every free slot (:meth:`RolloutBook.fill_order`).
- **Preemption.** A shrink that takes running trajectories off a worker is a
  preemption (:meth:`RolloutBook.preempted`). Those trajectories, and those of
  a worker process lost (the executor's), are never lost: they go back to the
  front (:meth:`RolloutBook.put_back`), to continue from their progress. They
  wait in the order they last started (:func:`~rlix.lengths.to_front`): a
  shrink takes them off their workers, not out of the order they were
  dispatched in, whatever order they come back in. The simulator puts a
  worker's back at once; the executor puts each back as its worker hands it
  back; those waiting at one time wait in one order in both shells.
  Progress is the shell's too: seconds in the simulator (which restarts them
  instead where a trace says ``preempt: requeue``), tokens in the executor.
- **Failure.** An application error is retried from where the trajectory was,
  at the front like a preempted one, up to ``max_tries`` tries in all; then
  :class:`TrajectoryFailed`.
- **Dropped batches.** A batch that will never be trained leaves the queue,
  and none of its trajectories comes back.
- **Completion.** A batch is rolled out when its last trajectory finishes; its
  :class:`BatchTally` (made here) says so, with the oldest weights
  under it.
- **Demand.** A report states the trajectories waiting, ``len(book)`` (the
  executor adds those still coming back from a draining worker).

An entry is the shell's own object for a trajectory. It has ``idx`` (unique,
in drawn order: the last tie-breaker), ``group`` (its prompt's
:class:`~rlix.lengths.Group`, set here; None without prompt ids) and
``tally`` (its batch's, set here), ``served`` (the order it last started in,
:data:`~rlix.lengths.NOT_STARTED` until then; set by the queue), and the
:class:`~rlix.lengths.PredictedQueue`'s ``predicted`` and ``queued``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from rlix.lengths import DrawnQueue, Group, LengthPredictor, PredictedQueue


class BatchTally:
    """One rollout batch's count: trajectories still to finish, and the oldest weights the finished ones
    started on. The batch is rolled out when the last finishes; its step's staleness is judged by that
    oldest version (:meth:`rlix.step.StepMachine.rolled`). The rollout book makes one per batch."""

    __slots__ = ("left", "oldest")

    def __init__(self, n: int) -> None:
        self.left = n
        self.oldest = math.inf  # no trajectory finished yet

    def finished(self, version: float) -> bool:
        """A trajectory finished whose oldest weights were ``version`` (its first segment's: weights only get
        newer); True if it was the batch's last."""
        if version < self.oldest:
            self.oldest = version
        self.left -= 1
        return self.left == 0


class TrajectoryFailed(RuntimeError):
    """A trajectory failed on every try (an application error, not a lost worker)."""


class RolloutBook:
    """One job's trajectories: waiting in dispatch order, and their batches' tallies.

    ``queue`` is the dispatch order: a shell reads the next trajectory to start as ``queue[0]`` and starts
    it with ``queue.popleft()``; what runs where is the shell's."""

    def __init__(
        self, predictor: LengthPredictor | None = None, *, ordered: bool = True, longest_held: bool = False, max_tries: int = 1
    ) -> None:
        """``predictor``: entries carry prompt groups and wait in a :class:`PredictedQueue` (``ordered``
        False keeps the drawn order while the predictor learns and is scored); None: the drawn order, no
        groups. ``longest_held``: the placement of :meth:`fill_order`. ``max_tries``: tries a trajectory
        gets before an application error fails it."""
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        self.predictor = predictor
        self.longest_held = longest_held
        self.max_tries = max_tries
        self.queue: DrawnQueue | PredictedQueue = (
            DrawnQueue() if predictor is None else PredictedQueue(predictor, ordered=ordered)
        )
        self.made = 0  # entries added: the next one's idx
        self.completed = 0
        self.requeued = 0  # put back after a shrink or a lost worker
        self.orphaned = 0  # of those, put back because their worker was lost
        self.preemptions = 0  # shrinks that took running trajectories off a worker
        self._errors: dict[int, int] = {}  # idx -> application errors so far
        self._dropped: set[int] = set()  # idx of entries whose batch will never be trained

    def __len__(self) -> int:
        return len(self.queue)

    def __bool__(self) -> bool:
        return bool(self.queue)

    def fill_order(self, free: Sequence[tuple[int, int, int]]) -> list[int]:
        """The order in which a shell fills free slots: ``free`` holds (first GPU, grant, free slots) of each
        worker with a free slot that the job holds now and that is neither loading nor syncing its weights,
        ``grant`` counting the times the plan gave the job a worker, up to this one's latest.

        Lowest GPU first. With ``longest_held``, where the trajectories waiting fill every one of those
        slots, the workers the job has held longest (lowest ``grant``) first: the front of the queue (put
        back trajectories, then, under ``dispatch: predicted`` once the prediction is trusted, the
        predicted-longest) goes where the job has stayed longest. Where fewer wait, lowest GPU first, and
        the same workers are left empty. Where the weight gate lets every trajectory start anywhere, each
        worker gets as many either way; where it holds some back (a worker to sync first, a batch on
        newer weights), the order can change that too.

        Each shell walks its workers lowest GPU first itself and asks only a job placed ``longest_held``
        (the simulator's fill is its hot loop)."""
        if self.longest_held and sum(n for _, _, n in free) <= len(self.queue):
            return [gpu for gpu, _, _ in sorted(free, key=lambda f: (f[1], f[0]))]
        return sorted(gpu for gpu, _, _ in free)

    # ------------------------------------------------------------ arrivals

    def add(self, entries: Sequence, prompts: Sequence[tuple[Hashable, int, int]] | None = None) -> BatchTally:
        """A batch arrives: ``entries`` in drawn order, each ``idx`` counted from :attr:`made`. With a
        predictor, ``prompts`` gives each entry's (stream, step, prompt): entries sharing one are its group.
        Returns the batch's tally."""
        if self.predictor is not None and prompts is None:
            raise ValueError("this book orders by predicted length: give each trajectory its prompt")
        tally = BatchTally(len(entries))
        for e in entries:
            e.tally = tally
        if self.predictor is not None:
            groups: dict[tuple[Hashable, int, int], Group] = {}
            for e, key in zip(entries, prompts):
                g = groups.get(key)
                if g is None:
                    g = groups[key] = Group(*key, e.idx)  # its first trajectory's idx: the group's tie-breaker
                e.group = g
        self.queue.extend(entries)
        self.made += len(entries)
        return tally

    # ------------------------------------------------------------ outcomes

    def finished(self, e, length: float, version: int) -> bool:
        """``e`` finished after ``length`` (seconds or tokens) on weights no older than ``version``: its
        group learns. Returns whether its batch is rolled out now (``e.tally`` holds the oldest weights)."""
        if self._dropped and e.idx in self._dropped:
            return False
        if self._errors:
            self._errors.pop(e.idx, None)
        self.completed += 1
        if e.group is not None:
            self.queue.finished(e, length)
        return e.tally.finished(version)

    def preempted(self, running: int) -> None:
        """A shrink took ``running`` trajectories off a worker (each goes back through :meth:`put_back`)."""
        if running:
            self.preemptions += 1

    def put_back(self, entries: Sequence, *, lost: bool = False) -> None:
        """Trajectories taken off a worker by a shrink (``lost``: their worker process was lost) go to
        the front, ahead of everything waiting, in the order they last started (whatever order they are
        given in); a dropped batch's stay out."""
        back = [e for e in entries if e.idx not in self._dropped] if self._dropped else entries
        self.requeued += len(back)
        if lost:
            self.orphaned += len(back)
        self.queue.put_back(back)

    def failed(self, e, reason: str, name: str) -> None:
        """An application error in ``e`` (``name`` says which trajectory): tried again from the front,
        or :class:`TrajectoryFailed` once every try failed."""
        if self._dropped and e.idx in self._dropped:
            return
        tries = self._errors[e.idx] = self._errors.get(e.idx, 0) + 1
        if tries >= self.max_tries:
            raise TrajectoryFailed(f"{name} failed {tries} times: {reason}")
        self.queue.put_back([e])

    def drop(self, entries: Sequence) -> None:
        """These entries' batch will never be trained: the waiting ones leave the queue, and none comes back."""
        self._dropped.update(e.idx for e in entries)
        if isinstance(self.queue, PredictedQueue):
            self.queue.discard(entries)
        else:  # in place: a shell may hold the queue
            kept = [e for e in self.queue if e.idx not in self._dropped]
            self.queue.clear()
            self.queue.extend(kept)
