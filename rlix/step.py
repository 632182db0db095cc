"""Shared layer: the step process of one RL job, written once as a sans-IO state machine.

The rules of a step (stage order, staleness gate, demand report) are in
:mod:`rlix.job`; this module is the *process* that applies them: what a job
does next when something happens to it. It never waits, reads a clock or
calls anything. Each method is an event (a grant, a rollout batch complete,
a stage loaded, worked or offloaded, weights published), takes the time as a
number, and returns the effects the job wants carried out, in order:

    machine = StepMachine(...)
    effects = machine.start(now)           # [RegisterJob()]
    effects = machine.registered(now)      # [RequestGang(INIT)]
    effects = machine.granted(INIT, gpus, now)   # [Book(...), Load(INIT)]
    ...

Two shells drive it: the simulator (:mod:`rlix.sim.pipeline`, SimPy
timeouts stand in for the work) and the executor (:mod:`rlix.exec.job.step_runner`,
asyncio over Ray actors do the work). A test can drive it by hand, event by
event. The machine deals in batches: it queues one when the staleness gate
and the rollout mode allow, and trains it once it is complete. Trajectories
within a batch are its rollout book's (``StepMachine.book``,
:mod:`rlix.rollout_book`: which starts next, what a shrink does to them, when
their batch is complete), which the shell drives and the machine reads its
demand reports from; which slot and which worker is the shell's.

A step of stream ``i``:

    produce (QueueBatch) -> rolled -> wait for the training turn (one tick at a
    time, first ready first) -> Score -> for each stage: RequestGang (handed
    over from the stage before) -> granted -> Load -> loaded -> Work -> worked
    -> Offload -> offloaded -> ... -> ReleaseGang (announcing the batch this
    training opens) + Publish -> published: trained, the gate moves on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from rlix.core import PipelineSpec, ReportDemand, Role, Stage, WorkerLoad
from rlix.core.types import Gpus
from rlix.job import GangPhase, demand_report, gang_activity, remaining_path_s, rollout_may_start, stage_gpus, stage_role
from rlix.lengths import LengthPredictor
from rlix.metrics import Activity
from rlix.rollout_book import RolloutBook

# ------------------------------------------------------------------ effects


@dataclass(frozen=True, kw_only=True)
class RequestGang:
    """Ask the scheduler for ``stage``'s gang; ``after``: a held stage released in the same call (a hand-over)."""

    stage: Stage
    role: Role | None  # None: model load, which occupies the job's init GPUs
    after: Stage | None = None


@dataclass(frozen=True, kw_only=True)
class ReleaseGang:
    """Give ``stage``'s GPUs back; ``announce``: trajectories of the batch this release lets the job queue.

    The release carries the demand report that counts them, so the GPUs are
    not lent to another job for the moment before the batch is produced.
    """

    stage: Stage
    announce: int = 0


@dataclass(frozen=True, kw_only=True)
class Book:
    """From now on ``gpus`` do ``activity`` for this job's ``stage`` (``""``: nothing)."""

    gpus: Gpus
    activity: Activity
    stage: str


@dataclass(frozen=True, kw_only=True)
class Load:
    """Bring the job's model (and optimizer) onto ``stage``'s GPUs; answer :meth:`StepMachine.loaded`."""

    stage: Stage
    gpus: Gpus


@dataclass(frozen=True, kw_only=True)
class Work:
    """Run ``stage`` of ``step`` of ``stream`` on its GPUs; answer :meth:`StepMachine.worked`."""

    stage: Stage
    stream: int
    step: int


@dataclass(frozen=True, kw_only=True)
class Offload:
    """Move the model off ``stage``'s GPUs; answer :meth:`StepMachine.offloaded`.

    ``keep``: the next stage of this step runs on the same GPUs, so the model
    stays (parked) and the offload is left to whoever takes the GPUs next; the
    answer may come at once.
    """

    stage: Stage
    gpus: Gpus
    keep: bool = False


@dataclass(frozen=True, kw_only=True)
class Score:
    """Score the complete rollout of ``step`` of ``stream``; answer :meth:`StepMachine.scored`."""

    stream: int
    step: int


@dataclass(frozen=True, kw_only=True)
class QueueBatch:
    """Produce ``step`` of ``stream`` (``size`` trajectories, none on weights older than ``version``) and queue it."""

    stream: int
    step: int
    size: int
    version: int


