"""Core layer: the value types the policy core speaks in.

Everything here is a frozen, keyword-only dataclass or an Enum. The shells
(``rlix.sim`` and ``rlix.exec``) build these, hand them to
:class:`rlix.core.Scheduler`, and carry out the :class:`Plan` it returns.
Times are seconds (floats) supplied by the caller; GPUs are integer ids
``0 .. nodes * gpus_per_node - 1``, node-major.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

Gpus = tuple[int, ...]


class Role(enum.Enum):
    """A cluster of workers inside one pipeline."""

    ACTOR_TRAIN = "actor_train"
    ACTOR_INFER = "actor_infer"
    CRITIC = "critic"
    REFERENCE = "reference"


class Stage(enum.Enum):
    """A unit of work that asks the scheduler for GPUs.

    ``value`` is the stage's name; :attr:`priority` orders stages (lower runs
    first). Only :attr:`ROLLOUT` is preemptable and allocated per worker;
    every other stage is gang-allocated over its role's whole mapping.
    """

    INIT = "init"
    ACTOR_TRAIN = "actor_train"
    CRITIC_TRAIN = "critic_train"
    OLD_LOGPROBS = "old_logprobs"
    REF_LOGPROBS = "ref_logprobs"
    VALUE_COMPUTE = "value_compute"
    ROLLOUT = "rollout"

    @property
    def priority(self) -> int:
        return _PRIORITY[self]


_PRIORITY = {
    Stage.INIT: 0,
    Stage.ACTOR_TRAIN: 1,
    Stage.CRITIC_TRAIN: 2,
    Stage.OLD_LOGPROBS: 3,
    Stage.REF_LOGPROBS: 4,
    Stage.VALUE_COMPUTE: 5,
    Stage.ROLLOUT: 6,
}

# The role whose mapping a gang stage occupies unless the request names one.
# INIT has no entry: model load occupies the union of the pipeline's
# non-rollout mappings (see PipelineSpec.init_gpus).
DEFAULT_STAGE_ROLE = {
    Stage.ACTOR_TRAIN: Role.ACTOR_TRAIN,
    Stage.OLD_LOGPROBS: Role.ACTOR_TRAIN,
    Stage.CRITIC_TRAIN: Role.CRITIC,
    Stage.VALUE_COMPUTE: Role.CRITIC,
    Stage.REF_LOGPROBS: Role.REFERENCE,
    Stage.ROLLOUT: Role.ACTOR_INFER,
}


class JobKind(enum.Enum):
    FULL_FINETUNE = "full_finetune"
    MULTI_LORA = "multi_lora"


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """``nodes`` machines of ``gpus_per_node`` GPUs each."""

    nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class RoleSpec:
    """The GPUs a role *may* use, cut into TP-sized worker bundles.

    ``gpus`` is sorted; consecutive runs of ``gpus_per_worker`` ids form the
    role's bundles, each of which must be contiguous and inside one node.
    """

    role: Role
    gpus: Gpus
    gpus_per_worker: int = 1

    @property
    def bundles(self) -> tuple[Gpus, ...]:
        tp = self.gpus_per_worker
        return tuple(self.gpus[i : i + tp] for i in range(0, len(self.gpus), tp))


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """A registered RL job's GPU topology.

    ``home`` is the job's dedicated partition if it names one (empty: none
    named, see :attr:`home_gpus`): the baselines confine each job to its
    home, and under ``rlix`` a named home is a guarantee. ``slots_per_worker`` is how many
    trajectories one rollout worker runs concurrently. ``resumable`` says an
    aborted trajectory continues elsewhere with its progress (partial
    rollout), so the planner may pack stragglers onto fewer workers.
    ``priority`` ranks jobs (higher wins, default 0): a higher-priority job's
    gang stages go before every lower-priority job's, and its rollout share
    weight is multiplied by ``priority_weight ** priority``. ``tenant`` names
    the tenant the job belongs to (one of :attr:`SchedulerConfig.tenants`;
    "" for none). ``open_limit`` is the most rollout trajectories the job can
    have open at once, declared at registration (its largest batch per stream
    times the batches that may roll out together, see :meth:`rlix.step.JobPlan.open_limit`):
    the demand the core weighs is bounded by it and by the trajectories running
    on the job's workers, so a report of more queued trajectories than that
    gains nothing. ``total_trajectories`` (all its steps) bounds its backlog the
    same way: at most what the job has not finished (``finished``) nor has
    open. 0 (either): undeclared, reports are taken as they are. ``batch_credit``
    says a new rollout batch of the job opens only once the batches before it
    have all finished, or after it released a gang stage (true of one stream of
    steps, or of any job whose batches wait for a training): the scheduler then
    credits its batches one by one (:meth:`rlix.core.state.PipelineEntry.credit_batches`).
    """

    pipeline_id: str
    roles: tuple[RoleSpec, ...]
    kind: JobKind = JobKind.FULL_FINETUNE
    slots_per_worker: int = 1
    home: Gpus = ()
    resumable: bool = False
    priority: int = 0
    tenant: str = ""  # the tenant it belongs to (SchedulerConfig.tenants); "" for none
    open_limit: int = 0  # most rollout trajectories it can have open at once (its batches in flight); 0: undeclared
    total_trajectories: int = 0  # trajectories of all its steps; 0: undeclared
    batch_credit: bool = False  # a batch opens only once those before it finished, or after a gang release
    resident_gb: float = 0.0  # memory its admitted model holds while it runs (the CPU weight cache), for queues

    def role(self, role: Role) -> RoleSpec:
        for spec in self.roles:
            if spec.role is role:
                return spec
        raise KeyError(role)

    def has_role(self, role: Role) -> bool:
        return any(spec.role is role for spec in self.roles)

    @property
    def rollout_tp(self) -> int:
        return self.role(Role.ACTOR_INFER).gpus_per_worker

    @property
    def init_gpus(self) -> Gpus:
        return tuple(sorted({g for s in self.roles if s.role is not Role.ACTOR_INFER for g in s.gpus}))

    @property
    def home_gpus(self) -> Gpus:
        """Its dedicated partition, where the baselines confine it: ``home`` if it names one; otherwise
        its training GPUs (every mapping but ``actor_infer``) when a rollout bundle lies inside them,
        else (rollout on GPUs of its own, disaggregated) every GPU it maps. Under ``rlix`` only an
        explicit ``home``, or the part of this one no other job maps, is a guarantee
        (:func:`rlix.core.homes.own_home`)."""
        if self.home:
            return self.home
        train = self.init_gpus
        if any(set(train).issuperset(b) for b in self.role(Role.ACTOR_INFER).bundles):
            return train
        return tuple(sorted({g for s in self.roles for g in s.gpus}))


@dataclass(frozen=True, kw_only=True)
class RolloutWorker:
    """One rollout worker: a pipeline's TP-sized bundle of GPUs."""

    pipeline_id: str
    gpus: Gpus

    @property
    def sort_key(self) -> tuple[str, int]:
        return (self.pipeline_id, self.gpus[0])


