"""Core layer: postconditions every plan must meet before it leaves the core.

Each check is named; a failure raises :class:`InvariantViolation` with that
name. The checks look only at the GPUs a plan touches, so they cost little
more than the plan itself.
"""

from __future__ import annotations

from collections.abc import Callable

from rlix.core.errors import InvariantViolation
from rlix.core.ledger import Ledger
from rlix.core.lifecycle import RequestState
from rlix.core.state import View
from rlix.core.types import GangHolder, Plan, RolloutWorker


def validate_plan(plan: Plan, ledger: Ledger, view: View) -> None:
    """Raise if ``plan``, applied to ``ledger``, would break an invariant."""
    owner: dict[int, object] = {}  # GPU -> owner after the plan, for touched GPUs
    # Messages are lambdas (loop variables bound as defaults) where a plan checks many workers:
    # a worker's text is made only on failure.

    def current(g: int):
        return owner[g] if g in owner else ledger.owner[g]

    shrunk = set()
    for s in plan.shrinks:
        w = s.worker
        _require(ledger.workers_of(w.pipeline_id).get(w.gpus[0]) == w, "shrink_existing_worker", lambda w=w: f"{w} is not placed")
        _require(w not in shrunk, "single_shrink", lambda w=w: f"{w} shrunk twice")
        shrunk.add(w)
        for g in w.gpus:
            owner[g] = None
    for grant in plan.grants:
        req = next((r for r in view.pending if r.pipeline_id == grant.pipeline_id and r.stage is grant.stage), None)
        _require(
            req is not None and req.state is RequestState.PENDING, "grant_pending_request", f"{grant} has no pending request"
        )
        _require(grant.gpus == req.gpus, "gang_whole_mapping", f"{grant} does not cover {req.gpus}")
        for g in grant.gpus:
            prior = current(g)
            _require(not isinstance(prior, GangHolder), "non_preemptable_never_preempted", f"GPU {g} held by {prior}")
            _require(prior is None, "no_gpu_owned_twice", f"GPU {g} granted while {prior} holds it")
            owner[g] = GangHolder(pipeline_id=grant.pipeline_id, stage=grant.stage)
    for e in plan.expands:
        w = e.worker
        _require(w not in shrunk, "no_shrink_and_expand", lambda w=w: f"{w} both shrunk and expanded")
        entry = view.pipelines.get(w.pipeline_id)
        _require(
            entry is not None and entry.bundle_of.get(w.gpus[0]) == w.gpus,
            "bundle_inside_mapping",
            lambda w=w: f"{w} is not a bundle the policy allows",
        )
        for g in w.gpus:
            _require(current(g) is None, "no_gpu_owned_twice", lambda g=g: f"GPU {g} expanded while {current(g)} holds it")
            owner[g] = w
    held = sum(len(s.worker.gpus) for s in plan.shrinks)
    taken = sum(len(g.gpus) for g in plan.grants) + sum(len(e.worker.gpus) for e in plan.expands)
    _require(0 <= ledger.free_count + held - taken <= ledger.num_gpus, "gpu_conservation", "free GPU count out of range")


def check_ledger(ledger: Ledger) -> None:
    """Full consistency check of the ledger (tests and end-of-run audits)."""
    free = sum(1 for o in ledger.owner if o is None)
    _require(free == ledger.free_count, "gpu_conservation", f"{free} free GPUs but ledger counts {ledger.free_count}")
    indexed = 0
    for (pid, stage), gpus in ledger.gangs.items():
        for g in gpus:
            _require(
                ledger.owner[g] == GangHolder(pipeline_id=pid, stage=stage), "no_gpu_owned_twice", f"GPU {g} gang index mismatch"
            )
        indexed += len(gpus)
    for pid, workers in ledger.workers.items():
        for first, w in workers.items():
            _require(w.gpus[0] == first and w.pipeline_id == pid, "worker_index", f"{w} misfiled")
            for g in w.gpus:
                _require(ledger.owner[g] == w, "no_gpu_owned_twice", f"GPU {g} worker index mismatch")
            indexed += len(w.gpus)
    _require(indexed + free == ledger.num_gpus, "gpu_conservation", f"{indexed} held + {free} free != {ledger.num_gpus}")
    for holder in ledger.owner:
        _require(holder is None or isinstance(holder, (GangHolder, RolloutWorker)), "holder_type", repr(holder))


def _require(ok: bool, name: str, detail: str | Callable[[], str]) -> None:
    if not ok:
        raise InvariantViolation(name, detail() if callable(detail) else detail)