@dataclass(frozen=True, kw_only=True)
class DropBatch:
    """``stream`` stopped (its stop reward was reached): ``step``, produced before, is never trained;
    take its trajectories out of the rollout."""

    stream: int
    step: int


@dataclass(frozen=True, kw_only=True)
class Publish:
    """``stream``'s weights after training are ``version``: cache them (rollout workers take them by
    :func:`rlix.job.weight_gate`); answer :meth:`StepMachine.published`. ``last``: the stream produces no further step."""

    stream: int
    version: int
    last: bool


@dataclass(frozen=True, kw_only=True)
class DemandChanged:
    """The job's rollout demand changed; ``urgent``: the rollout has nothing left running, plan now."""

    urgent: bool = False


@dataclass(frozen=True, kw_only=True)
class RegisterJob:
    """Register the job with the scheduler as the machine's ``spec`` declares it; answer
    :meth:`StepMachine.registered`."""


@dataclass(frozen=True, kw_only=True)
class Finished:
    """Every stream is trained to its end: unregister."""


Effect = (
    RegisterJob
    | RequestGang
    | ReleaseGang
    | Book
    | Load
    | Work
    | Offload
    | Score
    | QueueBatch
    | DropBatch
    | Publish
    | DemandChanged
    | Finished
)


class Interpreter(Protocol):
    """What a shell implements to drive the machine: one method per effect, each carrying it out (or
    starting it) and feeding the outcome back to the machine when it is done."""

    def register_job(self, e: RegisterJob) -> None: ...
    def request_gang(self, e: RequestGang) -> None: ...
    def release_gang(self, e: ReleaseGang) -> None: ...
    def book(self, e: Book) -> None: ...
    def load(self, e: Load) -> None: ...
    def work(self, e: Work) -> None: ...
    def offload(self, e: Offload) -> None: ...
    def score(self, e: Score) -> None: ...
    def queue_batch(self, e: QueueBatch) -> None: ...
    def drop_batch(self, e: DropBatch) -> None: ...
    def publish(self, e: Publish) -> None: ...
    def demand_changed(self, e: DemandChanged) -> None: ...
    def finished(self, e: Finished) -> None: ...


_HANDLERS: dict[type, str] = {
    RegisterJob: "register_job",
    RequestGang: "request_gang",
    ReleaseGang: "release_gang",
    Book: "book",
    Load: "load",
    Work: "work",
    Offload: "offload",
    Score: "score",
    QueueBatch: "queue_batch",
    DropBatch: "drop_batch",
    Publish: "publish",
    DemandChanged: "demand_changed",
    Finished: "finished",
}


def carry_out(effects: Iterable[Effect], interpreter: Interpreter) -> None:
    """Hand each effect, in order, to the interpreter's method for it."""
    for effect in effects:
        getattr(interpreter, _HANDLERS[type(effect)])(effect)


class Driver:
    """Tells a machine its events and carries out the effects each returns, one list after another.

    A shell answers some effects at once (a score computed in place, a publish, an offload that keeps
    the model): its handler feeds the answer while the list holding that effect is still being carried
    out. The answer waits here until that list is done, so the machine is never re-entered mid-list and
    the effects of one list are all carried out, in the order the machine emitted them, before any of
    the next. Both shells drive their machine through one of these."""

    def __init__(self, interpreter: Interpreter) -> None:
        self.interpreter = interpreter
        self._waiting: deque[Callable[[], Iterable[Effect]]] = deque()
        self._busy = False

    def feed(self, event: Callable[[], Iterable[Effect]]) -> None:
        """Tell the machine ``event`` (a call of one of its event methods) now, or, if a list of effects
        is being carried out, once it and the events fed before are done. What a handler raises
        reaches the caller that started the list, and the events still waiting are dropped."""
        self._waiting.append(event)
        if self._busy:
            return
        self._busy = True
        try:
            while self._waiting:
                carry_out(self._waiting.popleft()(), self.interpreter)
        except BaseException:
            self._waiting.clear()
            raise
        finally:
            self._busy = False


# ------------------------------------------------------------------ the job