@dataclass(frozen=True, kw_only=True)
class GangHolder:
    """A granted non-rollout stage; never preempted."""

    pipeline_id: str
    stage: Stage


Holder = GangHolder | RolloutWorker


# ---------------------------------------------------------------- events


@dataclass(frozen=True, kw_only=True)
class Register:
    spec: PipelineSpec


@dataclass(frozen=True, kw_only=True)
class Unregister:
    """The pipeline is gone (finished, crashed or killed): free everything."""

    pipeline_id: str


@dataclass(frozen=True, kw_only=True)
class RequestStage:
    """Ask for a gang stage over ``role``'s mapping (default: the stage's)."""

    pipeline_id: str
    stage: Stage
    role: Role | None = None


@dataclass(frozen=True, kw_only=True)
class ReleaseStage:
    pipeline_id: str
    stage: Stage


@dataclass(frozen=True, kw_only=True)
class WorkerLoad:
    """Trajectories running now on the worker whose bundle starts at ``first_gpu``."""

    first_gpu: int
    active: int


@dataclass(frozen=True, kw_only=True)
class ReportDemand:
    """A pipeline's rollout progress: the planner's only view of its demand.

    ``pending`` trajectories wait for a slot; ``loads`` gives the running
    ones per worker; ``batch_size`` is the rollout batch they belong to (used
    to protect nearly finished batches). ``pending == 0`` and no load means
    the pipeline wants no rollout GPUs now.
    """

    pipeline_id: str
    pending: int
    loads: tuple[WorkerLoad, ...] = ()
    batch_size: int = 0
    backlog: int = 0  # trajectories of steps not started yet (0 if unknown)
    trajectory_s: float = 0.0  # observed mean seconds per finished trajectory (0 if unknown)
    switch_s: float = 0.0  # seconds to wake one new worker and sync its weights (0 if unknown)
    path_s: float = 0.0  # seconds of the job's chain of steps still ahead, from measured figures (0 if unknown)
    finished: int = 0  # trajectories finished so far, all steps (0 if unknown): ends a starving job's turn
    # First GPUs of its rollout bundles whose worker process is still starting: no worker goes there
    # until a report leaves them out (one placed there would hold the GPUs idle until its process is up).
    starting: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class WorkerLost:
    """The rollout worker on the bundle starting at ``first_gpu`` is gone (its process died
    or was killed for not waking in time): its GPUs are free again, nothing is shrunk."""

    pipeline_id: str
    first_gpu: int
    failed: bool = True  # it died or did not wake (False: drained, reported after a restart): lost_cooldown_s applies


