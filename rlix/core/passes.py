"""Core layer: the named passes a policy is built from.

Each pass reads the :class:`View`, edits the :class:`Draft`, and touches
nothing else. Every ordering is an explicit tuple ending in a unique
tie-breaker (pipeline id, request sequence, or first GPU id), never
registration order. The rollout passes live beside this module:
:mod:`rlix.core.shares` (demand and shares), :mod:`rlix.core.placement`
(free GPUs) and :mod:`rlix.core.rebalance` (moving workers).
"""

from __future__ import annotations

from collections.abc import Callable

from rlix.core.homes import gang_order, guarantees, guest_stage_fits, held_for_owners
from rlix.core.ledger import Draft
from rlix.core.placement import fill_idle, place_on_idle
from rlix.core.queues import admitted_in, first_come, queues_of, refusal
from rlix.core.rebalance import muster, rebalance, reclaim_homes
from rlix.core.shares import RolloutNeed, proportional_shares, rollout_needs
from rlix.core.state import GangRequest, View, homeless, worker_loads
from rlix.core.types import GangHolder, RolloutWorker, ShrinkReason, Stage

# May this job start now (its INIT request, its GPUs free)? None: admitted as soon as the gang fits.
Admission = Callable[[View, Draft, GangRequest], bool] | None

__all__ = [
    "RolloutNeed",
    "awaiting_admission",
    "fill_idle",
    "gang_pass",
    "guarantees",
    "held_for_owners",
    "home_is_free",
    "muster",
    "place_on_idle",
    "proportional_shares",
    "rebalance",
    "reclaim_homes",
    "rollout_capacity",
    "rollout_needs",
    "shrink_departed",
]

# ------------------------------------------------------------- gang stages


def gang_pass(
    view: View,
    draft: Draft,
    *,
    stop_own_rollout: bool,
    admits: Admission = None,
    owners_first: bool = False,
    queue_within_tenant: bool = False,
) -> None:
    """Grant pending gang stages in priority order, preempting rollout only.

    A request starts only if none of its GPUs is held by another gang stage
    or reserved by a higher-priority request that could not start (so big
    gangs are not starved by a stream of small ones). Its rollout victims are
    exactly the workers overlapping its GPUs, plus, when
    ``stop_own_rollout``, every rollout worker of its own pipeline (stages
    taking turns on a dedicated partition). A job's INIT (its admission)
    also needs its queues (:mod:`rlix.core.queues`) and ``admits``; a job they refuse keeps its home from later jobs in
    the queue (admission stays first come, first served; with ``queue_within_tenant``, later jobs of
    its own tenant only) but not from the stages of jobs already running. With ``owners_first`` a guest's requests
    go after the owners' of the same job priority (:func:`rlix.core.homes.gang_order`).
    """
    reserved: set[int] = set()
    queued: dict[str, set[int]] = {}  # homes of jobs refused admission this round, by the tenant they hold them from
    closed: set[str] = set()  # queues a job of which was not admitted this round: later jobs wait behind it
    owner = draft.owner
    for req in first_come(view, gang_order(view)) if owners_first else view.pending:
        gpus, init, entry = req.gpus, req.stage is Stage.INIT, view.pipelines[req.pipeline_id]
        spec, admission = entry.spec, not entry.admitted and req.pipeline_id not in admitted_in(draft)
        queue_home = spec.home_gpus if init and admits is not None else ()
        line = queued.setdefault(spec.tenant if queue_within_tenant else "", set())
        lines = {q.name for q in queues_of(view, spec)} if admission and view.config.queues else set()
        waits = bool(
            (lines and (not lines.isdisjoint(closed) or refusal(view, draft, spec) is not None))
            # a guest's stage that would cost the owner of its GPUs waits (no reservation: it asks again)
            or (owners_first and not guest_stage_fits(view, draft, req))
            or (queue_home and (line.intersection(queue_home) or not admits(view, draft, req)))
        )
        if not waits and any(g in reserved or isinstance(owner[g], GangHolder) for g in gpus):
            reserved.update(gpus)
            waits = True
        # a stage that could start now but would stop a far more slowed co-tenant's rollout waits (no reservation)
        if not waits and not init and view.config.stage_yield and yields_to_slowed(view, owner, req):
            waits = True
        if waits:  # not admitted yet: its home stays free of later jobs (not of running ones), its queues closed
            line.update(queue_home)
            closed.update(lines)
            continue
        victims = {owner[g] for g in gpus if owner[g] is not None}
        if stop_own_rollout:
            victims.update(draft.live_workers(req.pipeline_id))
        for worker in sorted(victims, key=_worker_key):
            draft.shrink(worker, ShrinkReason.GANG)
        draft.grant(req.pipeline_id, req.stage, gpus)


