"""Core layer: the named passes a policy is built from.

Each pass reads the :class:`View`, edits the :class:`Draft`, and touches
nothing else. Every ordering is an explicit tuple ending in a unique
tie-breaker (registration order, request sequence, or first GPU id).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from rlix.core.ledger import Draft
from rlix.core.state import PipelineEntry, View
from rlix.core.types import GangHolder, Gpus, ReportDemand, RolloutWorker, SchedulerConfig, ShrinkReason

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


# ------------------------------------------------------------- rollout demand


@dataclass(frozen=True, kw_only=True)
class RolloutNeed:
    """One pipeline's rollout demand as the planner sees it this round."""

    entry: PipelineEntry
    need: int  # workers it could keep busy (ceil(remaining / slots))
    weight: float  # see _share_weight
    protected: bool  # batch nearly done: don't take busy workers away
    loads: dict[int, int]  # first GPU -> running trajectories

    @property
    def pipeline_id(self) -> str:
        return self.entry.spec.pipeline_id

    @property
    def tp(self) -> int:
        return self.entry.spec.rollout_tp

    @property
    def order(self) -> int:
        return self.entry.order


def rollout_needs(view: View, *, blocked: set[str]) -> list[RolloutNeed]:
    """Demand of every active pipeline, in registration order.

    A pipeline with no report, a stale report, or in ``blocked`` needs no
    workers; whatever it holds is then lendable capacity.
    """
    needs = []
    ttl = view.config.report_ttl_s
    for entry in view.active():
        report = entry.demand
        pid = entry.spec.pipeline_id
        if report is None or view.now - entry.reported_at > ttl or pid in blocked:
            needs.append(RolloutNeed(entry=entry, need=0, weight=0.0, protected=False, loads={}))
            continue
        loads = {load.first_gpu: load.active for load in report.loads}
        remaining = report.pending + sum(loads.values())
        need = min(math.ceil(remaining / entry.spec.slots_per_worker), len(entry.rollout_bundles))
        protected = report.batch_size > 0 and remaining <= view.config.protect_fraction * report.batch_size
        needs.append(
            RolloutNeed(
                entry=entry,
                need=need,
                weight=_share_weight(view.config, remaining, report, entry.spec.rollout_tp),
                protected=protected,
                loads=loads,
            )
        )
    return needs


def _share_weight(config: SchedulerConfig, remaining: int, report: ReportDemand, tp: int) -> float:
    """(remaining + backlog_weight x backlog) trajectories x GPUs per worker,
    times the mean trajectory seconds when the split is by duration and the
    pipeline has measured one."""
    weight = float((remaining + config.backlog_weight * report.backlog) * tp)
    if config.weight_by_duration and report.trajectory_s > 0:
        weight *= report.trajectory_s
    return weight


def proportional_shares(needs: list[RolloutNeed], capacity_gpus: int) -> dict[str, float]:
    """Water-fill ``capacity_gpus`` by weight, capped at each need; in workers.

    Every pipeline with demand first gets one worker (the floor) while
    capacity lasts, in registration order; the rest is split in proportion
    to weight, no pipeline above the workers it can use.
    """
    shares: dict[str, float] = {n.pipeline_id: 0.0 for n in needs}
    left = float(capacity_gpus)
    active = [n for n in needs if n.need > 0]
    for n in active:  # the one-worker floor
        if left >= n.tp:
            shares[n.pipeline_id] = 1.0
            left -= n.tp
    open_ = [n for n in active if shares[n.pipeline_id] < n.need]
    while open_ and left > 1e-9:
        total_w = sum(n.weight for n in open_)
        if total_w <= 0:
            break
        capped = []
        for n in open_:
            room = (n.need - shares[n.pipeline_id]) * n.tp  # GPUs until capped
            if left * n.weight / total_w >= room:
                capped.append(n)
        if not capped:
            for n in open_:
                shares[n.pipeline_id] += left * n.weight / total_w / n.tp
            break
        for n in capped:
            left -= (n.need - shares[n.pipeline_id]) * n.tp
            shares[n.pipeline_id] = float(n.need)
        open_ = [n for n in open_ if n not in capped]
    return shares