@dataclass(frozen=True, kw_only=True)
class Rejoin:
    """A pipeline that held GPUs under a scheduler that has since restarted registers again with
    what it holds, so the new scheduler's ledger matches the cluster.

    ``spec`` is the topology it registered before; ``gangs`` the gang stages granted to it
    before the restart, each with its GPUs; ``workers`` the bundles of the rollout workers it
    holds; ``demand`` its latest demand report. ``admitted`` says its model load was granted
    before the restart: it counts as started (its home taken) even while it holds nothing; a
    pipeline holding any GPU counts as started anyway. ``admitted_at`` is when it was
    admitted (the ``now`` of that plan), so a restarted scheduler knows which of two jobs
    sharing a home came first (``home_guarantee``); None: at the rejoin, ties broken by
    pipeline id. Stages it still waits for are not
    listed here: it asks for them again with :class:`RequestStage` after rejoining.
    """

    spec: PipelineSpec
    gangs: tuple[tuple[Stage, Gpus], ...] = ()
    workers: tuple[Gpus, ...] = ()
    demand: ReportDemand | None = None
    admitted: bool = False
    admitted_at: float | None = None


Event = Register | Unregister | RequestStage | ReleaseStage | ReportDemand | WorkerLost | Rejoin


# ------------------------------------------------------------------ plan


class ShrinkReason(enum.Enum):
    GANG = "gang"  # a non-rollout stage needs the GPUs
    REBALANCE = "rebalance"  # another pipeline's share
    UNREGISTER = "unregister"  # the pipeline left


@dataclass(frozen=True, kw_only=True)
class Grant:
    """Start gang stage ``stage`` of ``pipeline_id`` on ``gpus``."""

    pipeline_id: str
    stage: Stage
    gpus: Gpus


@dataclass(frozen=True, kw_only=True)
class Shrink:
    worker: RolloutWorker
    reason: ShrinkReason


