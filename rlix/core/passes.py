"""Core layer: the named passes a policy is built from.

Each pass reads the :class:`View`, edits the :class:`Draft`, and touches
nothing else. Every ordering is an explicit tuple ending in a unique
tie-breaker (pipeline id, request sequence, or first GPU id), never
registration order. The rollout passes live beside this module:
:mod:`rlix.core.shares` (demand and shares), :mod:`rlix.core.placement`
(free GPUs) and :mod:`rlix.core.rebalance` (moving workers).
"""

from __future__ import annotations

from rlix.core.ledger import Draft
from rlix.core.placement import fill_idle, place_on_idle
from rlix.core.rebalance import rebalance
from rlix.core.shares import RolloutNeed, proportional_shares, rollout_needs
from rlix.core.state import View
from rlix.core.types import GangHolder, RolloutWorker, ShrinkReason

__all__ = [
    "RolloutNeed",
    "fill_idle",
    "gang_pass",
    "place_on_idle",
    "proportional_shares",
    "rebalance",
    "rollout_needs",
    "rollout_capacity",
    "shrink_departed",
]

# ------------------------------------------------------------- gang stages


def gang_pass(view: View, draft: Draft, *, stop_own_rollout: bool) -> None:
    """Grant pending gang stages in priority order, preempting rollout only.

    A request starts only if none of its GPUs is held by another gang stage
    or reserved by a higher-priority request that could not start (so big
    gangs are not starved by a stream of small ones). Its rollout victims are
    exactly the workers overlapping its GPUs, plus, when
    ``stop_own_rollout``, every rollout worker of its own pipeline (stages
    taking turns on a dedicated partition).
    """
    reserved: set[int] = set()
    owner = draft.owner
    for req in view.pending:
        gpus = req.gpus
        if any(g in reserved or isinstance(owner[g], GangHolder) for g in gpus):
            reserved.update(gpus)
            continue
        victims = {owner[g] for g in gpus if owner[g] is not None}
        if stop_own_rollout:
            victims.update(draft.live_workers(req.pipeline_id))
        for worker in sorted(victims, key=_worker_key):
            draft.shrink(worker, ShrinkReason.GANG)
        draft.grant(req.pipeline_id, req.stage, gpus)


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
