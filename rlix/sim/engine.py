"""Simulator layer: one pipeline's rollout workers, slot by slot.

The engine is a single SimPy process per pipeline that sleeps until the next
thing that changes its state (a trajectory finishing or a worker finishing
its load) and is woken early when the plan adds or removes workers or a new
batch arrives. Trajectories are plain objects in a heap, not SimPy
processes, so a million of them replay in seconds.

It makes no scheduling decision: which workers exist is the plan's call.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from rlix.core import RolloutWorker, WorkerLoad
from rlix.metrics import Activity, UsageRecorder


class Batch:
    """One step's rollout of one stream: ``n`` trajectories under weight ``version``."""

    __slots__ = ("stream", "step", "version", "n", "left", "done", "lora")

    def __init__(self, env: simpy.Environment, stream: int, step: int, version: int, n: int, lora: bool) -> None:
        self.stream = stream
        self.step = step
        self.version = version
        self.n = n
        self.left = n
        self.done = env.event()
        self.lora = lora


class Traj:
    __slots__ = ("batch", "duration", "remaining", "started", "worker", "token")

    def __init__(self, batch: Batch, duration: float) -> None:
        self.batch = batch
        self.duration = duration  # seconds of decoding in all
        self.remaining = duration  # seconds still to decode
        self.started = 0.0  # when it (re)started decoding on its worker
        self.worker: SimWorker | None = None
        self.token = 0  # bumped on preemption: older heap entries are stale


class SimWorker:
    __slots__ = ("worker", "ready_at", "active", "versions", "alive")

    def __init__(self, worker: RolloutWorker, ready_at: float, versions: dict[int, int]) -> None:
        self.worker = worker
        self.ready_at = ready_at  # seconds: loading (and syncing) until then
        self.active: set[Traj] = set()
        self.versions = versions  # stream -> weight/adapter version loaded
        self.alive = True


