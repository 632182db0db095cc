"""Simulator layer: one pipeline's rollout workers, slot by slot.

The engine is a single SimPy process per pipeline that sleeps until the next
thing that changes its state (a trajectory segment ending or a worker
finishing its load) and is woken early when the plan adds or removes workers
or a new batch arrives. Trajectories are plain objects in a heap, not SimPy
processes, so a million of them replay in seconds.

A trajectory is a list of segments: generation seconds (decoding at full
speed) alternating with tool seconds (an agentic environment call: the
trajectory keeps its slot and KV cache but the GPU computes nothing for it).
With a decode-speed curve, the generating trajectories of a worker share its
speed: each decodes at ``speed(n)`` of full speed while ``n`` generate on it.

It makes no scheduling decision: which workers exist is the plan's call.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count, repeat

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT

from rlix.core import RolloutWorker, WorkerLoad
from rlix.job import WeightGate, WorkerPhase, weight_gate, worker_booking
from rlix.lengths import NOT_STARTED
from rlix.metrics import UsageRecorder
from rlix.rollout_book import RolloutBook

Speed = Callable[[int], float]  # generating trajectories on a worker -> fraction of full decode speed


_START, _SYNC = WeightGate.START, WeightGate.SYNC  # read once: ready_for runs per trajectory start


def book_worker(usage: UsageRecorder, gpus, now: float, phase: WorkerPhase, pipeline_id: str = "", fill: float = 1.0) -> None:
    """Book a rollout worker's GPUs for ``phase``, as the job model says (:func:`rlix.job.worker_booking`)."""
    activity, label = worker_booking(phase)
    usage.set(gpus, now, activity, pipeline_id, label, fill=fill)


class Batch:
    """One step's rollout of one stream: ``n`` trajectories, none started on weights older than ``version``."""

    __slots__ = ("done", "lora", "n", "step", "stream", "tally", "version")

    def __init__(self, env: simpy.Environment, stream: int, step: int, version: int, n: int, lora: bool) -> None:
        self.stream = stream
        self.step = step
        self.version = version  # the oldest weight version a trajectory of this batch may start on
        self.n = n
        self.tally = None  # left to finish, and the oldest weights the finished ones used: the rollout book's
        self.done = env.event()
        self.lora = lora


class Traj:
    __slots__ = (
        "batch",
        "duration",
        "generating",
        "group",
        "idx",
        "predicted",
        "queued",
        "remaining",
        "seg",
        "segments",
        "served",
        "started",
        "tally",
        "token",
        "version",
        "worker",
    )

    def __init__(self, batch: Batch, segments: Sequence[float], idx: int) -> None:
        self.batch = batch
        self.segments = segments  # seconds: generation, tool, generation, ... (odd length)
        self.duration = float(sum(segments)) if len(segments) > 1 else float(segments[0])  # seconds in all
        self.seg = 0  # index of the current segment
        self.generating = True  # the current segment is generation (an even index), not a tool call
        self.remaining = float(segments[0])  # seconds of the current segment still to go (at full speed)
        self.started = 0.0  # when its progress was last stamped on its worker
        self.worker: SimWorker | None = None
        self.token = 0  # sequence number of its live heap entry (0: none): older entries are stale
        self.idx = idx  # unique within the engine: the last tie-breaker of every ordering
        self.version = -1  # weight version its first segment started on (-1: not started)
        self.group = None  # its prompt's group in its batch (None: no prompt ids)
        self.served = NOT_STARTED  # the order it last started in, stamped by its book's queue
        # ``tally`` and ``group`` are set by the rollout book (rlix.rollout_book), ``predicted`` and ``queued``
        # by its PredictedQueue (rlix.lengths) while it holds the trajectory.