@dataclass(frozen=True, kw_only=True)
class StreamSpec:
    """One stream of steps: a full-finetune job has one, a multi-LoRA job one per adapter."""

    name: str
    steps: int  # steps end before this index
    stop_reward: float | None = None  # a trained step with at least this mean reward is the stream's last


@dataclass(kw_only=True)
class StepTimes:
    """When one step of one stream rolled out and trained (seconds), as both shells measure it."""

    stream: int
    step: int
    version: int  # oldest weight version its rollout used
    size: int  # trajectories
    rollout_start: float
    rollout_end: float = math.nan
    train_end: float = math.nan


@dataclass(kw_only=True)
class _Stream:
    spec: StreamSpec
    start: int = 0  # first step (a resumed stream continues from its checkpoint)
    next_step: int = 0  # next step to produce
    version: int = 0  # steps trained = the newest weight version
    stopped: bool = False
    backlog: int = 0  # trajectories of the steps not produced yet


@dataclass(kw_only=True)
class _Tick:
    """The training turn in progress: one step of one stream through its stages."""

    stream: int
    step: int
    stages: tuple[Stage, ...]
    index: int = 0
    reward: float = 0.0
    seconds: list[float] = field(default_factory=list)  # compute seconds of each stage so far


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    """What the machine needs to know of a job besides its topology."""

    streams: tuple[StreamSpec, ...]
    stages: Callable[[int, int], Sequence[Stage]]  # (stream, step) -> the step's non-rollout stages, in order
    size: Callable[[int, int], int]  # (stream, step) -> trajectories of its rollout
    staleness: int = 0
    streaming: bool = False  # rollout batches may overlap: only the staleness gate orders them
    share_load: bool = False  # consecutive stages on the same GPUs keep the model loaded
    predict: bool = False  # keep a length predictor (rlix.lengths): trajectories carry prompt ids to learn from
    ordered: bool = True  # and, once the prediction is trusted, they start predicted-longest first
    longest_held: bool = False  # where the queue fills every free slot, the workers held longest fill first
    tries: int = 1  # tries a trajectory gets before an application error fails the job

    def open_limit(self) -> int:
        """The most rollout trajectories the job can have open at once, which it declares when it
        registers (:attr:`PipelineSpec.open_limit`): per stream, its largest batch times the
        batches that may roll out together (one in batch mode, where a batch waits for the one
        before it; with streaming, as many as the staleness gate lets be open). A batch announced
        ahead opens only as the step before it goes to training, so it stays within that count."""
        batches = self.staleness + 1 if self.streaming else 1
        return sum(max((self.size(i, k) for k in range(s.steps)), default=0) * batches for i, s in enumerate(self.streams))

    def batch_credit(self) -> bool:
        """Does a batch open only once the batches before it have finished, or after a training
        (:attr:`PipelineSpec.batch_credit`)? One stream in batch mode: yes. Otherwise (a stream's
        batch may open while another's runs) only where each batch waits for a training (a gang
        release): streaming, or staleness 0, and every step has a stage to train."""
        if len(self.streams) == 1 and not self.streaming:
            return True
        trains = all(self.stages(i, k) for i, s in enumerate(self.streams) for k in range(s.steps))
        return (self.streaming or self.staleness == 0) and trains

    def total_trajectories(self) -> int:
        """Trajectories of every step of every stream, which the job declares when it registers
        (:attr:`PipelineSpec.total_trajectories`): its backlog never exceeds what of them it has
        neither finished nor open."""
        return sum(self.size(i, k) for i, s in enumerate(self.streams) for k in range(s.steps))


class PlannedJob(Protocol):
    """The job fields a plan reads: :class:`rlix.config.JobModel` has them, so a trace's pipeline and an
    ``rlix-run`` job are planned alike."""

    @property
    def staleness(self) -> int: ...

    @property
    def rollout_mode(self) -> str: ...

    @property
    def dispatch(self) -> str: ...

    @property
    def placement(self) -> str: ...


