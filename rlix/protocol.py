"""The rlix scheduler's protocol: every call a pipeline, a submitter or an operator makes to the
cluster's scheduler, its reply, and the errors it answers with.

Pure (no Ray): :mod:`rlix.transport` carries a request to the scheduler and its
reply back, and :mod:`rlix.client` is the library built on both. The scheduler
answers one call, ``handle(request, version)``; a client speaking another
``PROTOCOL_VERSION`` is refused with :class:`VersionMismatch`, one line naming
both versions.

Three parties speak it:

- a **pipeline** (rlix's own job coordinator, or one written outside rlix)
  registers its GPU topology and its :class:`Endpoint`, asks for and releases
  gang stages, reports its rollout demand and progress, and leaves;
- a **submitter** (``rlix-run`` joining a shared scheduler) claims its jobs'
  names under a lease it renews, and learns which were cancelled;
- an **operator** (the ``rlix`` tool) reads status and the timeline, cancels
  jobs, and starts and stops the service.

The scheduler calls back through the pipeline's endpoint: ``expand(gpus)``
(start a rollout worker there), ``shrink(gpus, reason)`` (stop it; return once
its GPUs are free) and ``stop()`` (the job was cancelled). The core's own
events and specs (:class:`~rlix.core.PipelineSpec`, :class:`~rlix.core.ReportDemand`,
:class:`~rlix.core.WorkerLost`, :class:`~rlix.core.Rejoin`) travel inside the
requests as the core takes them. A request the core refuses raises
:class:`rlix.core.SchedulingError`.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # annotations only: the rlix tool reads a status without loading the core
    from rlix.core import PipelineSpec, Rejoin, ReportDemand, Role, Stage, WorkerLost
    from rlix.core.types import Gpus

PROTOCOL_VERSION = 3  # raised whenever a request or reply changes shape


class Outcome(enum.Enum):
    """How a job ended, as it says when it leaves."""

    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped on request: what it had done is kept

    @classmethod
    def of(cls, value: Outcome | str) -> Outcome:
        """``value`` as an outcome; a word that is none is refused in one line naming the three."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"a job ends finished, failed or cancelled, not {value!r}") from None


# ------------------------------------------------------------------ errors


class VersionMismatch(RuntimeError):
    """The client and the scheduler speak different versions of this protocol."""


def check_version(version: int) -> None:
    """Refuse a client of another protocol version, in one line naming both."""
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"this client speaks rlix protocol {version} and the rlix scheduler {PROTOCOL_VERSION}; "
            "use one rlix version on both sides (or restart the scheduler with 'rlix scheduler stop' and 'rlix scheduler start')"
        )


class PipelineUnknown(RuntimeError):
    """The scheduler does not know this pipeline (it restarted since the pipeline registered): rejoin, then retry."""


class PipelineGone(RuntimeError):
    """The scheduler unregistered this pipeline (cancelled, unreachable, or its submitter gone): stop using it."""


class NameTaken(ValueError):
    """A job name is already in use on the cluster's scheduler."""


