"""Core layer: the scheduler, state + events -> validated plan.

Both shells drive exactly this object: they :meth:`Scheduler.submit` events
as they happen and call :meth:`Scheduler.plan` with the current time; the
returned :class:`Plan` has already been checked against the invariants and
recorded in the ledger, so the shell's only job is to carry it out.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable

from rlix.core import passes
from rlix.core.errors import InvariantViolation, SchedulingError
from rlix.core.ledger import Draft, Ledger
from rlix.core.lifecycle import (
    PIPELINE_TRANSITIONS,
    REQUEST_TRANSITIONS,
    PipelineState,
    RequestState,
    check_transition,
)
from rlix.core.policies import Policy, make_policy
from rlix.core.queues import check_fits, check_queues, refusal
from rlix.core.rejoin import check_demand, check_holdings
from rlix.core.state import GangRequest, PipelineEntry, View
from rlix.core.topology import requested_gpus, validate_pipeline
from rlix.core.types import (
    DEFAULT_CONFIG,
    ClusterSpec,
    Event,
    Gpus,
    PipelineSpec,
    Plan,
    Register,
    Rejoin,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    RolloutWorker,
    SchedulerConfig,
    Stage,
    Unregister,
    WorkerLost,
)
from rlix.core.validate import validate_plan


def check_settings(cluster: ClusterSpec, config: SchedulerConfig) -> None:
    """Refuse a cluster or knob values no plan can be made with (raises :class:`SchedulingError`).

    Checked once, when a scheduler is built: both shells build theirs from user input
    (a trace's ``scheduler`` block and ``--set``, a run config).
    """
    if cluster.nodes < 1 or cluster.gpus_per_node < 1:
        raise SchedulingError("cluster: nodes and gpus_per_node must both be >= 1")
    if not (math.isfinite(config.priority_weight) and 1.0 <= config.priority_weight <= 100.0):
        raise SchedulingError(f"priority_weight={config.priority_weight}: must lie in 1..100")
    if not (math.isfinite(config.guest_stage_fit) and 0.0 <= config.guest_stage_fit <= 1.0):
        raise SchedulingError(f"guest_stage_fit={config.guest_stage_fit}: must lie in 0..1 (0: a guest waits for the owner)")
    if not (math.isfinite(config.turn_limit_s) and config.turn_limit_s > 0):
        raise SchedulingError(f"turn_limit_s={config.turn_limit_s}: must be a finite number > 0 (longer than a trajectory)")
    if not (math.isfinite(config.urgency_cap) and (config.urgency_cap == 0 or config.urgency_cap >= 1)):
        raise SchedulingError(f"urgency_cap={config.urgency_cap}: must be 0 (off) or a finite ratio >= 1")
    if not (math.isfinite(config.floor_share) and 0.0 <= config.floor_share <= 1.0):
        raise SchedulingError(f"floor_share={config.floor_share}: must lie in 0..1 (0: every job a floor)")
    if not (math.isfinite(config.stage_yield) and (config.stage_yield == 0 or config.stage_yield > 1)):
        raise SchedulingError(f"stage_yield={config.stage_yield}: must be 0 (off) or a finite number above 1")
    for name in ("small_first", "path_halving_s", "slowdown_weight", "lost_cooldown_s", "lend_ahead_s"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0):
            raise SchedulingError(f"{name}={value}: must be a finite number >= 0 (0 turns it off)")
    check_tenants(cluster, config)
    check_queues(cluster, config)


def check_tenants(cluster: ClusterSpec, config: SchedulerConfig) -> None:
    """Tenants with unique non-empty names, positive finite weights, and guarantees the cluster can hold."""
    names = [t.name for t in config.tenants]
    if "" in names or len(set(names)) != len(names):
        raise SchedulingError("tenants: every tenant needs a name of its own")
    for t in config.tenants:
        if not (math.isfinite(t.weight) and t.weight > 0):
            raise SchedulingError(f"tenants: '{t.name}' has weight {t.weight}; use a positive number")
        if t.guarantee_gpus < 0 or (t.borrow_limit_gpus is not None and t.borrow_limit_gpus < 0):
            raise SchedulingError(f"tenants: '{t.name}' has a negative guarantee or borrowing limit")
    promised = sum(t.guarantee_gpus for t in config.tenants)
    if promised > cluster.num_gpus:
        raise SchedulingError(
            f"tenants: their guarantees add up to {promised} GPUs but the cluster has {cluster.num_gpus}; lower them"
        )


def check_tenant(config: SchedulerConfig, spec: PipelineSpec) -> None:
    """A job names a declared tenant, and its model load fits under that tenant's limit."""
    if not spec.tenant:
        return
    if all(t.name != spec.tenant for t in config.tenants):
        declared = ", ".join(t.name for t in config.tenants) or "none"
        raise SchedulingError(
            f"pipeline '{spec.pipeline_id}': tenant '{spec.tenant}' is not declared (declared: {declared}); "
            "declare it in the scheduler's tenants or remove the job's tenant"
        )
    limit = config.tenant(spec.tenant).limit_gpus
    if len(spec.init_gpus) > limit:
        raise SchedulingError(
            f"pipeline '{spec.pipeline_id}': its model load needs {len(spec.init_gpus)} GPUs, more than tenant "
            f"'{spec.tenant}' may hold ({limit:g}); raise the tenant's guarantee or borrowing limit"
        )


def check_job(config: SchedulerConfig, spec: PipelineSpec) -> None:
    """A job the scheduler's tenants and queues could ever admit (:func:`check_tenant`,
    :func:`rlix.core.queues.check_fits`): asked at registration, and of traces and configs before any work."""
    check_tenant(config, spec)
    check_fits(config, spec)


class Scheduler:
    """The policy core. Pure: no clock, no I/O; ``now`` is always passed in."""

    def __init__(self, cluster: ClusterSpec, policy: str | Policy = "rlix", config: SchedulerConfig = DEFAULT_CONFIG) -> None:
        check_settings(cluster, config)
        self.cluster = cluster
        self.config = config
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.ledger = Ledger(cluster.num_gpus)
        self._view = View(cluster=cluster, config=config, ledger=self.ledger, now=0.0)
        self._requests: dict[tuple[str, Stage], GangRequest] = {}
        self._seq = 0
        self._cooling: dict[str, PipelineEntry] = {}  # pipelines with a bundle cooling down after a lost worker
        self.plans_made = 0
        # Plans the policy got wrong and the core replaced by a safe plan (a policy bug:
        # each one is also warned about, once per invariant).
        self.violations: list[InvariantViolation] = []

    # ------------------------------------------------------------ events

    def submit(self, event: Event, now: float) -> None:
        """Record one event. Raises :class:`SchedulingError` and changes nothing if it is invalid."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise SchedulingError(f"event {type(event).__name__} is not a scheduler event")
        handler(self, event, now)

    def step(self, now: float, events: Iterable[Event] = ()) -> Plan:
        """Submit ``events`` in order, then plan."""
        for event in events:
            self.submit(event, now)
        return self.plan(now)

    def _register(self, event: Register, now: float) -> None:
        self._add(self._checked_entry(event.spec, registered_at=now))

    def _rejoin(self, event: Rejoin, now: float) -> None:
        """Rebuild a pipeline's state from what it holds after this scheduler restarted (see :class:`Rejoin`)."""
        entry = self._checked_entry(event.spec)
        held = check_holdings(event, entry.rollout_bundles, self.ledger, seq=entry.order)
        self._add(entry)
        for req in held.requests:
            self.ledger.restore_gang(req.pipeline_id, req.stage, req.gpus)
            self._requests[(req.pipeline_id, req.stage)] = req
            self._seq = req.seq
        for worker in held.workers:
            self.ledger.restore_worker(worker, now)
        if event.admitted or held.requests or held.workers:
            entry.admit(now if event.admitted_at is None else min(event.admitted_at, now))
        if event.demand is not None:
            entry.record_demand(event.demand, now, placed=self._on_own_workers(event.demand))
            if event.demand.pending and not held.workers:  # it may have waited long before the restart
                entry.wanting_since = -math.inf

    def _checked_entry(self, spec: PipelineSpec, registered_at: float = -math.inf) -> PipelineEntry:
        """The entry of a pipeline joining with ``spec``, once checked; not recorded yet."""
        pid = spec.pipeline_id
        validate_pipeline(self.cluster, spec)
        check_job(self._view.config, spec)
        old = self._view.pipelines.get(pid)  # an id may run again once a plan freed what its pipeline held
        if old is not None and (old.state is PipelineState.ACTIVE or pid in self._view.departed):
            raise SchedulingError(f"pipeline '{pid}' is already registered; pipeline ids must be unique")
        check_transition(PIPELINE_TRANSITIONS, None, PipelineState.ACTIVE, f"pipeline '{pid}'")
        bundles = self.policy.rollout_bundles(spec)
        if not bundles:
            raise SchedulingError(
                f"pipeline '{pid}': no actor_infer bundle lies inside its home GPUs under policy "
                f"'{self.policy.name}'; map actor_infer onto at least one home bundle"
            )
        return PipelineEntry.joining(spec, order=self._seq + 1, rollout_bundles=bundles, registered_at=registered_at)

    def _add(self, entry: PipelineEntry) -> None:
        self._seq = entry.order
        self._view.pipelines[entry.spec.pipeline_id] = entry

    def _unregister(self, event: Unregister, now: float) -> None:
        entry = self._active(event.pipeline_id)
        check_transition(PIPELINE_TRANSITIONS, entry.state, PipelineState.GONE, f"pipeline '{event.pipeline_id}'")
        entry.state = PipelineState.GONE
        for key in [k for k in self._requests if k[0] == event.pipeline_id]:
            if self._requests.pop(key).state is RequestState.GRANTED:
                self.ledger.release_gang(*key)
        self._view.departed.append(event.pipeline_id)

    def _request(self, event: RequestStage, now: float) -> None:
        entry = self._active(event.pipeline_id)
        if event.stage is Stage.ROLLOUT:
            raise SchedulingError("stage rollout is not requested; report rollout demand with ReportDemand instead")
        key = (event.pipeline_id, event.stage)
        where = f"pipeline '{event.pipeline_id}' stage {event.stage.value}"
        prior = self._requests.get(key)
        if prior is not None:
            raise SchedulingError(f"{where}: duplicate request (already {prior.state.value}); release it before asking again")
        check_transition(REQUEST_TRANSITIONS, None, RequestState.PENDING, where)
        gpus = requested_gpus(entry.spec, event)
        entry.gang_times.requested(now)
        self._seq += 1
        self._requests[key] = GangRequest(
            pipeline_id=event.pipeline_id,
            stage=event.stage,
            gpus=gpus,
            seq=self._seq,
            job_priority=entry.spec.priority,
            asked_at=now,
        )

    def _release(self, event: ReleaseStage, now: float) -> None:
        entry = self._active(event.pipeline_id)
        key = (event.pipeline_id, event.stage)
        req = self._requests.get(key)
        where = f"pipeline '{event.pipeline_id}' stage {event.stage.value}"
        if req is None:
            raise SchedulingError(f"{where}: released without a request; request the stage first")
        check_transition(REQUEST_TRANSITIONS, req.state, RequestState.RELEASED, where)
        if req.state is RequestState.GRANTED:
            self.ledger.release_gang(*key)
            entry.note_release()  # a batch may open now
            holds_another = any(pid == event.pipeline_id for pid, _ in self.ledger.gangs)
            entry.gang_times.released(event.stage, now, holds_another=holds_another)
        del self._requests[key]

    def _report(self, event: ReportDemand, now: float) -> None:
        entry = self._active(event.pipeline_id)
        check_demand(event, entry.spec)
        entry.record_demand(event, now, placed=self._on_own_workers(event))

    def _on_own_workers(self, report: ReportDemand) -> ReportDemand:
        """``report`` with only the running trajectories on workers the plans gave the job: those it lists
        elsewhere (a worker shrunk as it reported, a GPU it never had) gain it nothing."""
        held = self.ledger.workers_of(report.pipeline_id)
        if all(load.first_gpu in held for load in report.loads):
            return report
        return dataclasses.replace(report, loads=tuple(load for load in report.loads if load.first_gpu in held))

    def _worker_lost(self, event: WorkerLost, now: float) -> None:
        entry = self._active(event.pipeline_id)
        bundle = next((b for b in entry.rollout_bundles if b[0] == event.first_gpu), None)  # a candidate or not
        if not self.ledger.drop_worker(event.pipeline_id, event.first_gpu):
            raise SchedulingError(
                f"pipeline '{event.pipeline_id}' has no rollout worker at GPU {event.first_gpu}; report only workers the plan "
                "gave it"
            )
        cooldown = self._view.config.lost_cooldown_s
        if cooldown > 0 and bundle is not None and event.failed:  # not placed there again for a while (a failing wake is no loop)
            entry.cool(bundle, now + cooldown)
            self._cooling[event.pipeline_id] = entry

    def _active(self, pipeline_id: str) -> PipelineEntry:
        entry = self._view.pipelines.get(pipeline_id)
        if entry is None:
            raise SchedulingError(f"pipeline '{pipeline_id}' is not registered; register it first")
        if entry.state is not PipelineState.ACTIVE:
            raise SchedulingError(f"pipeline '{pipeline_id}' is {entry.state.value}; register a new pipeline id")
        return entry

    # ------------------------------------------------------------ planning

    def plan(self, now: float) -> Plan:
        """Decide, validate and record the plan for time ``now`` (seconds)."""
        view = self._view
        view.now = now
        for pid in [p for p, e in self._cooling.items() if not e.warm_up(now)]:
            del self._cooling[pid]
        view.pending = sorted((r for r in self._requests.values() if r.state is RequestState.PENDING), key=lambda r: r.sort_key)
        for entry in view.pipelines.values():  # who lends its home guarantee this round (ahead of its static pace)
            entry.lending = entry.state is PipelineState.ACTIVE and entry.lends(now, view.config)
        draft = Draft(self.ledger, now)
        self.policy.plan(view, draft)
        plan = draft.to_plan()
        try:
            validate_plan(plan, self.ledger, view)
        except InvariantViolation as violation:
            plan = safe_plan(self._view, self.policy, now, violation, self.violations)
        granted = [self._requests[(grant.pipeline_id, grant.stage)] for grant in plan.grants]
        for req, grant in zip(granted, plan.grants):  # checked before the ledger changes
            check_transition(
                REQUEST_TRANSITIONS, req.state, RequestState.GRANTED, f"{grant.stage.value} of '{grant.pipeline_id}'"
            )
        self.ledger.apply(plan)
        for req in granted:
            req.state = RequestState.GRANTED
        if plan.grants:  # stages age where other jobs' stages overlap them (a home guarantees rollout, not turns)
            for req in view.pending:
                if req.state is RequestState.PENDING:
                    req.note_passed(plan.grants)
        note_plan(view, self.ledger, plan, now)
        view.departed.clear()
        self.plans_made += 1
        return plan

    # ------------------------------------------------------------ queries

    def workers(self, pipeline_id: str) -> list[RolloutWorker]:
        return sorted(self.ledger.workers_of(pipeline_id).values(), key=lambda w: w.gpus[0])

    def rollout_bundles(self, pipeline_id: str) -> tuple[Gpus, ...]:
        """Bundles the policy lets this pipeline's rollout workers use, most preferred first."""
        entry = self._view.pipelines.get(pipeline_id)
        if entry is None:
            raise SchedulingError(f"pipeline '{pipeline_id}' is not registered; register it first")
        return entry.rollout_bundles

    def granted(self, pipeline_id: str, stage: Stage) -> bool:
        req = self._requests.get((pipeline_id, stage))
        return req is not None and req.state is RequestState.GRANTED

    def pending_requests(self) -> list[tuple[str, Stage]]:
        return [
            (r.pipeline_id, r.stage)
            for r in sorted(self._requests.values(), key=lambda r: r.sort_key)
            if r.state is RequestState.PENDING
        ]

    def pipelines(self) -> list[str]:
        return [e.spec.pipeline_id for e in self._view.active()]

    def admission_refusal(self, pipeline_id: str) -> str | None:
        """Why the pipeline's admission (its model load, or whichever stage or worker it is given first) waits
        for its queues now (one line), or None: no queue holds it back (it may still wait for GPUs)."""
        entry = self._view.pipelines.get(pipeline_id)
        if entry is None or entry.admitted:
            return None
        return refusal(self._view, Draft(self.ledger, self._view.now), entry.spec)

    def admitted_at(self, pipeline_id: str) -> float | None:
        """When a plan first gave the pipeline GPUs (None: not yet, or not registered)."""
        entry = self._view.pipelines.get(pipeline_id)
        return entry.admitted_at if entry is not None and entry.admitted else None


def note_plan(view: View, ledger: Ledger, plan: Plan, now: float) -> None:
    """What the pipelines remember of a plan carried out at ``now``: who was admitted (holds GPUs:
    its home is taken), when its gang stages began, who waits for a first rollout worker since when."""
    for grant in plan.grants:
        view.pipelines[grant.pipeline_id].admit(now)
        view.pipelines[grant.pipeline_id].gang_times.granted(grant.stage, now)
    for expand in plan.expands:
        view.pipelines[expand.worker.pipeline_id].admit(now)
    for entry in view.pipelines.values():
        if entry.state is PipelineState.ACTIVE:
            entry.note_wanting(now, ledger.workers_of(entry.spec.pipeline_id).keys(), view.config)


def safe_plan(view: View, policy: Policy, now: float, violation: InvariantViolation, seen: list[InvariantViolation]) -> Plan:
    """Report a policy bug (``violation``, added to ``seen``) and fall back to a plan that moves no rollout worker.

    The fallback frees departed pipelines' workers and grants the gang
    stages that can start (their overlapping rollout workers shrunk), so
    every job keeps going; if even that fails validation, nothing changes.
    """
    if all(v.invariant != violation.invariant for v in seen):
        warnings.warn(f"rlix core: {violation}; plan replaced by a safe plan (no rollout moves)", RuntimeWarning, stacklevel=3)
    seen.append(violation)
    draft = Draft(view.ledger, now)
    passes.shrink_departed(view, draft)
    policy.gang_stages(view, draft)  # guests' stages ordered, and jobs admitted, as the policy does
    plan = draft.to_plan()
    try:
        validate_plan(plan, view.ledger, view)
    except InvariantViolation as second:
        seen.append(second)
        return Plan(now=now)
    return plan


_HANDLERS = {
    Register: Scheduler._register,
    Unregister: Scheduler._unregister,
    RequestStage: Scheduler._request,
    ReleaseStage: Scheduler._release,
    ReportDemand: Scheduler._report,
    WorkerLost: Scheduler._worker_lost,
    Rejoin: Scheduler._rejoin,
}
