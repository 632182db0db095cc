"""Core layer: the scheduling policies, one interface, chosen by name.

A policy says where a pipeline's rollout workers may go and composes the
passes of :mod:`rlix.core.passes` into a plan. Baselines sit beside ``rlix``
so a single replay compares them all.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from rlix.core import passes, tenants
from rlix.core.errors import SchedulingError
from rlix.core.ledger import Draft
from rlix.core.state import GangRequest, View, homeless
from rlix.core.types import Gpus, PipelineSpec, Role


class Policy(abc.ABC):
    """Decides one plan from a view of the scheduler."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Its gang pass puts guests' stages after the owners' and only where they hold no owner up
    # (rlix.core.homes.gang_order, guest_stage_fits); the scheduler's safe plan orders them alike.
    owners_first: ClassVar[bool] = False
    # A job refused admission keeps its home only from later jobs of its own tenant (not the cluster's).
    queue_within_tenant: ClassVar[bool] = False

    @abc.abstractmethod
    def rollout_bundles(self, spec: PipelineSpec) -> tuple[Gpus, ...]:
        """Bundles the pipeline's rollout workers may occupy, in preference order."""

    @abc.abstractmethod
    def plan(self, view: View, draft: Draft) -> None:
        """Fill ``draft`` with this round's shrinks, grants and expands."""

    def admits(self, view: View, draft: Draft, req: GangRequest) -> bool:
        """May this job start (its INIT stage) once its GPUs are free? By default, yes: it is
        admitted as soon as its model-load gang fits."""
        return True

    def admission(self, view: View) -> passes.Admission:
        """What the gang pass asks before a job's model load (None: nothing, once its GPUs are free)."""
        return self.admits

    def gang_stages(self, view: View, draft: Draft, *, stop_own_rollout: bool = False) -> None:
        """The gang pass as this policy orders and admits stages (its plan's, and the scheduler's safe plan's)."""
        passes.gang_pass(
            view,
            draft,
            stop_own_rollout=stop_own_rollout,
            admits=self.admission(view),
            owners_first=self.owners_first,
            queue_within_tenant=self.queue_within_tenant,
        )


class StaticPolicy(Policy):
    """Dedicated partitions: a job's stages take turns on its own GPUs."""

    name = "static"
    summary = "each job alone on its own GPUs; its stages take turns"

    def rollout_bundles(self, spec: PipelineSpec) -> tuple[Gpus, ...]:
        return _inside_home(spec)

    def admits(self, view: View, draft: Draft, req: GangRequest) -> bool:
        """A job starts only when its home partition is free: no other admitted job's home overlaps it."""
        return passes.home_is_free(view, draft, req.pipeline_id)

    def plan(self, view: View, draft: Draft) -> None:
        passes.shrink_departed(view, draft)
        passes.gang_pass(view, draft, stop_own_rollout=True, admits=self.admits)
        busy = (
            {pid for pid, _ in view.ledger.gangs} | {g.pipeline_id for g in draft.grants} | passes.awaiting_admission(view, draft)
        )
        needs = passes.rollout_needs(view, blocked=busy)
        passes.fill_idle(draft, needs)


class PartialOverlapPolicy(Policy):
    """ROLL-style: inside one job, rollout keeps the GPUs training does not use."""

    name = "partial_overlap"
    summary = "each job on its own GPUs; rollout shrinks onto the non-training ones"

    def rollout_bundles(self, spec: PipelineSpec) -> tuple[Gpus, ...]:
        return _inside_home(spec)

    admits = StaticPolicy.admits  # as static: a job starts only when its home partition is free

    def plan(self, view: View, draft: Draft) -> None:
        passes.shrink_departed(view, draft)
        passes.gang_pass(view, draft, stop_own_rollout=False, admits=self.admits)
        needs = passes.rollout_needs(view, blocked=passes.awaiting_admission(view, draft))
        passes.fill_idle(draft, needs)


class RlixPolicy(Policy):
    """Shared cluster: rollout split across jobs (equal entitlement, capped by demand), preempted by stages."""

    name = "rlix"
    summary = "rollout workers of all jobs share idle GPUs, each job's share capped by its demand"
    owners_first = True
    queue_within_tenant = True  # a tenant's limit holds back its own later jobs, never another tenant's

    def rollout_bundles(self, spec: PipelineSpec) -> tuple[Gpus, ...]:
        # Home bundles first: a worker there is rarely in another job's way.
        home = set(spec.home_gpus)
        bundles = spec.role(Role.ACTOR_INFER).bundles
        return tuple(sorted(bundles, key=lambda b: (not home.issuperset(b), b[0])))

    def admits(self, view: View, draft: Draft, req: GangRequest) -> bool:
        """A job starts once its model-load gang fits, and, if its tenant has a borrowing limit, fits under it."""
        return tenants.admits_under_limit(view, draft, req)

    def admission(self, view: View) -> passes.Admission:
        # Asked only where tenants can refuse it: otherwise every job is admitted once its GPUs are free.
        return self.admits if view.config.tenants else None

    def plan(self, view: View, draft: Draft) -> None:
        passes.shrink_departed(view, draft)
        self.gang_stages(view, draft)
        draft.held_back = passes.held_for_owners(view)
        # A job whose model load waits (for its GPUs, a queue or its tenant's limit) rolls nothing out yet.
        needs = passes.rollout_needs(view, blocked=passes.awaiting_admission(view, draft))
        capacity = passes.rollout_capacity(view, draft)
        parts = tenants.tenant_parts(view, draft, needs, capacity)
        guaranteed = tenants.fit_guarantees(needs, parts, passes.guarantees(view, draft, needs), capacity)
        floor_share = view.config.floor_share
        cotenants = homeless(view) if floor_share else frozenset()
        shares = tenants.tenant_shares(needs, capacity, parts, guaranteed, floor_share=floor_share, cotenants=cotenants)
        tenants.trim_to_limits(view, draft, needs, shares)
        caps = tenants.worker_caps(view, needs, shares)
        passes.muster(view, draft, needs, caps)
        passes.place_on_idle(draft, needs, shares)
        passes.reclaim_homes(view, draft, needs, guaranteed)
        passes.rebalance(view, draft, needs, shares, caps)
        passes.fill_idle(draft, needs, shares, caps=caps)


def _inside_home(spec: PipelineSpec) -> tuple[Gpus, ...]:
    home = set(spec.home_gpus)
    return tuple(b for b in spec.role(Role.ACTOR_INFER).bundles if home.issuperset(b))


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (StaticPolicy, PartialOverlapPolicy, RlixPolicy)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise SchedulingError(f"policy '{name}' is unknown; choose one of: {', '.join(POLICIES)}") from None
