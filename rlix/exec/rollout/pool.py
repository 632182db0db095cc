"""Executor layer: one pipeline's rollout workers, one per bundle, and their lifecycle.

Pure book-keeping (no Ray, no asyncio): the coordinator asks the pool what
state a bundle's worker is in and moves it along the table below; every
move goes through :data:`WORKER_TRANSITIONS` and an illegal one raises.
Whether the plan currently gives the pipeline a bundle's GPUs (``granted``)
is kept apart from the process state: a worker may be asleep on GPUs it was
just given (about to wake), or still awake on GPUs being taken back.

    absent -> starting -> asleep -> waking -> awake -> draining -> asleep
                 |          |  ^      |         |          |
                 |          |  +------+ (the device lacked the memory: nothing loaded)
                 +----------+---------+---------+----------+--> dead -> starting

- starting: the process is being created (imports, config; no GPU memory);
- asleep: the process is up, holds no weights on the device;
- waking: loading the newest weights (and building the engine, where that needs the device);
  a wake refused before it loads anything, because the device lacks the memory it
  needs, leaves the process asleep (kept for a later wake elsewhere or there);
- awake: generating; only awake workers take trajectories;
- draining: aborting in-flight work and dropping weights (a shrink). A shrink
  never cuts a wake short: it waits for the wake to end (awake, or dead on a
  missed deadline), so there is no waking -> draining edge;
- dead: the process died or was killed (e.g. it did not wake in time).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rlix.core.types import Gpus, WorkerLoad


class WorkerState(enum.Enum):
    STARTING = "starting"
    ASLEEP = "asleep"
    WAKING = "waking"
    AWAKE = "awake"
    DRAINING = "draining"
    DEAD = "dead"


WORKER_TRANSITIONS: dict[WorkerState | None, frozenset[WorkerState]] = {
    None: frozenset({WorkerState.STARTING}),
    WorkerState.STARTING: frozenset({WorkerState.ASLEEP, WorkerState.DEAD}),
    WorkerState.ASLEEP: frozenset({WorkerState.WAKING, WorkerState.DEAD}),
    WorkerState.WAKING: frozenset({WorkerState.AWAKE, WorkerState.ASLEEP, WorkerState.DEAD}),
    WorkerState.AWAKE: frozenset({WorkerState.DRAINING, WorkerState.DEAD}),
    WorkerState.DRAINING: frozenset({WorkerState.ASLEEP, WorkerState.DEAD}),
    WorkerState.DEAD: frozenset({WorkerState.STARTING}),
}


class LifecycleError(RuntimeError):
    """A worker was moved along an edge the lifecycle table does not have (an executor bug)."""


@dataclass(kw_only=True)
class Worker:
    """The worker on one bundle. ``handle`` is whatever the shell talks to (a Ray actor)."""

    gpus: Gpus
    state: WorkerState | None = None
    granted: bool = False  # the plan gives this pipeline the bundle's GPUs now
    generation: int = 0  # bumped by every expand and shrink: an older call finds itself stale
    leaving: int = 0  # shrinks under way: the plan took the GPUs back, the worker is still on them
    handle: object | None = None
    inflight: dict[int, object] = field(default_factory=dict)  # trajectory id -> the shell's task
    version: int = -1  # the full weights it holds, as its last wake or sync said (-1: none)
    grant_seq: int = 0  # the pool's grants so far when the plan last gave it to the job (RolloutBook.fill_order)

    @property
    def first(self) -> int:
        return self.gpus[0]


class WorkerPool:
    """Every worker of one pipeline, keyed by the first GPU of its bundle."""

    def __init__(self, slots_per_worker: int) -> None:
        if slots_per_worker < 1:
            raise ValueError("slots_per_worker must be >= 1")
        self.slots_per_worker = slots_per_worker
        self.workers: dict[int, Worker] = {}
        self.rejoined: dict[int, int] = {}  # first GPU -> generation of a leaving worker a rejoin reported
        self.grants = 0  # times the plan gave the job a worker

    def get(self, gpus: Gpus) -> Worker:
        """The bundle's worker (created absent on first sight)."""
        w = self.workers.get(gpus[0])
        if w is None:
            w = self.workers[gpus[0]] = Worker(gpus=tuple(gpus))
        elif w.gpus != tuple(gpus):
            raise LifecycleError(f"bundle {tuple(gpus)} overlaps the worker on {w.gpus}")
        return w

    def move(self, worker: Worker, target: WorkerState) -> None:
        """Move ``worker`` to ``target`` through the transition table (illegal moves raise)."""
        if target not in WORKER_TRANSITIONS[worker.state]:
            now = worker.state.value if worker.state is not None else "absent"
            raise LifecycleError(f"worker on GPUs {list(worker.gpus)}: cannot go from {now} to {target.value}")
        worker.state = target
        if target is WorkerState.DEAD:
            worker.handle = None

    def grant(self, worker: Worker) -> None:
        """The plan gives the job this worker's GPUs now."""
        worker.granted = True
        self.grants += 1
        worker.grant_seq = self.grants

    def bump(self, worker: Worker) -> int:
        worker.generation += 1
        return worker.generation

    # ------------------------------------------------------------ queries

    def in_state(self, *states: WorkerState) -> list[Worker]:
        return [self.workers[f] for f in sorted(self.workers) if self.workers[f].state in states]

    def free_slots(self) -> list[Worker]:
        """Awake workers with a free slot, lowest GPU first."""
        return [w for w in self.in_state(WorkerState.AWAKE) if len(w.inflight) < self.slots_per_worker]

    def loads(self) -> tuple[WorkerLoad, ...]:
        """Trajectories running per awake worker (the demand report's ``loads``)."""
        return tuple(WorkerLoad(first_gpu=w.first, active=len(w.inflight)) for w in self.in_state(WorkerState.AWAKE))

    def starting(self) -> list[int]:
        """First GPUs of the bundles whose process is starting in the background (the demand
        report's ``starting``: the scheduler places no worker there until it is up)."""
        return [w.first for w in self.in_state(WorkerState.STARTING) if not w.granted]

    def leaving_trajectories(self) -> int:
        """Trajectories still in flight on workers a shrink is draining: they come back to the
        queue, so the demand report counts them as queued (finished + queued + running then
        stays the same through a shrink, as the scheduler's batch credit expects)."""
        return sum(len(w.inflight) for w in self.in_state(WorkerState.DRAINING))

    def bundles(self) -> tuple[Gpus, ...]:
        """Bundles this pipeline's workers are on now: granted by the plan, or still being freed by a
        shrink (what a rejoin reports: a restarted scheduler must not give those GPUs to another job yet)."""
        return tuple(w.gpus for f, w in sorted(self.workers.items()) if w.granted or w.leaving)

    def rejoin_bundles(self) -> tuple[Gpus, ...]:
        """What a rejoin reports (:meth:`bundles`). A worker in it that only a shrink of the scheduler's
        previous life still frees is booked again by the restarted one, so it is noted here, to be
        reported lost once that shrink is done (:meth:`freed_after_rejoin`)."""
        for w in self.workers.values():
            if w.leaving and not w.granted:
                self.rejoined[w.first] = w.generation
        return self.bundles()

    def freed_after_rejoin(self, w: Worker, gen: int) -> bool:
        """The shrink of generation ``gen`` is done: whether a rejoin reported ``w`` during it, and no newer
        plan call (of the restarted scheduler) has taken the worker over since."""
        return self.rejoined.pop(w.first, None) == gen == w.generation and not w.granted

    def held_gpus(self) -> Gpus:
        """GPUs the plan gives this pipeline's rollout workers now."""
        return tuple(sorted(g for w in self.workers.values() if w.granted for g in w.gpus))