# ------------------------------------------------------------- placement


def place_on_idle(view: View, draft: Draft, needs: list[RolloutNeed], targets: dict[str, float]) -> None:
    """Give free bundles to pipelines below ``targets`` (idle before shrinking).

    One worker per turn to the most-owed pipeline (largest shortfall relative
    to its target, then registration order), so equally owed pipelines
    interleave.
    """
    wanting = [n for n in needs if draft.worker_count(n.pipeline_id) < _whole(targets[n.pipeline_id])]
    while wanting and draft.free_count > 0:
        wanting.sort(key=lambda n: (_owed(draft, n, targets), n.order))
        for i, n in enumerate(wanting):
            bundle = _first_free_bundle(draft, n.entry)
            if bundle is not None:
                draft.expand(n.pipeline_id, bundle)
                if draft.worker_count(n.pipeline_id) >= _whole(targets[n.pipeline_id]):
                    wanting.pop(i)
                break
            # no free bundle fits this pipeline now; later expansions only use more
        else:
            return


def _whole(share: float) -> int:
    return math.floor(share + 1e-9)


def _owed(draft: Draft, n: RolloutNeed, targets: dict[str, float]) -> float:
    """Sort key part: more negative = more owed (fraction of target still missing)."""
    target = targets[n.pipeline_id]
    return -(target - draft.worker_count(n.pipeline_id)) / max(target, 1.0)


def _first_free_bundle(draft: Draft, entry: PipelineEntry) -> Gpus | None:
    """The most preferred candidate bundle of ``entry`` that is wholly free."""
    owner = draft.owner
    bundle_of = entry.bundle_of
    rank = entry.bundle_rank
    best = None
    for g in draft.free_gpus():
        bundle = bundle_of.get(g)
        if bundle is None or (best is not None and rank[bundle] >= rank[best]):
            continue
        if all(owner[x] is None for x in bundle):
            best = bundle
    return best


def rebalance(view: View, draft: Draft, needs: list[RolloutNeed], shares: dict[str, float]) -> None:
    """Move workers from pipelines above their share to those below it.

    Hysteresis: a receiver must be owed a whole worker; a donor may end at
    most ``rebalance_margin_workers`` below its share after giving one; a donor
    worker must have held its GPUs ``min_residency_s``; busy workers of a
    nearly finished batch are never taken. Idle workers (no running
    trajectory) of a pipeline holding more than it needs are always lendable.
    """
    cfg = view.config
    by_pid = {n.pipeline_id: n for n in needs}
    placed_at = draft.ledger.placed_at

    def idle_surplus(worker: RolloutWorker, d: RolloutNeed | None) -> bool:
        if d is None:
            return True  # its pipeline is gone or silent: lendable
        return d.loads.get(worker.gpus[0], 0) == 0 and draft.worker_count(d.pipeline_id) > d.need

    def share_donor(worker: RolloutWorker, receiver: str) -> bool:
        if worker.pipeline_id == receiver or worker in draft.shrunk:
            return False
        d = by_pid.get(worker.pipeline_id)
        if idle_surplus(worker, d):
            return True
        if d.protected and d.loads.get(worker.gpus[0], 0) > 0:
            return False
        if view.now - placed_at.get(worker, view.now) < cfg.min_residency_s:
            return False
        # The receiver must be owed a whole worker, so it can never turn donor
        # and hand the worker back: the margin only bounds how far below its
        # share a donor may go.
        return draft.worker_count(d.pipeline_id) - 1 >= shares[d.pipeline_id] - cfg.rebalance_margin_workers

    def idle_donor(worker: RolloutWorker, receiver: str) -> bool:
        if worker.pipeline_id == receiver or worker in draft.shrunk:
            return False
        d = by_pid.get(worker.pipeline_id)
        if idle_surplus(worker, d):
            return True
        # Packing: a pipeline whose trajectories resume elsewhere keeps only the
        # workers it can fill; its stragglers move onto them.
        return (
            d.entry.spec.resumable
            and draft.worker_count(d.pipeline_id) > d.need
            and view.now - placed_at.get(worker, view.now) >= cfg.min_residency_s
        )

    def can_give(pid: str, phase_two: bool) -> bool:
        d = by_pid.get(pid)
        if d is None:
            return True
        count = draft.worker_count(pid)
        if count > d.need:
            return True  # holds idle or packable workers
        return not phase_two and count - 1 >= shares[pid] - cfg.rebalance_margin_workers

    # Phase 1: shares. Phase 2: work conservation, idle (or packable) workers
    # to anyone still short. Within a phase donors only lose eligibility, so
    # the donor pool is built once and a receiver that finds nothing is done.
    for phase_two, owed, donor_ok in (
        (False, lambda n: draft.worker_count(n.pipeline_id) + 1 <= shares[n.pipeline_id] + 1e-9, share_donor),
        (True, lambda n: draft.worker_count(n.pipeline_id) < n.need, idle_donor),
    ):
        # A transfer changes only its receiver's and donors' counts, and donors are
        # never receivers, so a heap keyed on how owed each receiver is stays valid.
        receivers = [((_owed(draft, n, shares), n.order), n) for n in needs if n.need > 0 and owed(n)]
        if not receivers:
            continue
        heapq.heapify(receivers)
        givers = sorted(pid for pid, ws in draft.ledger.workers.items() if ws and can_give(pid, phase_two))
        pool = [w for pid in givers for w in draft.live_workers(pid) if w not in draft.expanded]
        while receivers:
            _, n = heapq.heappop(receivers)
            choice = _cheapest_takeover(draft, n, pool, by_pid, donor_ok)
            if choice is None:
                continue  # nothing it could take now will appear later in this phase
            bundle, victims = choice
            for worker in victims:
                draft.shrink(worker, ShrinkReason.REBALANCE)
            draft.expand(n.pipeline_id, bundle)
            if owed(n):
                heapq.heappush(receivers, ((_owed(draft, n, shares), n.order), n))