def asker() -> str:
    """Who asks, as a request names them: ``user@host`` of this process."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 -- no user name in this environment (a container without one)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, kw_only=True)
class Stopped:
    """Why a job was stopped on request: who asked (``user@host``), and whether it was the scheduler
    itself that was stopped (``rlix scheduler stop --force``) rather than the job cancelled."""

    by: str = ""
    scheduler_stopped: bool = False

    def line(self) -> str:
        who = f" by {self.by}" if self.by else ""
        return f"the rlix scheduler was stopped{who}" if self.scheduler_stopped else f"cancelled{who}"


class Endpoint(Protocol):
    """What the scheduler calls on a pipeline (a Ray actor with these async methods; or
    :class:`rlix.client.CallbackEndpoint`, which makes one of three plain coroutines)."""

    async def expand(self, gpus: Gpus) -> None:
        """Start a rollout worker on ``gpus`` (they are the pipeline's until a shrink)."""

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        """Stop the rollout worker on ``gpus``; return once they are free. ``reason``: a
        :class:`rlix.core.ShrinkReason` value (another stage or job needs them, the pipeline left...)."""

    async def stop(self, why: Stopped | None = None) -> None:
        """The job was cancelled (``why``: by whom; None from an older caller): end the run, then
        unregister as ``cancelled``."""


# ------------------------------------------------------------------ replies and the values inside requests


@dataclass(frozen=True, kw_only=True)
class GpuMap:
    """The cluster's GPUs as reserved in Ray (:mod:`rlix.exec.control.gpu_reservation`): per rlix
    node, its placement group (one bundle per GPU, an opaque Ray handle) and each GPU's device id
    on its Ray node. Empty: nothing reserved (one node, every process on it, ids as numbered)."""

    groups: tuple[Any, ...] = ()
    devices: tuple[tuple[str, ...], ...] = ()  # as Ray names them (an index, or a UUID / MIG id)


@dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    """What a running scheduler service manages, for a submitter joining it."""

    nodes: int
    gpus_per_node: int
    policy: str
    started_at: float  # time.time() when the service was first started (its clock's zero)
    restarts: int = 0  # times Ray restarted the service's actor since
    life: str = ""  # an id of this life of the actor (new at each restart)
    gpus: GpuMap = GpuMap()  # the GPUs the service reserved in Ray, where submitters place their processes


@dataclass(frozen=True, kw_only=True)
class GrantReply:
    """The scheduler actor's answer to a gang request, once a plan grants it."""

    gpus: Gpus
    queued_s: float  # seconds the request waited inside the scheduler for GPUs


@dataclass(frozen=True, kw_only=True)
class JobClaim:
    """A job an ``rlix-run`` submission claims on the shared scheduler, by name."""

    name: str
    priority: int
    steps: int  # steps it will train (rlix status shows steps done of these)
    id: str = ""  # the job id the scheduler gave it ("" until claimed)
    config: str = ""  # the config it was submitted from (for rlix history)
    log: str = ""  # its run's log, host:path (for rlix logs)


@dataclass(frozen=True, kw_only=True)
class JobNote:
    """What a pipeline tells the scheduler about its progress, for ``rlix status``."""

    pipeline_id: str
    loaded: bool  # its model is loaded (it runs steps); False while it loads
    steps_done: int
    steps_total: int


@dataclass(frozen=True, kw_only=True)
class CancelReply:
    """What ``rlix cancel`` did: whether the job was found, whether it was refused (another user's),
    and what happened to it."""

    found: bool
    message: str
    refused: bool = False


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """One job in ``rlix status``: its state, what it holds now, and its GPU-seconds since it registered."""

    id: str  # its job id (one per submission)
    name: str  # its name (unique among jobs not ended)
    submitter: str  # who submitted it (host:pid of an rlix-run, or the pipeline's own client)
    user: str = ""  # user@host that submitted it
    state: str  # submitted, queued, loading, running, finished, failed, cancelled
    phases: tuple[tuple[str, float], ...] = ()  # (phase, when it was entered: seconds on the service's clock)
    priority: int
    gpus: tuple[tuple[int, str], ...]  # (GPU, what holds it: a stage name or "rollout") now
    steps_done: int
    steps_total: int
    gpu_s: float  # GPU-seconds it held
    lent_s: float  # GPU-seconds other jobs held of its home GPUs
    borrowed_s: float  # GPU-seconds it held outside its home GPUs
    fair_s: float = 0.0  # its fair share: each GPU-second of its home split equally between the jobs there
    queue_position: int | None  # 1 = next to be admitted; None = not queued
    error: str = ""
    reason: str = ""  # why a queued or submitted job waits, in a line
    log: str = ""  # its run's log, host:path ("" for a pipeline that keeps none)
    tenant: str = ""  # the tenant it belongs to ("" for none)


@dataclass(frozen=True, kw_only=True)
class ClusterStatus:
    """The scheduler service's answer to ``rlix status``."""

    nodes: int
    gpus_per_node: int
    policy: str
    uptime_s: float  # seconds since the service started
    busy_gpu_s: float  # GPU-seconds some job held a GPU, since the service started
    utilization: float  # busy_gpu_s over (GPUs x uptime)
    idle_fraction: float  # 1 - utilization
    queue_length: int
    jobs: tuple[JobRow, ...]
    restarts: int = 0
    started_at: float = 0.0  # time.time() when the service first started (the zero of its clock)
    forgotten_jobs: int = 0  # ended jobs no longer listed (in the history since --keep-ended); not in ``jobs``
    forgotten_gpu_s: float = 0.0  # their GPU-seconds: the rows' gpu_s and this add up to busy_gpu_s


def status_from_json(data: dict) -> ClusterStatus:
    """A :class:`ClusterStatus` from its JSON (``rlix status --json``, or the service's ``/status`` page)."""

    def row(r: dict) -> JobRow:
        return JobRow(**{**r, "gpus": tuple(map(tuple, r["gpus"])), "phases": tuple(map(tuple, r["phases"]))})

    return ClusterStatus(**{**data, "jobs": tuple(row(r) for r in data["jobs"])})


@dataclass(frozen=True, kw_only=True)
class LogChunk:
    """A piece of a job's run log, as the scheduler reads it on its node (``found`` False: not there)."""

    found: bool
    text: str  # whole lines, from the offset asked for
    offset: int  # where the next read starts
    ended: bool  # the job has ended (nothing more will come of it)


@dataclass(frozen=True, kw_only=True)
class HistoryRow:
    """A job that ended, as ``rlix history`` lists it (times in Unix seconds)."""

    id: str
    name: str
    user: str  # user@host that submitted it
    submitter: str
    config: str  # the config it was submitted from ("" for a pipeline of its own)
    state: str  # finished, failed or cancelled
    reason: str  # how it ended, in a line ("" for a job that finished)
    submitted_at: float
    ended_at: float
    phases: tuple[tuple[str, float], ...]  # (phase, when it was entered)
    steps_done: int
    steps_total: int
    gpu_s: float
    lent_s: float
    borrowed_s: float
    log: str = ""  # its run's log, host:path ("" for a pipeline that keeps none; rows written before rlix kept it)


@dataclass(frozen=True, kw_only=True)
class TimelineReply:
    """The cluster's activity since the service started, for ``rlix timeline``."""

    recorder: object  # a rlix.metrics.UsageRecorder, closed at ``now``
    now: float  # seconds since the service started
    start: float = 0.0  # where the chart's segments start: the service's last (re)start
    jobs: tuple[str, ...]  # job ids
    utilization: float = 0.0  # as rlix status says it at ``now``


@dataclass(frozen=True, kw_only=True)
class SchedulerStats:
    """The scheduler actor's counts and timings, for the driver's report."""

    plans: int
    plan_s: float  # seconds spent inside core planning
    unmet: tuple[tuple[float, bool], ...] = ()  # (t, some pipeline has queued trajectories)
    shrinks: int = 0
    expands: int = 0
    grants: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)