class SimWorker:
    __slots__ = ("active", "alive", "first_gpu", "generating", "grant_seq", "rate", "ready_at", "versions", "worker")

    def __init__(self, worker: RolloutWorker, ready_at: float, versions: dict[int, int], grant_seq: int = 0) -> None:
        self.worker = worker
        self.first_gpu = worker.gpus[0]  # its key everywhere: read once per trajectory
        self.ready_at = ready_at  # seconds: loading (and syncing) until then
        self.active: dict[int, Traj] = {}  # idx -> trajectory (insertion order: deterministic)
        self.versions = versions  # stream -> weight/adapter version loaded
        self.alive = True
        self.generating = 0  # active trajectories in a generation segment
        self.rate = 1.0  # decode speed of each generating trajectory (fraction of full speed)
        self.grant_seq = grant_seq  # the job's grants so far when it got this worker (RolloutBook.fill_order)


def settle(t: Traj, rate: float, now: float) -> None:
    """Stamp ``t``'s progress at ``now``: its current segment ran since ``t.started`` at ``rate``
    (generation) or wall time (tool)."""
    t.remaining = max(t.remaining - max(0.0, now - t.started) * (rate if t.generating else 1.0), 0.0)


def abort(t: Traj, rate: float, now: float, *, requeue: bool, resume_s: float) -> None:
    """Take ``t`` off its worker: restart it (``requeue``) or keep its progress, plus the re-prefill it will need."""
    if requeue:
        t.seg = 0
        t.generating = True
        t.remaining = float(t.segments[0])
        t.version = -1
    else:
        settle(t, rate, now)
        t.remaining += resume_s  # re-prefill on the new worker (charged to the current segment, tool or not)
    t.token = 0
    t.worker = None


class Timeline:
    """When each running segment ends and each loading worker is ready: two heaps, each entry with a unique sequence number."""

    def __init__(self) -> None:
        self.ends: list[tuple[float, int, Traj]] = []  # (segment end, seq, traj); stale unless seq is the traj's token
        self.loading: list[
            tuple[float, int, int, SimWorker]
        ] = []  # (ready_at, first GPU, seq, worker): a dead worker may share the GPU
        self._seq = 0

    def schedule(self, t: Traj, w: SimWorker, start: float) -> None:
        """(Re)time ``t``'s current segment from ``start``: tool time is wall time; generation runs at the worker's rate."""
        t.started = start
        self._seq += 1
        t.token = self._seq
        end = start + (t.remaining / w.rate if t.generating else t.remaining)
        heapq.heappush(self.ends, (end, self._seq, t))

    def retime(self, w: SimWorker, rate: float, now: float) -> None:
        """``w``'s decode speed becomes ``rate``: settle progress at the old rate, go on at the new."""
        if rate == w.rate:
            return
        for t in w.active.values():
            if t.generating:
                settle(t, w.rate, now)
        w.rate = rate
        for t in w.active.values():
            if t.generating:
                self.schedule(t, w, max(now, t.started))

    def loads_until(self, w: SimWorker, ready_at: float) -> None:
        self._seq += 1
        heapq.heappush(self.loading, (ready_at, w.first_gpu, self._seq, w))

    def next_wake(self) -> float | None:
        ends, loading = self.ends, self.loading
        while ends and ends[0][1] != ends[0][2].token:
            heapq.heappop(ends)
        while loading and not loading[0][3].alive:
            heapq.heappop(loading)
        if not ends:
            return loading[0][0] if loading else None
        return min(ends[0][0], loading[0][0]) if loading else ends[0][0]

    def loaded(self, now: float) -> dict[int, SimWorker]:
        """Live workers whose load (or weight sync) ended by ``now``, by first GPU."""
        out = {}
        while self.loading and self.loading[0][0] <= now:
            w = heapq.heappop(self.loading)[3]
            if w.alive:
                out[w.first_gpu] = w
        return out