def _cheapest_takeover(
    draft: Draft, n: RolloutNeed, pool: list[RolloutWorker], by_pid: dict[str, RolloutNeed], donor_ok
) -> tuple[Gpus, list[RolloutWorker]] | None:
    """The receiver bundle whose takeover aborts the fewest trajectories."""
    owner = draft.owner
    bundle_of = n.entry.bundle_of
    best = None
    seen: set[Gpus] = set()
    for holder in pool:
        gpus = holder.gpus
        inside = gpus[0] in bundle_of if len(gpus) == 1 else any(g in bundle_of for g in gpus)
        if not inside or not donor_ok(holder, n.pipeline_id):
            continue
        for hg in holder.gpus:
            bundle = bundle_of.get(hg)
            if bundle is None or bundle in seen:
                continue
            seen.add(bundle)
            victims: list[RolloutWorker] = []
            for bg in bundle:
                other = owner[bg]
                if other is None or other in victims:
                    continue
                if not isinstance(other, RolloutWorker) or not donor_ok(other, n.pipeline_id):
                    break
                victims.append(other)
            else:
                aborted = sum(by_pid[v.pipeline_id].loads.get(v.gpus[0], 0) for v in victims if v.pipeline_id in by_pid)
                key = (aborted, len(victims), bundle[0])
                if best is None or key < best[0]:
                    best = (key, bundle, victims)
    return None if best is None else (best[1], best[2])


def fill_idle(view: View, draft: Draft, needs: list[RolloutNeed]) -> None:
    """Work conservation: no free bundle stays idle while someone could use it."""
    hungry = [n for n in needs if draft.worker_count(n.pipeline_id) < n.need]
    while hungry and draft.free_count > 0:
        hungry.sort(key=lambda n: (draft.worker_count(n.pipeline_id) / n.need, n.order))
        n = hungry[0]
        bundle = _first_free_bundle(draft, n.entry)
        if bundle is None:
            hungry.pop(0)
            continue
        draft.expand(n.pipeline_id, bundle)
        if draft.worker_count(n.pipeline_id) >= n.need:
            hungry.pop(0)


def shrink_departed(view: View, draft: Draft) -> None:
    """Every rollout worker of an unregistered pipeline goes."""
    for pid in view.departed:
        for worker in draft.live_workers(pid):
            draft.shrink(worker, ShrinkReason.UNREGISTER)