def job_plan(
    job: PlannedJob,
    streams: Sequence[StreamSpec],
    stages: Callable[[int, int], Sequence[Stage]],
    size: Callable[[int, int], int],
    *,
    share_load: bool = False,
    prompts: bool = False,
    tries: int = 1,
) -> JobPlan:
    """The plan of ``job``, whichever shell runs it: its streams, each step's stages and batch size (the
    shell's to say: a trace lists them, a recipe draws them), and the job's staleness, rollout mode and
    dispatch order and placement. ``prompts``: its trajectories carry prompt ids, so the book keeps a length predictor;
    ``tries``: per trajectory, before an application error fails the job."""
    return JobPlan(
        streams=tuple(streams),
        stages=stages,
        size=size,
        staleness=job.staleness,
        streaming=job.rollout_mode == "streaming",
        share_load=share_load,
        predict=prompts,
        ordered=job.dispatch == "predicted",
        longest_held=job.placement == "longest_held",
        tries=tries,
    )


def rollout_book(plan: JobPlan) -> RolloutBook:
    """The rollout book a job's plan calls for: with a length predictor where its trajectories carry prompt ids."""
    return RolloutBook(
        LengthPredictor() if plan.predict else None, ordered=plan.ordered, longest_held=plan.longest_held, max_tries=plan.tries
    )


class Rollouts:
    """Which batches of a job's streams exist, may start and are rolled out, and what is outstanding."""

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.streams = [_Stream(spec=s) for s in plan.streams]
        for i in range(len(self.streams)):
            self.resume(i, 0)
        self.open: dict[tuple[int, int], StepTimes] = {}  # produced, not yet trained
        self.rolled_out: set[tuple[int, int]] = set()  # produced and rolled out, not yet trained
        self.announced: dict[int, int] = {}  # stream -> trajectories of its next batch, announced before it is produced
        self.history: list[StepTimes] = []
        self.produced = 0  # trajectories produced for steps that will be trained (a dropped batch's leave)
        self.started = False  # the model is loaded: batches may be produced

    def resume(self, i: int, step: int) -> None:
        """Stream ``i`` continues after ``step`` trained steps."""
        s = self.streams[i]
        s.start = s.next_step = s.version = step
        s.backlog = sum(self.plan.size(i, k) for k in range(step, s.spec.steps))

    def exhausted(self, i: int) -> bool:
        """No further step of stream ``i`` will be produced (all produced, or stopped)."""
        s = self.streams[i]
        return s.stopped or s.next_step >= s.spec.steps

    def may_produce(self, i: int) -> bool:
        """The staleness gate is open and, in batch mode, the stream's previous rollout is complete."""
        s = self.streams[i]
        if not self.started or self.exhausted(i) or not rollout_may_start(s.next_step, s.version, self.plan.staleness):
            return False
        return self.plan.streaming or not self._rolling((i, s.next_step - 1))

    def _rolling(self, key: tuple[int, int]) -> bool:
        return key in self.open and key not in self.rolled_out

    def produce(self, i: int, now: float) -> list[Effect]:
        """Queue every batch of stream ``i`` that may start now."""
        out: list[Effect] = []
        while self.may_produce(i):
            s = self.streams[i]
            step, size = s.next_step, self.plan.size(i, s.next_step)
            rec = StepTimes(stream=i, step=step, version=s.version, size=size, rollout_start=now)
            self.open[(i, step)] = rec
            self.history.append(rec)
            s.next_step += 1
            s.backlog -= size
            self.produced += size
            self.announced.pop(i, None)
            out.append(QueueBatch(stream=i, step=step, size=size, version=s.version))
        return out

    def rolled(self, i: int, step: int, now: float, oldest_version: float) -> None:
        if (i, step) in self.rolled_out or (i, step) not in self.open:
            raise RuntimeError(f"stream {i} step {step} is not rolling out (rolled out twice, or never produced)")
        rec = self.open[(i, step)]
        rec.rollout_end = now
        rec.version = int(min(oldest_version, rec.version))
        self.rolled_out.add((i, step))

    def trained(self, i: int, step: int, mean_reward: float, now: float) -> tuple[StepTimes, list[int]]:
        """Step ``step`` of stream ``i`` is trained: its weights are version ``step + 1``.

        Returns the step's record and, when the stream's stop condition holds, the later steps
        already produced, which are dropped (the trained step is the stream's last).
        """
        s = self.streams[i]
        rec = self.open.pop((i, step))
        self.rolled_out.discard((i, step))
        rec.train_end = now
        s.version = step + 1
        dropped = []
        if self.stops(i, mean_reward):
            s.stopped, s.backlog = True, 0
            dropped = sorted(k for j, k in self.open if j == i)
            for k in dropped:
                self.produced -= self.open.pop((i, k)).size
                self.rolled_out.discard((i, k))
        return rec, dropped

    def stops(self, i: int, mean_reward: float) -> bool:
        """A step with this mean reward is stream ``i``'s last (its stop condition holds)."""
        stop = self.streams[i].spec.stop_reward
        return stop is not None and mean_reward >= stop

    def opened_by(self, i: int, step: int, mean_reward: float) -> int:
        """Trajectories stream ``i`` may queue once ``step`` is trained: its next batch, where the
        staleness gate is all that holds it back now (0: none)."""
        s = self.streams[i]
        if self.may_produce(i) or self.exhausted(i) or self.stops(i, mean_reward):
            return 0
        if not self.plan.streaming and self._rolling((i, s.next_step - 1)):
            return 0  # its previous rollout is still running
        return self.plan.size(i, s.next_step) if rollout_may_start(s.next_step, step + 1, self.plan.staleness) else 0

    # ------------------------------------------------------------ outstanding

    def open_trajectories(self) -> int:
        """Trajectories of the batches produced and not yet rolled out (finished ones included)."""
        return sum(rec.size for key, rec in self.open.items() if key not in self.rolled_out)

    def backlog(self) -> int:
        """Trajectories of the steps not produced yet (a stopped stream has none)."""
        return sum(s.backlog for s in self.streams)

    def path_s(self, longest_s: float, train_s: float) -> float:
        """The longest chain of steps still ahead among the running streams (see :func:`remaining_path_s`)."""
        plan = self.plan
        return max(
            (
                remaining_path_s(
                    s.spec.steps - s.version, plan.staleness, longest_s=longest_s, train_s=train_s, streaming=plan.streaming
                )
                for s in self.streams
                if not s.stopped
            ),
            default=0.0,
        )

    def versions(self) -> dict[int, int]:
        """Each stream's newest trained weight version."""
        return {i: s.version for i, s in enumerate(self.streams)}

    def planned_steps(self) -> int:
        """Steps the job will train: all of a running stream's, only those done of a stopped one."""
        return sum((s.version if s.stopped else s.spec.steps) - s.start for s in self.streams)

    def resumed_steps(self) -> int:
        """Steps the streams' checkpoints held when the job started (trained by an earlier run)."""
        return sum(s.start for s in self.streams)

    def done(self) -> bool:
        return all(self.exhausted(i) for i in range(len(self.streams))) and not self.open


