"""Shared layer: the rules of an RL step, written once for both shells.

The simulator (SimPy) and the executor (Ray) differ only in how time passes
and who does the work. What a step *is* lives here, pure (no I/O, clock,
randomness or driver imports), and both shells call it:

- the stage sequence of a step and the role (and so the GPUs) each stage
  occupies; the reference log-probs run on the actor's training GPUs when a
  job maps no ``reference`` role;
- the staleness gate: when the rollout of a step may start;
- the demand report, with one meaning for each of its numbers;
- the :class:`~rlix.core.PipelineSpec` built from a job description, and the
  home partition of a job that names none;
- the activity a GPU books in each phase of a gang stage (load, work, offload)
  and of a rollout worker (load, weight sync, busy, idle, offload), and when
  each rollout worker process starts (:func:`warm_order`);
- the lower bounds on a run's makespan.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from rlix.core import JobKind, PipelineSpec, ReportDemand, Role, RoleSpec, Stage, WorkerLoad
from rlix.core.types import DEFAULT_STAGE_ROLE, Gpus
from rlix.metrics import Activity

# Non-rollout stages of one step, in the order a step runs them.
STEP_STAGES = (Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS, Stage.VALUE_COMPUTE, Stage.CRITIC_TRAIN, Stage.ACTOR_TRAIN)


class JobModelError(ValueError):
    """A job description that breaks a rule of the step (one line, names the stage and the fix)."""


# ------------------------------------------------------------------ stages


def step_sequence(stages: Iterable[Stage]) -> tuple[Stage, ...]:
    """The non-rollout stages a step runs, in step order."""
    present = set(stages)
    extra = present.difference(STEP_STAGES)
    if extra:
        names = ", ".join(sorted(s.value for s in extra))
        raise JobModelError(f"{names} is not a stage of a step; a step runs {', '.join(s.value for s in STEP_STAGES)}")
    return tuple(s for s in STEP_STAGES if s in present)


def executor_stages(*, kl: bool) -> tuple[Stage, ...]:
    """The stages of a GRPO step in the executor: old log-probs, reference log-probs (with a KL term), training."""
    wanted = [Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN] + ([Stage.REF_LOGPROBS] if kl else [])
    return step_sequence(wanted)


def stage_role(spec: PipelineSpec, stage: Stage) -> Role:
    """The role whose mapping ``stage`` occupies (reference falls back to the actor's training GPUs).

    Model load (``INIT``) has no single role: it occupies :attr:`PipelineSpec.init_gpus`.
    """
    role = DEFAULT_STAGE_ROLE[stage]
    if role is Role.REFERENCE and not spec.has_role(Role.REFERENCE):
        return Role.ACTOR_TRAIN
    if not spec.has_role(role):
        raise JobModelError(f"stage {stage.value} needs a '{role.value}' role mapping; add roles.{role.value} or drop the stage")
    return role


def stage_gpus(spec: PipelineSpec, stage: Stage) -> Gpus:
    """The GPUs ``stage`` is granted as one gang."""
    if stage is Stage.INIT:
        return spec.init_gpus
    return spec.role(stage_role(spec, stage)).gpus


def check_stage_roles(spec: PipelineSpec, stages: Iterable[Stage]) -> None:
    """Raise :class:`JobModelError` if some stage has no mapping to run on."""
    for stage in step_sequence(stages):
        stage_role(spec, stage)


# ------------------------------------------------------------------ staleness


def rollout_gate(step: int, staleness: int) -> int | None:
    """The step whose training must finish before ``step``'s rollout starts (None: no wait).

    With staleness bound ``s`` the rollout of step ``k`` uses weights at most
    ``s`` versions old, so it waits for step ``k - 1 - s`` to be trained.
    """
    gate = step - 1 - staleness
    return gate if gate >= 0 else None


def rollout_may_start(step: int, trained: int, staleness: int) -> bool:
    """May the rollout of ``step`` start once ``trained`` steps are trained (the weight version)?"""
    gate = rollout_gate(step, staleness)
    return gate is None or trained > gate


class WeightGate(enum.Enum):
    """What a rollout worker does before a trajectory starts on it (:func:`weight_gate`)."""

    START = "start"  # it holds weights the trajectory may use: start it
    SYNC = "sync"  # load newer full weights first, then start it
    WAIT = "wait"  # it must drain first: nothing more starts on it until its running trajectories end


_START, _SYNC, _WAIT = WeightGate.START, WeightGate.SYNC, WeightGate.WAIT  # read once: the replay calls the gate per trajectory


def weight_gate(have: int, need: int, newest: int, *, idle: bool, streaming: bool, partial: bool) -> tuple[WeightGate, int]:
    """The one rule, in both shells, for the full weights under a trajectory: may one that needs weights
    ``need`` (its batch's version: none older may produce its tokens) start on a worker holding
    ``have`` (-1: none), when ``newest`` is the newest trained version? Returns the decision and the
    version the trajectory is to meet (``have`` where it starts at once).

    - It starts where the worker's weights are new enough, except that under streaming an ``idle``
      worker first moves to the newest weights (nothing of its own runs on the old ones).
    - Otherwise the worker syncs, to the newest weights (a trainer keeps only those), if it is idle, or
      under ``partial`` rollout (its running trajectories go on under the new weights).
    - Otherwise it waits: full weights change only on an idle worker.
    """
    want = max(newest, need)
    if have >= need and not (streaming and idle and have < want):
        return _START, have
    if idle or partial:
        return _SYNC, want
    return _WAIT, want


# ------------------------------------------------------------------ demand


def demand_report(
    *,
    pipeline_id: str,
    pending: int,
    loads: Sequence[WorkerLoad] = (),
    open_trajectories: int = 0,
    backlog: int = 0,
    trajectory_s: float = 0.0,
    switch_s: float = 0.0,
    path_s: float = 0.0,
    finished: int = 0,
    starting: Iterable[int] = (),
) -> ReportDemand:
    """A pipeline's rollout demand, with one meaning in both shells.

    - ``pending``: trajectories (or continuations of aborted ones) waiting for a slot;
    - ``loads``: trajectories running now, per awake worker;
    - ``open_trajectories``: all trajectories of the rollout batches produced and
      not yet complete (finished ones included) -- the ``batch_size`` that
      near-finished protection compares the remaining work with;
    - ``backlog``: trajectories of steps not produced yet;
    - ``trajectory_s``: mean generation seconds of the trajectories finished so far (0: none yet);
    - ``switch_s``: seconds to wake one more worker and sync its weights (0: unknown);
    - ``path_s``: seconds of the job's chain of steps still ahead (:func:`remaining_path_s`; 0: unknown);
    - ``finished``: trajectories finished so far, all steps (0: unknown; a worker given to the job
      after it starved is then kept, while busy, for the scheduler's whole ``turn_limit_s``);
    - ``starting``: first GPUs of its rollout bundles whose worker process is still starting.
    """
    if min(pending, open_trajectories, backlog, finished) < 0 or min(trajectory_s, switch_s, path_s) < 0:
        raise JobModelError(f"{pipeline_id}: demand counts and trajectory seconds must be >= 0")
    return ReportDemand(
        pipeline_id=pipeline_id,
        pending=pending,
        loads=tuple(sorted(loads, key=attrgetter("first_gpu"))),
        batch_size=open_trajectories,
        backlog=backlog,
        trajectory_s=trajectory_s,
        switch_s=switch_s,
        path_s=path_s,
        finished=finished,
        starting=tuple(sorted(set(starting))),
    )


# ------------------------------------------------------------------ topology


class RoleLike(Protocol):
    gpus: Sequence[int]
    gpus_per_worker: int


def pipeline_spec(
    *,
    pipeline_id: str,
    roles: Mapping[str, RoleLike],
    kind: str | JobKind,
    slots_per_worker: int,
    home: Iterable[int] = (),
    resumable: bool,
    priority: int = 0,
    tenant: str = "",
    resident_gb: float = 0.0,
) -> PipelineSpec:
    """The topology a job registers, built the same way from a trace and from an executor config.

    ``resumable``: an aborted trajectory continues elsewhere with its progress
    (the executor always does this; a trace says ``preempt: continue``).
    An empty ``home`` stays empty: the job named none (:attr:`PipelineSpec.home_gpus` is its default).
    """
    specs = tuple(
        RoleSpec(role=Role(name), gpus=tuple(sorted(r.gpus)), gpus_per_worker=r.gpus_per_worker)
        for name, r in sorted(roles.items())
    )
    return PipelineSpec(
        pipeline_id=pipeline_id,
        roles=specs,
        kind=JobKind(kind),
        slots_per_worker=slots_per_worker,
        home=tuple(sorted(home)),
        resumable=resumable,
        priority=priority,
        tenant=tenant,
        resident_gb=resident_gb,
    )


# ------------------------------------------------------------------ activity


class GangPhase(enum.Enum):
    """The phases a GPU goes through while a gang stage holds it."""

    LOAD = "load"  # model / optimizer state onto the GPU
    WORK = "work"
    OFFLOAD = "offload"
    RELEASED = "released"


def gang_activity(stage: Stage, phase: GangPhase) -> Activity:
    """What a GPU held by ``stage`` is booked as in ``phase`` (model load is switching throughout)."""
    if phase is GangPhase.RELEASED:
        return Activity.FREE
    if phase is GangPhase.WORK and stage is not Stage.INIT:
        return Activity.WORK
    return Activity.SWITCH


class WorkerPhase(enum.Enum):
    """What a rollout worker's GPUs go through, in both shells."""

    START = "start"  # an expand onto a worker whose process is still starting (building its engine)
    LOAD = "load"  # an expand: the worker wakes and loads the newest weights
    WEIGHT_SYNC = "weight_sync"  # a newer version synced to a live worker
    BUSY = "busy"  # generating
    IDLE = "idle"  # awake with nothing to generate
    OFFLOAD = "offload"  # a shrink: in-flight work aborted, weights dropped
    GONE = "gone"  # nothing of the worker's on the GPUs any more


_WORKER_BOOK = {
    WorkerPhase.START: (Activity.SWITCH, "start"),
    WorkerPhase.LOAD: (Activity.SWITCH, "load"),
    WorkerPhase.WEIGHT_SYNC: (Activity.SWITCH, "weight_sync"),
    WorkerPhase.BUSY: (Activity.WORK, "rollout"),
    WorkerPhase.IDLE: (Activity.HELD, "rollout"),
    WorkerPhase.OFFLOAD: (Activity.SWITCH, "offload"),
    WorkerPhase.GONE: (Activity.FREE, ""),
}


def worker_booking(phase: WorkerPhase) -> tuple[Activity, str]:
    """What a rollout worker's GPUs are booked as in ``phase``, and the stage label they carry."""
    return _WORKER_BOOK[phase]


def warm_order(bundles: Iterable[Gpus], home: Iterable[int]) -> tuple[tuple[Gpus, ...], tuple[Gpus, ...]]:
    """A job's rollout bundles whose worker processes start when it registers, and those that start
    once its model is loaded: its own home first (every bundle where it has none). Process start-up
    costs host CPU, so the processes a job needs only to borrow must not slow its model load, nor any
    other job's. A worker granted before its process is up waits for it."""
    bundles, home = tuple(bundles), set(home)
    if not home:
        return bundles, ()
    return tuple(b for b in bundles if home.issuperset(b)), tuple(b for b in bundles if not home.issuperset(b))


# ------------------------------------------------------------------ lower bounds


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """What a step costs, for the bounds: its rollout (trajectory seconds) and stage seconds."""

    trajectory_s: float  # sum of every trajectory's generation seconds
    longest_s: float  # the slowest trajectory's seconds
    stages: tuple[tuple[Stage, float], ...]


@dataclass(frozen=True, kw_only=True)
class JobShape:
    """A job as the bounds see it: topology, arrival, model load, staleness and its streams of steps."""

    spec: PipelineSpec
    arrival_s: float
    init_s: float
    staleness: int
    streams: tuple[tuple[StepShape, ...], ...]
    streaming: bool = False  # rollout batches may overlap (streaming rollout): only the staleness gate orders them


def lower_bounds(jobs: Sequence[JobShape], num_gpus: int) -> tuple[float, float]:
    """(work bound, critical-path bound) in seconds; the makespan beats neither.

    - work: all unavoidable GPU-seconds (model load, every gang stage over its
      mapping, every trajectory at full slot packing on its TP-wide worker)
      spread over every GPU, tightened by each job's own chain of steps: a
      piece of work that cannot start before ``tau`` and is followed by at
      least ``q`` seconds of its job's chain lies inside
      ``[tau, makespan - q]``, so ``makespan >= tau + q + (GPU-seconds of such
      pieces) / GPUs`` for every ``tau`` (a job's arrival) and ``q``;
    - critical path: the slowest job's steps chained by their dependencies
      (longest trajectory of each rollout, stage times, the staleness
      overlap), from its arrival, on an infinite cluster but for the gang
      stages that stop it: its co-tenants' (:func:`_blocked_s`) and, in a job
      of several streams (a multi-LoRA job's adapters), its other streams'
      over its whole rollout mapping (:func:`_siblings_s`).

    Switching other than the initial model load is left out, so both are true
    bounds whatever the policy.
    """
    pieces: list[Piece] = []
    owners: list[int] = []  # pieces[i] belongs to jobs[owners[i]]
    chains: list[float] = []
    for i, job in enumerate(jobs):
        stream_pieces = [_stream_pieces(job, steps) for steps in job.streams]
        finish = max(
            (
                stream_critical_path(steps, job.staleness, streaming=job.streaming) + _siblings_s(job, stream_pieces, k)
                for k, steps in enumerate(job.streams)
            ),
            default=0.0,
        )
        pieces += [p for stream in stream_pieces for p in stream]
        init = (job.spec.init_gpus, job.init_s)
        pieces.append(Piece(gpu_s=job.init_s * len(init[0]), start_s=job.arrival_s, tail_s=finish, gang=init))
        owners += [i] * (len(pieces) - len(owners))
        chains.append(job.arrival_s + job.init_s + finish)
    path = max((chain + _blocked_s(jobs, i, pieces, owners) for i, chain in enumerate(chains)), default=0.0)
    arrivals = sorted({0.0} | {job.arrival_s for job in jobs})
    return _window_bound(pieces, num_gpus, arrivals), path


def _blocked_s(jobs: Sequence[JobShape], i: int, pieces: Sequence[Piece], owners: Sequence[int]) -> float:
    """Seconds of other jobs' gang stages that must run after job ``i`` arrives and stop all of it.

    A gang stage over every GPU of the job's rollout mapping and over some GPU of each of its own
    gang stages leaves no GPU where any part of its chain could go on: none of its workers has a
    GPU, and none of its gang stages can be granted. Such stages also exclude one another (they
    share the rollout mapping's GPUs), so their seconds add to the chain. Only stages whose earliest
    start is at or after the job's arrival count: they lie between its arrival and the makespan.
    """
    job = jobs[i]
    rollout = _rollout_gpus(job)
    own = {frozenset(p.gang[0]) for p, o in zip(pieces, owners) if o == i and p.gang is not None}
    return sum(
        p.gang[1]
        for p, o in zip(pieces, owners)
        if o != i and p.gang is not None and p.start_s >= job.arrival_s and _covers(p, rollout) and _touches_all(p, own)
    )


def _siblings_s(job: JobShape, stream_pieces: Sequence[Sequence[Piece]], k: int) -> float:
    """Seconds of the job's other streams' gang stages over its whole rollout mapping: each stops
    all of stream ``k``.

    Such a stage leaves stream ``k`` nowhere to roll out, and the job trains one stream at a time
    (:class:`rlix.step.StepMachine` runs one training turn at a time), so none of stream ``k``'s
    own stages runs beside it either; the stages exclude one another, and all start after the
    job's model load.
    """
    rollout = _rollout_gpus(job)
    others = (p for j, stream in enumerate(stream_pieces) if j != k for p in stream)
    return sum(p.gang[1] for p in others if p.gang is not None and _covers(p, rollout))


def _rollout_gpus(job: JobShape) -> frozenset[int]:
    return frozenset(job.spec.role(Role.ACTOR_INFER).gpus)


def _covers(stage: Piece, gpus: frozenset[int]) -> bool:
    """Does gang piece ``stage`` hold every GPU of ``gpus``?"""
    return gpus.issubset(stage.gang[0])


def _touches_all(stage: Piece, gangs: set[frozenset[int]]) -> bool:
    """Does gang piece ``stage`` hold some GPU of each of ``gangs``?"""
    return all(not g.isdisjoint(stage.gang[0]) for g in gangs)


@dataclass(frozen=True, kw_only=True)
class Piece:
    """Work the bounds place: its GPU-seconds, its earliest start and the seconds of its job's chain after it."""

    gpu_s: float
    start_s: float
    tail_s: float
    gang: tuple[Gpus, float] | None = None  # a gang stage's GPUs and seconds (None: a rollout)


def _window_bound(pieces: Sequence[Piece], num_gpus: int, taus: Sequence[float]) -> float:
    """max over tau and q of tau + q + (GPU-seconds that must fit in [tau, end - q]) / GPUs.

    ``tau = 0`` with the smallest ``q`` is the plain work bound. Only job
    arrivals are tried as ``tau``: any ``tau`` gives a true bound, and this
    keeps the cost at (arrivals x pieces x log pieces).
    """
    best = 0.0
    for tau in taus:
        inside = sorted((p for p in pieces if p.start_s >= tau), key=lambda p: (-p.tail_s, p.start_s, p.gpu_s))
        gpu_s = 0.0
        for p in inside:  # every piece with a chain of at least p.tail_s after it is already summed
            gpu_s += p.gpu_s
            best = max(best, tau + p.tail_s + gpu_s / num_gpus)
    return best


def _stream_pieces(job: JobShape, steps: Sequence[StepShape]) -> list[Piece]:
    """Each rollout and gang stage of one stream as a piece (times from the job's arrival)."""
    spec = job.spec
    per_traj = spec.role(Role.ACTOR_INFER).gpus_per_worker / spec.slots_per_worker  # GPU-s per trajectory-s
    offset = job.arrival_s + job.init_s
    longest = [step.longest_s for step in steps]
    train = [sum(dict(step.stages).get(s, 0.0) for s in STEP_STAGES) for step in steps]
    roll_start, train_start = _earliest_starts(longest, train, job.staleness, job.streaming)
    after_roll, after_train = _chain_after(longest, train, job.staleness, job.streaming)
    pieces = []
    for k, step in enumerate(steps):
        pieces.append(Piece(gpu_s=step.trajectory_s * per_traj, start_s=offset + roll_start[k], tail_s=after_roll[k]))
        begin, left = train_start[k], train[k]
        for stage in STEP_STAGES:
            seconds = dict(step.stages).get(stage, 0.0)
            if seconds:
                left -= seconds
                gpus = stage_gpus(spec, stage)
                pieces.append(
                    Piece(
                        gpu_s=seconds * len(gpus),
                        start_s=offset + begin,
                        tail_s=max(left, 0.0) + after_train[k],
                        gang=(gpus, seconds),
                    )
                )
                begin += seconds
    return pieces


def _earliest_starts(
    longest: Sequence[float], train: Sequence[float], staleness: int, streaming: bool
) -> tuple[list[float], list[float]]:
    """When each rollout and each training can start at the earliest (unlimited GPUs, from the model load)."""
    roll_start: list[float] = []
    train_start: list[float] = []
    trained_at: list[float] = []
    for k in range(len(longest)):
        start = roll_start[-1] + longest[k - 1] if k and not streaming else 0.0
        gate = rollout_gate(k, staleness)
        if gate is not None:
            start = max(start, trained_at[gate])
        roll_start.append(start)
        train_start.append(max(start + longest[k], trained_at[-1] if trained_at else 0.0))
        trained_at.append(train_start[-1] + train[k])
    return roll_start, train_start


def _chain_after(
    longest: Sequence[float], train: Sequence[float], staleness: int, streaming: bool
) -> tuple[list[float], list[float]]:
    """Seconds of the stream's chain that must follow the end of each rollout and of each training."""
    n = len(longest)
    after_roll = [0.0] * n
    after_train = [0.0] * n
    for k in reversed(range(n)):
        gated = k + 1 + staleness  # the rollout whose gate is this training
        after_train[k] = max(
            train[k + 1] + after_train[k + 1] if k + 1 < n else 0.0,
            longest[gated] + after_roll[gated] if gated < n else 0.0,
        )
        next_roll = longest[k + 1] + after_roll[k + 1] if k + 1 < n and not streaming else 0.0
        after_roll[k] = max(train[k] + after_train[k], next_roll)
    return after_roll, after_train


@functools.lru_cache(maxsize=4096)  # pure; every demand report asks, with the same figures between two trainings
def remaining_path_s(steps_left: int, staleness: int, *, longest_s: float, train_s: float, streaming: bool = False) -> float:
    """Seconds of one stream's chain still ahead, from what was measured so far.

    Each step not yet trained (the one rolling out included) is taken to wait
    for a trajectory as slow as the slowest seen and a training as long as the
    longest seen, chained as :func:`stream_critical_path` chains steps. Both
    shells report it, so the scheduler can favour the job that sets the makespan.
    """
    step = StepShape(trajectory_s=0.0, longest_s=longest_s, stages=((Stage.ACTOR_TRAIN, train_s),))
    return stream_critical_path([step] * max(steps_left, 0), staleness, streaming=streaming)


def stream_critical_path(steps: Sequence[StepShape], staleness: int, *, streaming: bool = False) -> float:
    """End of the last training of one stream with unlimited GPUs (seconds after its model load).

    In batch rollout a step's rollout also waits for the previous rollout to
    end; in streaming rollout only the staleness gate holds it back.
    """
    rolled: list[float] = []
    trained: list[float] = []
    for k, step in enumerate(steps):
        start = rolled[-1] if rolled and not streaming else 0.0
        gate = rollout_gate(k, staleness)
        if gate is not None:
            start = max(start, trained[gate])
        rolled.append(start + step.longest_s)
        begin = max(rolled[-1], trained[-1] if trained else 0.0)
        seconds = dict(step.stages)
        trained.append(begin + sum(seconds.get(s, 0.0) for s in STEP_STAGES))
    return trained[-1] if trained else 0.0