# ------------------------------------------------------------------ requests


@dataclass(frozen=True)
class PipelineCall:
    """A call a pipeline makes (rlix's own coordinators and the driver of a run too)."""

    party: ClassVar[str] = "pipeline"


@dataclass(frozen=True)
class SubmitterCall:
    """A call an ``rlix-run`` submission makes on a shared scheduler."""

    party: ClassVar[str] = "submitter"


@dataclass(frozen=True)
class AdminCall:
    """A call of the operator's ``rlix`` tool (and of a run's driver, on its private scheduler)."""

    party: ClassVar[str] = "admin"


@dataclass(frozen=True, kw_only=True)
class Register(PipelineCall):
    """Register a pipeline's topology and its endpoint (returns None). ``submitter``: the
    submission that claimed the job's name ("" for a pipeline that claimed none; a name someone
    else claimed is refused with :class:`NameTaken`)."""

    spec: PipelineSpec
    endpoint: Any  # an Endpoint: the Ray actor handle the scheduler calls back
    submitter: str = ""
    user: str = ""  # who runs it: user@host
    # Killing the endpoint kills the pipeline's processes (an rlix-run coordinator). False: a callback
    # inbox its pipeline's process owns, which the scheduler cannot end: a cancel waits for it to leave.
    endpoint_owns: bool = True


@dataclass(frozen=True, kw_only=True)
class RejoinPipeline(PipelineCall):
    """Register again, with what it holds, at a scheduler that restarted since (returns None;
    :class:`PipelineGone` if its holdings clash with the new scheduler's ledger)."""

    event: Rejoin
    endpoint: Any
    user: str = ""  # who runs it: user@host
    endpoint_owns: bool = True  # as in Register