def declared_spec(spec: PipelineSpec, plan: JobPlan) -> PipelineSpec:
    """``spec`` as the job registers it: with the most trajectories ``plan`` can have open at once, and all of them."""
    return replace(
        spec, open_limit=plan.open_limit(), total_trajectories=plan.total_trajectories(), batch_credit=plan.batch_credit()
    )


class StepMachine:
    """The step process of one job (every stream), from model load to its last trained step.

    ``spec`` is the job's registered spec (:func:`declared_spec`), which the shell registers; ``book``
    is the job's rollout book, made from its plan (:func:`rollout_book`), which the shell drives.
    """

    def __init__(self, spec: PipelineSpec, plan: JobPlan) -> None:
        if not plan.streams:
            raise ValueError("a job has at least one stream of steps")
        self.spec = declared_spec(spec, plan)
        self.plan = plan
        self.rollouts = Rollouts(plan)
        self.book = rollout_book(plan)  # the job's trajectories: the shell adds each batch it queues, and drives it
        self.ready: deque[tuple[int, int]] = deque()  # rolled out, waiting for the training turn (first ready first)
        self.tick: _Tick | None = None
        self.held: dict[Stage, Gpus] = {}  # gang stages granted and not yet released
        self.latencies: list[float] = []  # seconds from rollout start to trained, in training order
        self.train_s = 0.0  # the longest step's stage compute seconds so far
        self.registration = "none"  # none -> asked (RegisterJob) -> done (registered)
        self.admitted_s: float | None = None
        self.finished_s: float | None = None

    # ------------------------------------------------------------ events

    def start(self, now: float) -> list[Effect]:
        """The job arrives: register it."""
        if self.registration != "none":
            raise RuntimeError(f"{self.spec.pipeline_id}: started twice")
        self.registration = "asked"
        return [RegisterJob()]

    def registered(self, now: float) -> list[Effect]:
        """The scheduler knows the job: ask for its model load."""
        if self.registration != "asked":
            when = "twice" if self.registration == "done" else "before start"
            raise RuntimeError(f"{self.spec.pipeline_id}: registered {when}")
        self.registration = "done"
        return [RequestGang(stage=Stage.INIT, role=None)]

    def resume(self, stream: int, step: int) -> None:
        """``stream`` continues from a checkpoint after ``step`` trained steps (tell before the model load ends)."""
        self.rollouts.resume(stream, step)

    def granted(self, stage: Stage, gpus: Gpus, now: float, *, warm: bool = False) -> list[Effect]:
        """``stage``'s gang holds ``gpus``; ``warm``: this job's model is still on them (no load)."""
        if stage is not Stage.INIT:
            self._tick_at(stage)  # a grant for a stage no training is at is a protocol error
        self.held[stage] = tuple(gpus)
        if stage is Stage.INIT:
            self.admitted_s = now
        if warm:
            return self._work(stage)
        return [self._book(stage, GangPhase.LOAD), Load(stage=stage, gpus=self.held[stage])]

    def loaded(self, stage: Stage, now: float) -> list[Effect]:
        if stage is not Stage.INIT:
            return self._work(stage)
        # The first batches are queued before the model-load GPUs go back, and the release carries
        # their report: those GPUs are never lent away for want of a demand not yet sent.
        out: list[Effect] = [self._book(stage, GangPhase.RELEASED)]
        del self.held[stage]
        self.rollouts.started = True
        out += [e for i in range(len(self.rollouts.streams)) for e in self.rollouts.produce(i, now)]
        first = sum(e.size for e in out if isinstance(e, QueueBatch))
        return out + [ReleaseGang(stage=stage, announce=first)] + self._finish_if_done(now)

    def worked(self, stage: Stage, seconds: float, now: float) -> list[Effect]:
        """``stage``'s work took ``seconds`` of compute."""
        tick = self._tick_at(stage)
        tick.seconds.append(seconds)
        nxt = tick.stages[tick.index + 1] if tick.index + 1 < len(tick.stages) else None
        if self.plan.share_load and nxt is not None and stage_gpus(self.spec, nxt) == stage_gpus(self.spec, stage):
            return [Offload(stage=stage, gpus=self.held[stage], keep=True)]
        return [self._book(stage, GangPhase.OFFLOAD), Offload(stage=stage, gpus=self.held[stage])]

    def offloaded(self, stage: Stage, now: float) -> list[Effect]:
        """The model is off ``stage``'s GPUs (or parked there): release them, or hand them to the next stage."""
        tick = self._tick_at(stage)
        out: list[Effect] = [self._book(stage, GangPhase.RELEASED)]
        del self.held[stage]
        tick.index += 1
        if tick.index < len(tick.stages):
            nxt = tick.stages[tick.index]
            return out + [RequestGang(stage=nxt, role=stage_role(self.spec, nxt), after=stage)]
        return out + self._end_tick(tick, release=stage)

    def scored(self, stream: int, step: int, mean_reward: float, now: float) -> list[Effect]:
        """The batch's mean reward is known: its stages may start."""
        tick = self.tick
        if tick is None or (tick.stream, tick.step) != (stream, step):
            raise RuntimeError(f"stream {stream} step {step} was not asked to be scored")
        tick.reward = mean_reward
        if not tick.stages:
            return self._end_tick(tick, release=None)
        first = tick.stages[0]
        return [RequestGang(stage=first, role=stage_role(self.spec, first))]

    def rolled(self, stream: int, step: int, now: float, *, oldest_version: float = math.inf) -> list[Effect]:
        """Every trajectory of the batch finished; ``oldest_version``: the oldest weights any of them used."""
        self.rollouts.rolled(stream, step, now, oldest_version)
        out = self.rollouts.produce(stream, now) if not self.plan.streaming else []
        out.append(DemandChanged(urgent=True))
        if self.rollouts.streams[stream].version == step:  # its training is in order: the step before is trained
            self.ready.append((stream, step))
        return out + self._next_tick()

    def published(self, stream: int, now: float) -> list[Effect]:
        """The trained weights are cached (and with the workers the weight gate moves at once): the step is trained."""
        tick = self.tick
        if tick is None or tick.stream != stream or tick.index < len(tick.stages):
            raise RuntimeError(f"stream {stream} has no training waiting for its weights")
        self.tick = None
        rec, dropped = self.rollouts.trained(stream, tick.step, tick.reward, now)
        if dropped:  # a dropped step never takes its training turn
            self.ready = deque(key for key in self.ready if key[0] != stream or key[1] not in dropped)
        self.train_s = max(self.train_s, math.fsum(tick.seconds))  # exact: the same whatever the stage order
        self.latencies.append(now - rec.rollout_start)
        if (stream, tick.step + 1) in self.rollouts.rolled_out:
            self.ready.append((stream, tick.step + 1))
        out: list[Effect] = [DropBatch(stream=stream, step=k) for k in dropped]
        out += self.rollouts.produce(stream, now) + [DemandChanged()]
        return out + self._next_tick() + self._finish_if_done(now)

    # ------------------------------------------------------------ queries

    def demand(
        self,
        *,
        loads: Sequence[WorkerLoad],
        trajectory_s: float,
        switch_s: float,
        longest_s: float,
        finished: int,
        leaving: int = 0,
        starting: Iterable[int] = (),
    ) -> ReportDemand:
        """The demand report, from the rollout engine's figures and the machine's own.

        Queued: the book's waiting trajectories, ``leaving`` ones still coming back from a worker
        taken away, and an announced batch (no longer counted as backlog) until it is produced.
        ``starting``: first GPUs of the bundles whose worker process is still starting.
        """
        r = self.rollouts
        ahead = sum(r.announced.values())
        return demand_report(
            pipeline_id=self.spec.pipeline_id,
            pending=len(self.book) + leaving + ahead,
            loads=loads,
            open_trajectories=r.open_trajectories() + ahead,
            backlog=r.backlog() - ahead,
            trajectory_s=trajectory_s,
            switch_s=switch_s,
            path_s=r.path_s(longest_s, self.train_s),
            finished=finished,
            starting=starting,
        )

    @property
    def history(self) -> list[StepTimes]:
        return self.rollouts.history

    @property
    def done(self) -> bool:
        return self.finished_s is not None

    # ------------------------------------------------------------ training

    def _next_tick(self) -> list[Effect]:
        if self.tick is not None or not self.ready:
            return []
        stream, step = self.ready.popleft()
        self.tick = _Tick(stream=stream, step=step, stages=tuple(self.plan.stages(stream, step)))
        return [Score(stream=stream, step=step)]

    def _tick_at(self, stage: Stage) -> _Tick:
        tick = self.tick
        if tick is None or tick.index >= len(tick.stages) or tick.stages[tick.index] is not stage:
            raise RuntimeError(f"{self.spec.pipeline_id}: no training is at stage {stage.value}")
        return tick

    def _end_tick(self, tick: _Tick, *, release: Stage | None) -> list[Effect]:
        r = self.rollouts
        out: list[Effect] = []
        if release is not None:
            ahead = r.opened_by(tick.stream, tick.step, tick.reward)
            if ahead:
                r.announced[tick.stream] = ahead
            out.append(ReleaseGang(stage=release, announce=ahead))
        last = r.stops(tick.stream, tick.reward) or tick.step + 1 >= r.streams[tick.stream].spec.steps
        return out + [Publish(stream=tick.stream, version=tick.step + 1, last=last)]

    def _finish_if_done(self, now: float) -> list[Effect]:
        if self.finished_s is None and self.rollouts.done() and self.tick is None:
            self.finished_s = now
            return [Finished()]
        return []

    def _work(self, stage: Stage) -> list[Effect]:
        if stage is Stage.INIT:
            return [Load(stage=stage, gpus=self.held[stage])]
        tick = self._tick_at(stage)
        return [self._book(stage, GangPhase.WORK), Work(stage=stage, stream=tick.stream, step=tick.step)]

    def _book(self, stage: Stage, phase: GangPhase) -> Book:
        activity = gang_activity(stage, phase)
        label = "" if activity is Activity.FREE else stage.value
        return Book(gpus=self.held[stage], activity=activity, stage=label)