class _Kick(simpy.Event):
    """An event that fires at the current instant before the ordinary (normal-priority) ones,
    as SimPy's own :class:`~simpy.events.Interruption` does."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None]) -> None:
        # Triggered at creation, as SimPy's own Timeout and Interruption initialise themselves.
        self.env = env
        self.callbacks = [callback]
        self._value = None
        self._ok = True
        env.schedule(self, URGENT)


class _Timer(simpy.Event):
    """A timeout that calls ``callback`` after ``delay``: what ``env.timeout(delay)`` plus an
    appended callback does (same priority, same instant, same order), without the checks and
    the extra call, for the engine sleeps once per trajectory segment."""

    def __init__(self, env: simpy.Environment, delay: float, callback: Callable[[simpy.Event], None]) -> None:
        self.env = env
        self._value = None
        self._ok = True
        self.rearm(delay, callback)

    def rearm(self, delay: float, callback: Callable[[simpy.Event], None]) -> None:
        """Fire again ``delay`` from now. Only from its own callback: it has left SimPy's queue then,
        and a timer used again costs less than a new one (the engine's wake-ups are its hot loop)."""
        self.callbacks = [callback]
        self.env.schedule(self, NORMAL, delay)


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """How a pipeline's rollout behaves (from its trace entry)."""

    slots: int  # trajectories one worker runs at once
    weight_sync_s: float
    adapter_sync_s: float
    requeue: bool  # True: restart aborted trajectories; False: continue them
    resume_s: float  # seconds to re-prefill a continued trajectory
    lora: bool = False  # multi-LoRA: adapters load per trajectory, beside the others
    streaming: bool = False  # workers move to the newest weights; batches overlap
    partial: bool = False  # streaming: sync weights under running trajectories (they go on)
    speed: Speed | None = None  # None: every trajectory decodes at full speed


class WeightLoader:
    """The weights a worker must hold before a trajectory starts on it, and the loads that bring them.

    Full weights sync on an idle worker (under partial rollout, beside running
    trajectories, which pause meanwhile); a LoRA adapter loads beside the
    others and delays only the trajectory that needs it; under streaming an
    idle worker moves to the newest weights before it is needed.
    """

    def __init__(self, pipeline_id: str, opts: EngineOptions, timeline: Timeline, usage: UsageRecorder) -> None:
        self.pipeline_id = pipeline_id
        self.opts = opts
        self.timeline = timeline
        self.usage = usage
        self.newest: dict[int, int] = {}  # stream -> newest trained weight version
        self.switch_extra = 0.0  # GPU-seconds of adapter sync inside busy workers

    def ready_for(self, w: SimWorker, batch: Batch, now: float) -> float | None:
        """Seconds of adapter load before a trajectory of ``batch`` starts on ``w``, or None if
        none may start now (a weight sync was just started, or the worker must drain first):
        :func:`rlix.job.weight_gate` decides."""
        stream, opts = batch.stream, self.opts
        gate, version = weight_gate(
            w.versions.get(stream, -1),
            batch.version,
            self.newest.get(stream, batch.version),
            idle=not w.active,
            streaming=opts.streaming,
            partial=opts.partial,
        )
        if gate is _START:
            return 0.0
        if not batch.lora:
            if gate is _SYNC:
                self.sync(w, stream, version, now)  # the newest weights before decoding (on demand, from the CPU copy)
            return None
        w.versions[stream] = version  # an adapter loads beside the others, busy or not: only this trajectory waits
        self.switch_extra += opts.adapter_sync_s * len(w.worker.gpus)
        return opts.adapter_sync_s

    def sync(self, w: SimWorker, stream: int, version: int, now: float) -> None:
        """Load full weights ``version`` on ``w``; running trajectories (partial rollout) pause meanwhile."""
        w.versions[stream] = version
        w.ready_at = now + self.opts.weight_sync_s
        for t in w.active.values():
            if t.generating:
                settle(t, w.rate, now)
                self.timeline.schedule(t, w, max(w.ready_at, t.started))
        self.timeline.loads_until(w, w.ready_at)
        book_worker(self.usage, w.worker.gpus, now, WorkerPhase.WEIGHT_SYNC, self.pipeline_id)

    def refresh_idle(self, w: SimWorker, now: float) -> bool:
        """An idle full-weight worker moves to the newest weights before a trajectory needs them, where
        :func:`rlix.job.weight_gate` says so (under streaming)."""
        opts = self.opts
        if opts.lora or w.active or w.ready_at > now:
            return False  # adapters load per trajectory instead
        for stream in sorted(self.newest):
            have = w.versions.get(stream, -1)
            gate, version = weight_gate(have, -1, self.newest[stream], idle=True, streaming=opts.streaming, partial=opts.partial)
            if gate is WeightGate.SYNC:
                self.sync(w, stream, version, now)
                return True
        return False


def fill_slots(w: SimWorker, queue, slots: int, weights: WeightLoader, timeline: Timeline, now: float) -> int:
    """Start trajectories from the front of ``queue`` (a rollout book's) on ``w``'s free slots (of ``slots``), each
    once ``w`` holds the weights it needs; stops at one it must wait for (a sync started). Returns how many started."""
    started = 0
    while queue and len(w.active) < slots:
        t = queue[0]
        batch = t.batch
        delay = weights.ready_for(w, batch, now)
        if delay is None:
            break  # the worker syncs its weights first, or drains before it may
        queue.popleft()
        t.worker = w
        if t.version < 0:
            t.version = w.versions.get(batch.stream, -1)
        w.active[t.idx] = t
        if t.generating:
            w.generating += 1
        started += 1
        timeline.schedule(t, w, now + delay)
    return started


def _segments(trajectories: Sequence[Sequence[float]] | Sequence[float] | np.ndarray) -> list[tuple[float, ...]]:
    """One segment tuple per trajectory, from durations or segment lists."""
    if isinstance(trajectories, np.ndarray):  # one float per trajectory: convert once, not item by item
        return [(s,) for s in trajectories.tolist()]
    return [s if isinstance(s, tuple) else (float(s),) for s in trajectories]


class Waker:
    """When an engine advances: at once on a kick, else at its timeline's next change.

    One plain SimPy callback, not a process: a wake happens once per
    trajectory segment, and resuming a generator for each costs more than the
    work it does. The order of events is the same as a process sleeping on a
    timeout and interrupted by :meth:`kick`.
    """

    def __init__(self, env: simpy.Environment, advance: Callable[[float], None], next_wake: Callable[[], float | None]) -> None:
        self.env = env
        self._advance = advance  # bring the engine to the given time
        self._next_wake = next_wake  # when it next changes by itself (None: only on a kick)
        self._sleeping = True  # waiting for its timer (or, with none, for a kick)
        self._timer: simpy.Event | None = None  # the one wake-up that counts; a superseded one is ignored

    def kick(self) -> None:
        """Wake now, ahead of the ordinary events of this instant (as a SimPy interrupt would)."""
        if self._sleeping:
            self._sleeping = False
            self._timer = _Kick(self.env, self._wake)

    def _wake(self, event: simpy.Event) -> None:
        if event is not self._timer:
            return  # a timer a kick superseded
        self._sleeping = False  # kicks while it advances change nothing: it looks at the timeline after
        now = self.env.now
        self._advance(now)
        wake = self._next_wake()
        self._sleeping = True
        if wake is None:
            self._timer = None  # nothing scheduled: wait for a kick
        elif isinstance(event, _Timer):  # it has just fired: out of SimPy's queue, so it may be used again
            event.rearm(max(wake - now, 0.0), self._wake)
        else:
            self._timer = _Timer(self.env, max(wake - now, 0.0), self._wake)


def _stop_all(w: SimWorker, opts: EngineOptions, now: float) -> list[Traj]:
    """Every trajectory of a worker torn down at ``now``, stopped (what the options keep of their progress
    kept); the worker is left with none."""
    stopped = list(w.active.values())
    for t in stopped:
        abort(t, w.rate, now, requeue=opts.requeue, resume_s=opts.resume_s)
    w.active.clear()
    w.generating = 0
    return stopped


class RolloutEngine:
    """Runs a pipeline's trajectories on the workers the plan gives it."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        pipeline_id: str,
        options: EngineOptions,
        usage: UsageRecorder,
        book: RolloutBook,
        on_change: Callable[[], None],
        on_pending: Callable[[bool], None],
    ) -> None:
        self.env = env
        self.pipeline_id = pipeline_id
        self.opts = options
        self.usage = usage
        # Bookings of a busy and an idle worker, resolved once (this is the replay's hot loop).
        self._busy, self._idle = worker_booking(WorkerPhase.BUSY), worker_booking(WorkerPhase.IDLE)
        self.on_change = on_change  # demand changed: the simulator asks for a report later
        self.on_pending = on_pending  # True / False when trajectories start / stop waiting for a slot
        self.timeline = Timeline()
        self.weights = WeightLoader(pipeline_id, options, self.timeline, usage)
        self._had_pending = False
        self._scan_all = False  # new work arrived: every worker may have free slots
        self.open_n = 0  # trajectories in all unfinished batches
        self.workers: dict[int, SimWorker] = {}  # first GPU -> worker
        self._order: list[int] = []  # the workers' first GPUs, ascending: every demand report walks them
        self._grants = 0  # workers the job has got so far
        self.book = book  # the job's trajectories (its step machine's): which waits, what a shrink does
        self._loads: dict[int, WorkerLoad] = {}  # first GPU -> the last load reported for it
        self.completed_s = 0.0  # seconds (generation and tool) of the finished trajectories
        self.longest_s = 0.0  # the slowest finished trajectory's seconds
        self._waker = Waker(env, self._advance, self.timeline.next_wake)
        self._kick = self._waker.kick

    # ------------------------------------------------------------ commands

    def add_batch(
        self,
        batch: Batch,
        trajectories: Sequence[Sequence[float]] | Sequence[float] | np.ndarray,
        prompts: np.ndarray | None = None,
    ) -> None:
        """Queue a batch: one duration per trajectory, or one segment list per trajectory; each one's prompt id, if known."""
        book = self.book
        made = list(map(Traj, repeat(batch), _segments(trajectories), count(book.made)))  # idx made, made + 1, ...
        keys = None
        if book.predictor is not None:
            if prompts is None:
                raise ValueError(f"{self.pipeline_id}: this engine orders by predicted length; give each trajectory a prompt id")
            keys = [(batch.stream, batch.step, p) for p in prompts.tolist()]
        batch.tally = book.add(made, keys)
        self.open_n += batch.n
        self._scan_all = True
        self._note_pending()
        self.on_change()
        self._kick()

    def set_version(self, stream: int, version: int) -> None:
        """A stream's newest trained weights (streaming: idle workers move to them)."""
        self.weights.newest[stream] = version
        if self.opts.streaming:
            self._scan_all = True
            self._kick()

    def add_worker(self, worker: RolloutWorker, ready_at: float, versions: dict[int, int]) -> None:
        self._grants += 1
        w = SimWorker(worker, ready_at, versions, self._grants)
        self.workers[worker.gpus[0]] = w
        bisect.insort(self._order, worker.gpus[0])
        self.timeline.loads_until(w, ready_at)
        self._kick()

    def remove_worker(self, worker: RolloutWorker) -> int:
        """Tear a worker down now; its trajectories go back to the queue. Returns how many."""
        w = self.workers.pop(worker.gpus[0])
        self._order.remove(worker.gpus[0])
        w.alive = False
        aborted = _stop_all(w, self.opts, self.env.now)
        self.book.preempted(len(aborted))
        self.book.put_back(aborted)  # at the queue's front, in the order they last started
        if aborted:
            self._scan_all = True
            self.on_change()
            self._note_pending()
        self._kick()
        return len(aborted)

    def loads(self) -> tuple[WorkerLoad, ...]:
        """Running trajectories per busy worker (those waiting for a slot are the book's)."""
        loads = []
        workers = self.workers
        for g in self._order:
            active = len(workers[g].active)
            if active:
                # The (immutable) load value is made once per worker and count: reports repeat them tick after tick.
                load = self._loads.get(g)
                if load is None or load.active != active:
                    load = self._loads[g] = WorkerLoad(first_gpu=g, active=active)
                loads.append(load)
        return tuple(loads)

    @property
    def running(self) -> int:
        """Trajectories on its workers now."""
        return sum(len(w.active) for w in self.workers.values())

    @property
    def mean_trajectory_s(self) -> float:
        """Mean seconds of the trajectories finished so far (0 before the first)."""
        return self.completed_s / self.book.completed if self.book.completed else 0.0

    # ------------------------------------------------------------ the process

    def _advance(self, now: float) -> None:
        loading = self.timeline.loading
        touched = self.timeline.loaded(now) if loading and loading[0][0] <= now else {}  # usually none is due
        finished = self._segments_ending(now, touched)
        if self.book.queue:
            self._fill(now, touched)
        elif self.opts.streaming and self._scan_all:
            for g in sorted(self.workers):
                if self.weights.refresh_idle(self.workers[g], now):
                    touched[g] = self.workers[g]
        self._scan_all = False
        if touched:
            self._book(now, touched)
            self.on_change()
        elif finished:
            self.on_change()

    def _fill(self, now: float, touched: dict[int, SimWorker]) -> None:
        """Start pending trajectories on free slots, in the book's order (lowest first GPU first by default)."""
        # Only workers whose state changed can have a usable free slot,
        # unless new work (or new weights) arrived since the last look.
        candidates = self._order if self._scan_all else sorted(touched)  # fill_slots adds or removes no worker
        workers, slots, waiting = self.workers, self.opts.slots, self.book.queue
        if self.book.longest_held:  # by default the walk is already lowest GPU first: this loop is the replay's hot path
            startable = [workers[g] for g in candidates if g in workers and workers[g].ready_at <= now]
            free = [(w.first_gpu, w.grant_seq, slots - len(w.active)) for w in startable if len(w.active) < slots]
            candidates = self.book.fill_order(free)
        for g in candidates:
            w = workers.get(g)
            if w is not None and w.ready_at <= now and len(w.active) < slots:
                if fill_slots(w, waiting, slots, self.weights, self.timeline, now):
                    touched[g] = w
            if not waiting:
                break
        if not waiting:
            self._note_pending()  # it had some: it may have none now

    def _book(self, now: float, touched: dict[int, SimWorker]) -> None:
        """Re-time and book the workers whose trajectories changed, in GPU order."""
        speed, slots, pid, usage = self.opts.speed, self.opts.slots, self.pipeline_id, self.usage
        for g in sorted(touched):
            w = touched[g]
            if not w.alive:
                continue
            if speed is not None:
                self.timeline.retime(w, speed(w.generating) if w.generating else 1.0, now)
            if w.ready_at <= now:
                activity, label = self._busy if w.generating else self._idle
                usage.set(w.worker.gpus, now, activity, pid, label, w.generating / slots)

    def _segments_ending(self, now: float, touched: dict[int, SimWorker]) -> int:
        """Pop every segment that ends by ``now``: finish trajectories, or move them to their next segment."""
        finished = 0
        book = self.book
        ends = self.timeline.ends
        # The timeline's heap is read here, not through a method: this loop runs once per segment.
        # One entry at a time: a segment timed meanwhile (a next segment of zero seconds) may end by now too.
        while ends and ends[0][0] <= now:
            _, seq, t = heapq.heappop(ends)
            if seq != t.token:
                continue  # re-timed or aborted since: a stale entry
            w = t.worker
            touched[w.first_gpu] = w
            if t.seg + 1 < len(t.segments):
                self._next_segment(t, w, now)
                continue
            del w.active[t.idx]
            w.generating -= 1
            t.worker = None
            finished += 1
            self.completed_s += t.duration
            if t.duration > self.longest_s:
                self.longest_s = t.duration
            if book.finished(t, t.duration, t.version):
                batch = t.batch
                self.open_n -= batch.n
                batch.done.succeed()
        return finished

    def _next_segment(self, t: Traj, w: SimWorker, now: float) -> None:
        w.generating += -1 if t.generating else 1
        t.seg += 1
        t.generating = t.seg % 2 == 0
        t.remaining = float(t.segments[t.seg])
        self.timeline.schedule(t, w, now)

    def _note_pending(self) -> None:
        has = bool(self.book)
        if has != self._had_pending:
            self._had_pending = has
            self.on_pending(has)