@dataclass(frozen=True, kw_only=True)
class RequestGang(PipelineCall):
    """Ask for ``stage``'s gang on ``role``'s GPUs (None: the stage's own role, or the model
    load's GPUs for INIT); the reply, a :class:`GrantReply`, comes once a plan grants it.
    ``after``: a stage the pipeline holds, released in the same plan (a hand-over)."""

    pipeline_id: str
    stage: Stage
    role: Role | None = None
    after: Stage | None = None


@dataclass(frozen=True, kw_only=True)
class ReleaseGang(PipelineCall):
    """Give ``stage``'s GPUs back; ``demand``: the pipeline's demand from now on, planned with
    the release (its GPUs are not lent out in between)."""

    pipeline_id: str
    stage: Stage
    demand: ReportDemand | None = None


@dataclass(frozen=True, kw_only=True)
class Report(PipelineCall):
    """The pipeline's rollout demand: what the scheduler sizes its rollout workers from."""

    demand: ReportDemand


@dataclass(frozen=True, kw_only=True)
class Lost(PipelineCall):
    """A rollout worker of the pipeline is gone without a plan's shrink: its GPUs are free."""

    event: WorkerLost


@dataclass(frozen=True, kw_only=True)
class Note(PipelineCall):
    """The pipeline's progress, for ``rlix status``."""

    note: JobNote


@dataclass(frozen=True, kw_only=True)
class Unregister(PipelineCall):
    """The pipeline leaves, saying how it ended: every GPU it holds goes back."""

    pipeline_id: str
    status: Outcome = Outcome.FAILED
    error: str = ""
    # The endpoint it registered with: a leave from another (a run whose registration under the name was
    # refused, or one dropped since the name ran again) ends nothing. None: by name (the rlix-run that claimed it).
    endpoint: Any = None

    def __post_init__(self) -> None:  # "finished" as well as Outcome.FINISHED; a word that is neither is refused here
        object.__setattr__(self, "status", Outcome.of(self.status))
        if not isinstance(self.error, str):  # an exception, say: its text (the history keeps text)
            object.__setattr__(self, "error", str(self.error))


@dataclass(frozen=True, kw_only=True)
class Alive(PipelineCall):
    """A keep-alive: :class:`PipelineUnknown` if the scheduler restarted since the pipeline
    registered, :class:`PipelineGone` if it dropped the pipeline."""

    pipeline_id: str


@dataclass(frozen=True, kw_only=True)
class Knows(PipelineCall):
    """Whether the scheduler knows the pipeline (a bool)."""

    pipeline_id: str


@dataclass(frozen=True, kw_only=True)
class RolloutBundles(PipelineCall):
    """The bundles (GPU tuples) the policy may ever give the pipeline's rollout workers."""

    pipeline_id: str


@dataclass(frozen=True, kw_only=True)
class AdmissionRefusal(PipelineCall):
    """Why the pipeline's model load waits for its queues (one line), or None."""

    pipeline_id: str


@dataclass(frozen=True)
class Info(SubmitterCall):
    """What the scheduler manages (a :class:`ServiceInfo`)."""


@dataclass(frozen=True, kw_only=True)
class Claim(SubmitterCall):
    """Claim job names for ``submitter`` (:class:`NameTaken` if one is in use); the reply is their
    job ids, in order. ``user``: who submits them (user@host)."""

    submitter: str
    jobs: tuple[JobClaim, ...]
    user: str = ""


@dataclass(frozen=True, kw_only=True)
class Renew(SubmitterCall):
    """Renew ``submitter``'s lease on the jobs it has not seen end (with their ids); the reply names
    those cancelled before they started, and why (a tuple of (name, :class:`Stopped`))."""

    submitter: str
    jobs: tuple[JobClaim, ...]
    user: str = ""


@dataclass(frozen=True, kw_only=True)
class Leave(SubmitterCall):
    """The submitter is done: its lease ends."""

    submitter: str


@dataclass(frozen=True)
class Start(AdminCall):
    """Start planning (:class:`rlix.core.SchedulingError` if the scheduler has no GPU reservation)."""