def yields_to_slowed(view: View, owner: list, req: GangRequest) -> bool:
    """Does ``req``, a co-tenant's gang stage, yield (``stage_yield``)? It does while it would preempt a busy
    rollout worker of a co-tenant of its job priority or above whose projected slowdown
    (:meth:`~rlix.core.state.PipelineEntry.slowdown`) is at least ``stage_yield`` times its own, both
    measured, and for ``turn_limit_s`` at most from its request."""
    config, now, fair = view.config, view.now, homeless(view)
    me = view.pipelines[req.pipeline_id]
    if req.pipeline_id not in fair or not me.slowdown_measured or now - req.asked_at >= config.turn_limit_s:
        return False
    bar = config.stage_yield * me.slowdown(now)
    for first in sorted({h.gpus[0] for g in req.gpus if isinstance(h := owner[g], RolloutWorker)}):
        pid = owner[first].pipeline_id
        other = view.pipelines[pid]
        if pid == req.pipeline_id or pid not in fair or other.spec.priority < req.job_priority:
            continue
        if other.slowdown_measured and worker_loads(other.spec, other.demand).get(first) and other.slowdown(now) >= bar:
            return True  # a busy worker (its job's last report) of a co-tenant that much more slowed
    return False


def home_is_free(view: View, draft: Draft, pipeline_id: str) -> bool:
    """No other admitted job (or one admitted in this draft) has a home overlapping this job's."""
    home = set(view.pipelines[pipeline_id].spec.home_gpus)
    admitted = {e.spec.pipeline_id for e in view.active() if e.admitted} | _admitted_now(draft)
    admitted.discard(pipeline_id)
    return not any(home.intersection(view.pipelines[pid].spec.home_gpus) for pid in sorted(admitted))


def awaiting_admission(view: View, draft: Draft) -> set[str]:
    """Jobs whose INIT is still pending after this draft's grants (their model is not loaded), and jobs not
    admitted yet that a full queue refuses: they roll nothing out yet (a first worker admits a job too)."""
    granted = _admitted_now(draft)
    waiting = {r.pipeline_id for r in view.pending if r.stage is Stage.INIT and r.pipeline_id not in granted}
    if view.config.queues:
        admitted = admitted_in(draft)
        for e in view.active():
            pid = e.spec.pipeline_id
            if not e.admitted and pid not in admitted and refusal(view, draft, e.spec) is not None:
                waiting.add(pid)
    return waiting


def _admitted_now(draft: Draft) -> set[str]:
    """Jobs whose INIT this draft grants."""
    return {g.pipeline_id for g in draft.grants if g.stage is Stage.INIT}


def _worker_key(worker: RolloutWorker) -> tuple[str, int]:
    return worker.sort_key


def shrink_departed(view: View, draft: Draft) -> None:
    """Every rollout worker of an unregistered pipeline goes."""
    for pid in view.departed:
        for worker in draft.live_workers(pid):
            draft.shrink(worker, ShrinkReason.UNREGISTER)


def rollout_capacity(view: View, draft: Draft) -> int:
    """GPUs not held or just granted to a gang stage: what rollout may share."""
    gang = sum(len(g) for g in view.ledger.gangs.values()) + sum(len(g.gpus) for g in draft.grants)
    return draft.ledger.num_gpus - gang