class RolloutEngine:
    """Runs a pipeline's trajectories on the workers the plan gives it."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        pipeline_id: str,
        slots: int,
        usage: UsageRecorder,
        weight_sync_s: float,
        adapter_sync_s: float,
        requeue: bool,
        resume_s: float,
        on_change: Callable[[], None],
        on_pending: Callable[[int], None],
    ) -> None:
        self.env = env
        self.pipeline_id = pipeline_id
        self.slots = slots
        self.usage = usage
        self.weight_sync_s = weight_sync_s
        self.adapter_sync_s = adapter_sync_s
        self.requeue = requeue  # True: restart aborted trajectories; False: continue them
        self.resume_s = resume_s  # seconds to re-prefill a continued trajectory
        self.on_change = on_change  # demand changed: the simulator asks for a report later
        self.on_pending = on_pending  # +1 / -1 when trajectories start / stop waiting for a slot
        self._had_pending = False
        self._scan_all = False  # new work arrived: every worker may have free slots
        self.open_n = 0  # trajectories in all unfinished batches
        self.workers: dict[int, SimWorker] = {}  # first GPU -> worker
        self.pending: deque[Traj] = deque()
        self.heap: list[tuple[float, int, int, Traj]] = []  # (finish, seq, token, traj)
        self.loading: list[tuple[float, int, SimWorker]] = []  # (ready_at, first GPU, worker)
        self.running = 0
        self.batch_left = 0  # trajectories of unfinished batches
        self.completed = 0
        self.completed_s = 0.0  # decode seconds of the finished trajectories
        self.aborted = 0
        self.switch_extra = 0.0  # GPU-seconds of adapter sync inside busy workers
        self._seq = 0
        self._sleeping = False
        self.proc = env.process(self._run())

    # ------------------------------------------------------------ commands

    def add_batch(self, batch: Batch, durations: np.ndarray) -> None:
        self.pending.extend(Traj(batch, float(d)) for d in durations)
        self.batch_left += batch.n
        self.open_n += batch.n
        self._scan_all = True
        self._note_pending()
        self.on_change()
        self._kick()

    def add_worker(self, worker: RolloutWorker, ready_at: float, versions: dict[int, int]) -> None:
        w = SimWorker(worker, ready_at, versions)
        self.workers[worker.gpus[0]] = w
        heapq.heappush(self.loading, (ready_at, worker.gpus[0], w))
        self._kick()

    def remove_worker(self, worker: RolloutWorker) -> int:
        """Tear a worker down now; its trajectories go back to the queue. Returns how many."""
        w = self.workers.pop(worker.gpus[0])
        w.alive = False
        now = self.env.now
        aborted = sorted(w.active, key=lambda t: (t.batch.stream, t.batch.step, t.started, t.duration))
        for t in reversed(aborted):
            if self.requeue:
                t.remaining = t.duration
            else:
                t.remaining = max(t.remaining - max(0.0, now - t.started), 0.0) + self.resume_s
            t.token += 1
            t.worker = None
            self.pending.appendleft(t)
        self.running -= len(aborted)
        self.aborted += len(aborted)
        w.active.clear()
        if aborted:
            self._scan_all = True
            self.on_change()
            self._note_pending()
        self._kick()
        return len(aborted)

    # ------------------------------------------------------------ queries

    def demand(self, batch_size: int) -> tuple[int, tuple[WorkerLoad, ...], int]:
        loads = tuple(WorkerLoad(first_gpu=g, active=len(w.active)) for g, w in sorted(self.workers.items()) if w.active)
        return len(self.pending), loads, batch_size

    @property
    def mean_trajectory_s(self) -> float:
        """Mean decode seconds of the trajectories finished so far (0 before the first)."""
        return self.completed_s / self.completed if self.completed else 0.0

    @property
    def unmet(self) -> bool:
        return bool(self.pending)

    def target_workers(self) -> int:
        return math.ceil((len(self.pending) + self.running) / self.slots)

    # ------------------------------------------------------------ the process

    def _kick(self) -> None:
        if self._sleeping and self.env.active_process is not self.proc:
            self._sleeping = False
            self.proc.interrupt()

    def _run(self):
        env = self.env
        while True:
            wake = self._next_wake()
            self._sleeping = True
            try:
                if wake is None:
                    yield env.event()  # nothing scheduled: wait for a kick
                else:
                    yield env.timeout(max(wake - env.now, 0.0))
            except simpy.Interrupt:
                pass
            self._sleeping = False
            self._advance(env.now)

    def _next_wake(self) -> float | None:
        heap = self.heap
        while heap and heap[0][2] != heap[0][3].token:
            heapq.heappop(heap)
        loading = self.loading
        while loading and not loading[0][2].alive:
            heapq.heappop(loading)
        times = []
        if heap:
            times.append(heap[0][0])
        if loading:
            times.append(loading[0][0])
        return min(times) if times else None

    def _advance(self, now: float) -> None:
        touched: dict[int, SimWorker] = {}
        loading = self.loading
        while loading and loading[0][0] <= now:
            _, g, w = heapq.heappop(loading)
            if w.alive:
                touched[g] = w
        heap = self.heap
        finished = 0
        while heap and heap[0][0] <= now:
            _, _, token, t = heapq.heappop(heap)
            if token != t.token:
                continue
            w = t.worker
            w.active.discard(t)
            t.worker = None
            self.running -= 1
            finished += 1
            self.completed_s += t.duration
            batch = t.batch
            batch.left -= 1
            if batch.left == 0:
                self.open_n -= batch.n
                batch.done.succeed()
            touched[w.worker.gpus[0]] = w
        if finished:
            self.completed += finished
            self.batch_left -= finished
        if self.pending:
            # Only workers whose state changed can have a usable free slot,
            # unless new work arrived since the last look.
            candidates = sorted(self.workers) if self._scan_all else sorted(touched)
            for g in candidates:
                w = self.workers.get(g)
                if w is not None and w.ready_at <= now and len(w.active) < self.slots:
                    if self._fill(w, now):
                        touched[g] = w
                if not self.pending:
                    break
            self._note_pending()
        self._scan_all = False
        for g in sorted(touched):
            w = touched[g]
            if w.alive and w.ready_at <= now:
                self.usage.set(w.worker.gpus, now, Activity.WORK if w.active else Activity.HELD, self.pipeline_id, "rollout")
        if finished or touched:
            self.on_change()

    def _note_pending(self) -> None:
        has = bool(self.pending)
        if has != self._had_pending:
            self._had_pending = has
            self.on_pending(1 if has else -1)

    def _fill(self, w: SimWorker, now: float) -> bool:
        """Start pending trajectories on ``w``'s free slots; sync stale weights first."""
        started = False
        pending = self.pending
        while pending and len(w.active) < self.slots:
            t = pending[0]
            batch = t.batch
            have = w.versions.get(batch.stream, -1)
            delay = 0.0
            if have < batch.version:
                if not batch.lora:
                    if w.active:
                        break  # full weights change only between batches: drain first
                    # Sync the newest weights before decoding (on demand, from the CPU copy).
                    w.versions[batch.stream] = batch.version
                    w.ready_at = now + self.weight_sync_s
                    heapq.heappush(self.loading, (w.ready_at, w.worker.gpus[0], w))
                    self.usage.set(w.worker.gpus, now, Activity.SWITCH, self.pipeline_id, "weight_sync")
                    return started
                # A LoRA adapter loads beside the others; its load delays this trajectory.
                w.versions[batch.stream] = batch.version
                delay = self.adapter_sync_s
                self.switch_extra += delay * len(w.worker.gpus)
            pending.popleft()
            t.worker = w
            t.started = now + delay
            w.active.add(t)
            self.running += 1
            self._seq += 1
            heapq.heappush(self.heap, (t.started + t.remaining, self._seq, t.token, t))
            started = True
        return started