@dataclass(frozen=True)
class Status(AdminCall):
    """The cluster's state and every job's row (a :class:`ClusterStatus`)."""


@dataclass(frozen=True)
class Timeline(AdminCall):
    """The cluster's activity since the scheduler started (a :class:`TimelineReply`)."""


@dataclass(frozen=True, kw_only=True)
class Cancel(AdminCall):
    """Cancel a job, by id or name (a :class:`CancelReply`): a running one is asked to stop; one not
    started never starts. ``by``: who asks (``user@host``), told to the job's submitter; another
    user's job is refused unless ``force``."""

    job: str
    by: str = ""
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class ReadLog(AdminCall):
    """The lines of a job's run log from byte ``offset`` (a :class:`LogChunk`), read by the scheduler on its node."""

    job: str
    offset: int = 0


@dataclass(frozen=True, kw_only=True)
class JobHistory(AdminCall):
    """The jobs that ended, oldest first (a tuple of :class:`HistoryRow`); ``user``: only theirs (a
    name, or user@host); ``since``: ended at or after this Unix time."""

    user: str = ""
    since: float = 0.0


@dataclass(frozen=True, kw_only=True)
class CancelAll(AdminCall):
    """Cancel every job not ended, because the scheduler is being stopped by ``by``; the reply is how many."""

    by: str = ""


@dataclass(frozen=True)
class KillAll(AdminCall):
    """Kill every pipeline still registered and give its GPUs back; the reply names them."""


@dataclass(frozen=True)
class Busy(AdminCall):
    """The jobs not ended (a list of names)."""


@dataclass(frozen=True)
class Stats(AdminCall):
    """The scheduler's counts and timings (a :class:`SchedulerStats`)."""


@dataclass(frozen=True)
class Holdings(AdminCall):
    """The GPUs each pipeline holds now (a dict of name to GPU tuple)."""


@dataclass(frozen=True)
class Stop(AdminCall):
    """Stop planning and every background task (before the actor is killed)."""


Request = PipelineCall | SubmitterCall | AdminCall


# ------------------------------------------------------------------ checking what a client sends

# Requests whose values the scheduler keeps (its job ledger, the history, status): a value of another
# type (a numpy number, a None) would break them for every job later, so it is refused as it comes.
KEPT = ("Register", "Note", "Claim", "Renew", "Unregister")


def check_request(request: Request) -> None:
    """Refuse, with :class:`TypeError` in one line naming the field, a request the scheduler keeps
    (:data:`KEPT`) whose values are not of their declared types."""
    if type(request).__name__ in KEPT:
        _check(request, type(request), type(request).__name__)


def _check(value: Any, hint: Any, path: str) -> None:
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if origin in (typing.Union, types.UnionType):
        problems = []
        for arm in args:
            try:
                return _check(value, arm, path)
            except TypeError as exc:
                problems.append(exc)
        raise problems[0]
    if origin is tuple:
        _expect(value, tuple, path)
        arms = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(arms) != len(value):
            raise TypeError(f"{path}: expected {len(arms)} items, got {len(value)}")
        for i, (item, arm) in enumerate(zip(value, arms)):
            _check(item, arm, f"{path}[{i}]")
        return
    if origin is not None:  # another generic (dict[...], Literal[...]): its container type only
        _expect(value, origin if isinstance(origin, type) else object, path)
        return
    if hint is float:  # a whole number is a number too
        _expect(value, (int, float), path)
    elif isinstance(hint, type):
        _expect(value, hint, path)
        if is_dataclass(hint):
            for name, arm in _hints(hint).items():
                _check(getattr(value, name), arm, f"{path}.{name}")


def _expect(value: Any, kind: type | tuple[type, ...], path: str) -> None:
    if isinstance(value, bool) and kind in (int, (int, float)) or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "a number"
        raise TypeError(
            f"{path}: expected {want}, got {type(value).__module__}.{type(value).__qualname__} ({value!r:.40}); "
            "send plain Python values"
        )


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their types, the core's names resolved (they are annotations only here)."""
    import typing

    from rlix import core
    from rlix.core import types as core_types

    names = {**vars(core_types), **vars(core), **globals()}
    hints = typing.get_type_hints(cls, globalns=names)
    return {f.name: hints[f.name] for f in fields(cls) if f.init}