@dataclass(frozen=True, kw_only=True)
class Expand:
    worker: RolloutWorker


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to do now, in this order: shrinks, then grants, then expands."""

    now: float
    shrinks: tuple[Shrink, ...] = ()
    grants: tuple[Grant, ...] = ()
    expands: tuple[Expand, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.shrinks or self.grants or self.expands)


@dataclass(frozen=True, kw_only=True)
class TenantSpec:
    """A tenant's share of the cluster (the Kueue model): its jobs' GPUs, together, are split
    with the other tenants' by ``weight``; it gets at least ``guarantee_gpus`` whenever its jobs
    can use them, and never more than ``guarantee_gpus + borrow_limit_gpus`` (None: no limit) for its
    rollout or at a job's admission (its model load must fit beside the gang stages the tenant holds
    then; the later gang stages of jobs already admitted do not wait for the limit)."""

    name: str
    weight: float = 1.0
    guarantee_gpus: int = 0
    borrow_limit_gpus: int | None = None

    @property
    def limit_gpus(self) -> float:
        """The most GPUs its jobs may hold together (inf: no limit)."""
        return math.inf if self.borrow_limit_gpus is None else float(self.guarantee_gpus + self.borrow_limit_gpus)


NO_TENANT = TenantSpec(name="")  # the tenant of jobs that name none, when tenants are declared


@dataclass(frozen=True, kw_only=True)
class QueueSpec:
    """An admission limit (Kueue's quota) on a set of GPUs: the jobs whose gang mappings touch
    ``gpus`` may hold at most ``max_jobs`` admitted jobs at once (0: no limit on the count) and
    at most ``max_resident_gb`` of resident model memory (the jobs' ``resident_gb``, 0: no limit).
    A job waits for admission (its model load) only where such a limit says so, first come, first
    served within the queue."""

    name: str
    gpus: Gpus
    max_jobs: int = 0
    max_resident_gb: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Knobs of the rollout split (shared by every policy).

    - ``report_ttl_s``: a demand report older than this is stale; the
      pipeline's workers then count as lendable capacity.
    - ``protect_fraction``: a rollout batch with at most this fraction of its
      trajectories left is nearly done; its busy workers are not shrunk to
      rebalance.
    - ``min_residency_s``: a worker is not shrunk to rebalance until it has
      held its GPUs this long (hysteresis against thrashing).
    - ``rebalance_margin_workers``: a donor gives a worker away only while it
      ends no more than this far below its share (a receiver must be owed a
      whole worker, so a moved worker is never handed straight back).
    - ``weight_by_demand``: weigh each job's rollout share by the trajectories it
      reports left (the two knobs below refine that weight). Off (the default),
      every job has the same entitlement (times its priority and urgency
      factors) and its reported demand only caps its share: a job that reports
      more than it has then gains no weight, and its larger cap is bounded by
      its declared ``open_limit`` (see :class:`PipelineSpec`). On, a job that
      over-reports its queue gets a larger share (benchmarks/overreport.py).
    - ``backlog_weight`` (with ``weight_by_demand``): how much a pipeline's announced but not yet started
      trajectories count in its share weight. 0 (the default) splits by the
      current batches alone; larger values favour long jobs (longest work
      first): a shorter makespan on average, paid for by the short jobs'
      completion times. Alone (``small_first`` and ``path_halving_s`` off)
      it shortens the makespan trace after trace and delays short jobs
      markedly; with them on, they already weigh both sides, so the makespan
      gain varies from trace to trace (not in every one) and the short jobs
      pay less.
    - ``weight_by_duration`` (with ``weight_by_demand``): weigh a pipeline's trajectories by its reported
      mean trajectory seconds, so the split follows remaining rollout work
      rather than trajectory counts (agentic jobs with long trajectories get
      more workers than their counts alone would give them). Off by default:
      the split is then by trajectory counts.
    - ``home_floor``: a pipeline's share never drops below its home
      partition's rollout workers while it can use them.
    - ``home_guarantee``: sharing incentive. A job with rollout demand is
      guaranteed as many workers as the free bundles of its home partition
      it could use (those its own gang stages do not hold, at most its
      need): its share never drops below that, and workers of other jobs
      on those bundles (borrowers) are shrunk at once to give them back,
      whatever their residency or protection. Others borrow a home only
      while its owner does not want it, or for the turn of a job starving for
      a first worker (the guarantees are cut to make room for it, so any job
      with demand gets a worker in bounded time). Where homes overlap (jobs queued
      for one partition), the job admitted first owns the GPUs (the
      others' gang stages go after its own of the same job priority, with
      the guarantee or without). On by default: off, the split alone decides
      and nothing is promised per job (a shorter makespan on mixed_agentic,
      but jobs up to 6.5% later than under ``static``: see docs/scheduling-model.md).
    - ``lend_ahead_s`` (with ``home_guarantee``): the guarantee is what
      keeps a job no later than under ``static``; a job already ahead of
      its own ``static`` pace does not need it. Ahead is counted at the
      least (:meth:`rlix.core.state.PipelineEntry.lead_s`): ``static`` runs
      a job's model load, then its gang stages and its rollout by turns,
      the rollout on its home workers; so what the job has done (its
      finished trajectories at full slots on its home workers, the time it
      held gang stages) took ``static`` at least that long, and the lead is
      that less the time since the job registered. From a lead of
      ``2 x lend_ahead_s`` on, until it is back to ``lend_ahead_s``, the job
      lends its guarantee: it competes for its home by weight like any
      other job, and borrowers there are not shrunk for it. The lead shrinks
      by a second per second the job makes no progress, so the guarantee is
      back while ``lend_ahead_s`` is left, which has to pay for taking the
      home back (a borrower's offload, a wake and weight sync: seconds) and
      for what the measured times hold that ``static`` would not (waits for
      an offload). The GPUs a job ahead lends go to the jobs that set the
      makespan. 0: always guaranteed.
    - ``guest_stage_fit``: where homes overlap, a guest's gang stage (model
      load, training, log-probs) may start on GPUs another job owns only if,
      by what the scheduler has measured of both (each stage's last
      duration, each job's shortest rollout after its last stage), it holds
      that owner up in nothing: the owner asks for no gang stage, its rollout
      left fits on its home bundles that are free or its own and that the
      stage does not touch, and the stage ends within this fraction of the
      owner's shortest rollout, counted from the owner's last release.
      Otherwise it waits (unknown durations too). 0: a guest's gang stages
      wait for the owner to leave, as under ``static``; nearer 1, guests go
      sooner and an owner whose rollout ends early waits more often.
    - ``priority_weight``: a job's rollout share weight is multiplied by
      ``priority_weight ** priority`` (2: each priority level doubles it;
      1: priorities order gang stages only).
    - ``small_first``: favour jobs with little work left (shortest remaining
      work first, for mean completion time): a share weight is multiplied by
      ``(most work left / this job's work left) ** small_first``, work being
      the current batch and the backlog in GPU-seconds. 0 turns it off.
    - ``path_halving_s``: favour the job on the longest remaining chain of
      steps (reported ``path_s``, for the makespan): a share weight halves
      for every ``path_halving_s`` seconds its chain is shorter than the
      longest one. 0 turns it off.
    - ``slowdown_weight``: finish-time fairness among co-tenants (jobs with no home of
      their own: :func:`rlix.core.state.homeless`). A job's projected slowdown is the time
      since it registered plus its chain of steps still ahead, over its time alone at the
      least (:meth:`rlix.core.state.PipelineEntry.slowdown`); a co-tenant's share weight is
      multiplied by ``slowdown ** slowdown_weight``, and among co-tenants' gang stages of one
      stage priority that waited alike the most slowed job's goes first. Jobs with a home of
      their own have its guarantee instead. 0 turns it off.
    - ``urgency_cap``: with ``slowdown_weight``, the most that ``small_first`` and
      ``path_halving_s`` together may favour one co-tenant with demand over another (a ratio
      of weights), so that their factors, which grow without bound (a chain 10 halvings
      shorter weighs 1/1024), cannot outweigh finish-time fairness among co-tenants: past the
      cap, the most slowed co-tenant gains. The co-tenants it raises weigh more against jobs
      with homes too, above those jobs' guarantees. 0 turns the cap off.
    - ``floor_share``: a co-tenant (a job with no home of its own) that is not starving gets
      its one-worker floor, and any share, only where its share without floors would be at
      least this many workers. Below, it waits its turn (a starving job's floor comes first,
      ``min_residency_s`` and ``turn_limit_s``): where more co-tenants want rollout than there
      are workers' worth of GPUs between the gang stages, the capacity goes round by weight
      instead of one worker each at once. Jobs with homes keep their floors. 0: every job a
      floor while the capacity holds them.
    - ``stage_yield``: off (0) by default, as the seed's rules put every gang stage before
      rollout. At ``r`` (> 1), a co-tenant's gang stage (not its model load) that could start
      waits while it would preempt a busy rollout worker of another co-tenant of its job
      priority or above whose projected slowdown is at least ``r`` times its own (both
      measured): it starts once the ratio falls below ``r`` (its own slowdown grows as it
      waits), those workers go idle or leave, or ``turn_limit_s`` has passed since it was
      asked for (:func:`rlix.core.passes.yields_to_slowed`). Fairer shares among many
      co-tenants, at some makespan (``docs/scheduling-model.md``).
    - ``lost_cooldown_s``: a rollout worker reported lost (its process died,
      or it did not wake: a GPU short of memory, a failing device) is not
      placed again on that bundle for that job for this many seconds, so a
      failing wake is not retried in a loop; 0: at once.
    - ``turn_limit_s``: jobs starving for rollout workers take turns, longest
      waiting first; the worker a starving job got is kept from the others'
      rebalancing (while busy) until the job finishes a trajectory, or for this
      many seconds at most (> 0), so turns progress even where a preemption
      throws running work away, as long as trajectories are shorter than this.
      A job that never reports ``finished`` keeps its turns this long.
    - ``tenants``: tenants with shares (:class:`TenantSpec`). The GPUs are first
      split between tenants by weight, each within its guarantee and limit
      (gang stages count towards their tenant), then each tenant's rollout part
      between its jobs as above (home guarantees, if on, cut to fit the part:
      they never override the weights); a job whose tenant has a limit is admitted only
      when its model load fits under it. Jobs that name no tenant form one
      tenant of weight 1. None declared: no tenant split at all.
    - ``queues``: admission limits on sets of GPUs (:class:`QueueSpec`). Jobs whose
      mappings overlap are co-tenants and run at once; they queue only where a
      queue's limit says so.
    """

    report_ttl_s: float = 600.0
    protect_fraction: float = 0.1
    min_residency_s: float = 30.0
    rebalance_margin_workers: float = 0.5
    weight_by_demand: bool = False
    backlog_weight: float = 0.0
    weight_by_duration: bool = False
    home_floor: bool = False
    home_guarantee: bool = True
    lend_ahead_s: float = 60.0
    guest_stage_fit: float = 0.75
    priority_weight: float = 2.0
    small_first: float = 3.0
    path_halving_s: float = 350.0
    slowdown_weight: float = 5.0
    urgency_cap: float = 8.0
    floor_share: float = 0.5
    stage_yield: float = 0.0
    lost_cooldown_s: float = 30.0
    turn_limit_s: float = 900.0
    tenants: tuple[TenantSpec, ...] = ()
    queues: tuple[QueueSpec, ...] = ()

    def tenant(self, name: str) -> TenantSpec:
        """The declared tenant ``name`` (:data:`NO_TENANT` for "" or an undeclared name)."""
        return next((t for t in self.tenants if t.name == name), NO_TENANT)


DEFAULT_CONFIG = SchedulerConfig()
