"""Core layer: each pipeline's rollout demand and its share.

A share is weighted max-min fair: one water level for everybody, each
pipeline's weight (the same entitlement by default, see :func:`_share_weight`)
times the level, capped by its demand (the workers what it can be seen to have
left fills, :func:`checked_counts`). The share is the one set of weights every later pass follows (placement on
idle GPUs, rebalancing, work-conserving fill). It is computed without
looking at registration order: pipelines are ranked by :func:`rank_key`
(weight, then remaining-work fraction, then pipeline id), and sums run in
that order, so permuting registrations cannot change a float.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlix.core.state import PipelineEntry, View, homeless, worker_loads
from rlix.core.types import PipelineSpec, ReportDemand, SchedulerConfig


@dataclass(frozen=True, kw_only=True)
class RolloutNeed:
    """One pipeline's rollout demand as the planner sees it this round."""

    entry: PipelineEntry
    pipeline_id: str
    tp: int  # GPUs per rollout worker
    need: int  # workers it could keep busy (ceil(remaining / slots)), at most its bundles
    floor: int = 1  # workers its share never goes below while capacity allows (<= need)
    weight: float  # see _share_weight; 0 when it wants nothing
    protected: bool  # batch nearly done: its busy workers are not taken to rebalance
    loads: dict[int, int]  # first GPU -> running trajectories
    remaining_fraction: float = 0.0  # trajectories left / batch size (1.0 if the batch is unknown)
    work_s: float = 0.0  # worker-seconds of rollout left (remaining x mean s / slots); 0 if unknown
    switch_s: float = 0.0  # seconds to wake and sync one new worker; 0 if unknown
    work_trajectories: int = 0  # (remaining + backlog) x GPUs per worker: work left, in trajectories
    report: ReportDemand | None = None  # the report this need was computed from
    starving: bool = False  # it has waited min_residency_s or more with trajectories queued and no worker

    @property
    def resumable(self) -> bool:
        return self.entry.spec.resumable


def rank_key(n: RolloutNeed) -> tuple[float, float, str]:
    """Who comes first when pipelines compete: most weight, then most of its
    batch still to do, then pipeline id (unique). Never registration order."""
    return (-n.weight, -n.remaining_fraction, n.pipeline_id)


def rollout_needs(view: View, *, blocked: set[str]) -> list[RolloutNeed]:
    """Demand of every active pipeline, sorted by pipeline id.

    A pipeline with no report, a stale report, or in ``blocked`` needs no
    workers; whatever it holds is then lendable capacity.
    """
    needs = []
    ttl = view.config.report_ttl_s
    for entry in sorted(view.active(), key=lambda e: e.spec.pipeline_id):
        report = entry.demand
        if report is None or view.now - entry.reported_at > ttl or entry.spec.pipeline_id in blocked:
            needs.append(
                RolloutNeed(
                    entry=entry,
                    pipeline_id=entry.spec.pipeline_id,
                    tp=entry.spec.rollout_tp,
                    need=0,
                    weight=0.0,
                    protected=False,
                    loads={},
                )
            )
            continue
        need = _cached_need(view.config, entry, report)
        if need.need and view.now - entry.wanting_since >= view.config.min_residency_s:
            need = _with(need, "starving", True)  # its first worker before every floor but home guarantees (any width)
        needs.append(need)
    last = view.memo.get("urgency")
    cotenants = homeless(view) if view.config.slowdown_weight > 0 else frozenset()  # their slowdowns change with time
    if isinstance(last, tuple) and not cotenants and len(last[0]) == len(needs) and all(a is b for a, b in zip(last[0], needs)):
        return list(last[1])  # no report changed since the last plan
    urgent = with_urgency(view.config, needs, view.now, cotenants)
    view.memo["urgency"] = (needs, urgent)
    return list(urgent)


def _cached_need(config: SchedulerConfig, entry: PipelineEntry, report: ReportDemand) -> RolloutNeed:
    """The need of ``report``, computed once per report (a tick re-plans far more often than reports change)."""
    cached = entry.need_cache
    if isinstance(cached, RolloutNeed) and cached.report is report:
        return cached
    need = _need_of(config, entry, report)
    entry.need_cache = need
    return need


def _need_of(config: SchedulerConfig, entry: PipelineEntry, report: ReportDemand) -> RolloutNeed:
    loads = worker_loads(entry.spec, report)
    remaining, batch, backlog = checked_counts(entry.spec, report, sum(loads.values()), entry.credit_end)
    slots = entry.spec.slots_per_worker
    need = min(math.ceil(remaining / slots), len(entry.rollout_bundles))
    return RolloutNeed(
        entry=entry,
        pipeline_id=entry.spec.pipeline_id,
        tp=entry.spec.rollout_tp,
        need=need,
        floor=max(1, min(need, entry.home_workers)) if config.home_floor else 1,
        weight=_share_weight(config, remaining, backlog, report, entry.spec) if need else 0.0,
        protected=batch > 0 and remaining <= config.protect_fraction * batch,
        loads=loads,
        remaining_fraction=min(remaining / batch, 1.0) if batch > 0 else 1.0,
        work_s=remaining * report.trajectory_s / slots,
        switch_s=report.switch_s,
        work_trajectories=(remaining + backlog) * entry.spec.rollout_tp,
        report=report,
    )


def checked_counts(spec: PipelineSpec, report: ReportDemand, running: int, credit_end: int | None = None) -> tuple[int, int, int]:
    """(remaining, batch, backlog) trajectories of ``report``, bounded by what the scheduler can check.

    The ``running`` ones sit on the workers it gave the job; the queued ones belong to
    batches the job declared (``open_limit``) and the scheduler credited (they end when
    ``credit_end`` trajectories have finished, :meth:`PipelineEntry.credit_batches`), and
    the backlog to steps it declared (``total_trajectories``) and has neither finished nor
    open. Honest reports are never cut (``tests/test_sim_demand.py``); a report of more
    gains nothing.
    """
    remaining, batch, backlog = report.pending + running, report.batch_size, report.backlog
    if spec.open_limit:
        remaining, batch = min(remaining, max(spec.open_limit, running)), min(batch, spec.open_limit)
    if credit_end is not None:
        remaining = min(remaining, max(credit_end - report.finished, running))
    if spec.total_trajectories:
        backlog = min(backlog, max(spec.total_trajectories - report.finished - remaining, 0))
    return remaining, batch, backlog


# Urgency factors are scaled so the most urgent pipeline's is 1; the others
# stop shrinking here, so a weight stays a normal positive float.
_MIN_FACTOR = 1e-200


def with_urgency(
    config: SchedulerConfig, needs: list[RolloutNeed], now: float = 0.0, cotenants: frozenset[str] = frozenset()
) -> list[RolloutNeed]:
    """The needs with each weight scaled by how urgent its job is among these.

    Three factors, each off at 0: ``slowdown_weight`` favours, among ``cotenants`` (jobs with
    no home of their own), the one slowed most (its projected
    :meth:`~rlix.core.state.PipelineEntry.slowdown` at ``now``: finish-time fairness);
    ``small_first`` favours the job with the
    least work left (current batch and backlog, in GPU-seconds of rollout;
    a job that has not finished a trajectory yet is taken at the mean of
    those that have): shortest remaining work first lowers the mean
    completion time. ``path_halving_s`` favours the job with the longest
    chain of steps still ahead (its reported ``path_s``): the job that sets
    the makespan. Both depend on the whole set only through a mean and a
    maximum taken in pipeline-id order, so registration order cannot matter.
    Among co-tenants, ``urgency_cap`` bounds how far those two together favour
    one over another (:func:`_capped`), so that they cannot outweigh fairness.
    """
    wanting = [n for n in needs if n.weight > 0]
    alpha, halving = config.small_first, config.path_halving_s
    fair = config.slowdown_weight if cotenants else 0.0
    if len(wanting) < 2 or not (alpha or halving or fair):
        return needs
    per_s = math.log(2.0) / halving if halving else 0.0
    measured = [r.trajectory_s for r in (n.report for n in wanting) if r is not None and r.trajectory_s > 0]
    fallback = math.fsum(measured) / len(measured) if measured else 1.0
    factors, fairness = {}, {}
    for n in wanting:
        r = n.report
        assert r is not None  # only reported demand has weight
        small = alpha * math.log(max(n.work_trajectories * (r.trajectory_s or fallback), 1.0)) if alpha else 0.0
        factors[n.pipeline_id] = (per_s * r.path_s, small)
        if fair and n.pipeline_id in cotenants:
            fairness[n.pipeline_id] = fair * math.log(n.entry.slowdown(now))
    capped = _capped(factors, fairness, config.urgency_cap)
    logs = {
        pid: capped[pid] + fairness[pid] if pid in capped else path + fairness.get(pid, 0.0) - small
        for pid, (path, small) in factors.items()
    }
    top = max(logs.values())
    return [
        _reweighed(n, n.weight * max(math.exp(logs[n.pipeline_id] - top), _MIN_FACTOR)) if n.pipeline_id in logs else n
        for n in needs
    ]


def _capped(factors: dict[str, tuple[float, float]], fairness: dict[str, float], urgency_cap: float) -> dict[str, float]:
    """Each co-tenant's (the keys of ``fairness``) log makespan factor less its log mean-JCT factor,
    raised to within ``log(urgency_cap)`` of the highest co-tenant's; none where the cap is off."""
    if not (fairness and urgency_cap):
        return {}
    urgency = {pid: factors[pid][0] - factors[pid][1] for pid in fairness}
    floor = max(urgency.values()) - math.log(urgency_cap)
    return {pid: max(u, floor) for pid, u in urgency.items()}


def _reweighed(n: RolloutNeed, weight: float) -> RolloutNeed:
    return _with(n, "weight", weight)


def _with(n: RolloutNeed, name: str, value) -> RolloutNeed:
    """``n`` with one field changed (a plain field copy: dataclasses.replace costs 6x more, and a plan makes one per pipeline)."""
    m = object.__new__(RolloutNeed)
    m.__dict__.update(n.__dict__)
    m.__dict__[name] = value
    return m


def _share_weight(config: SchedulerConfig, remaining: int, backlog: int, report: ReportDemand, spec: PipelineSpec) -> float:
    """``priority_weight ** priority``: every job the same entitlement to GPUs
    (its demand caps its share; :func:`with_urgency` scales it).

    With ``weight_by_demand``, times (remaining + backlog_weight x backlog)
    trajectories x GPUs per worker, times the mean trajectory seconds when
    the split is by duration and the pipeline has measured one (GPU-seconds
    of rollout left): a split that follows what each job says it has left,
    and so one a job gains from by over-reporting.
    """
    if not config.weight_by_demand:
        return config.priority_weight**spec.priority
    weight = float((remaining + config.backlog_weight * backlog) * spec.rollout_tp)
    if config.weight_by_duration and report.trajectory_s > 0:
        weight *= report.trajectory_s
    return weight * config.priority_weight**spec.priority


def proportional_shares(
    needs: list[RolloutNeed],
    capacity_gpus: int,
    guaranteed: dict[str, int] | None = None,
    *,
    floor_share: float = 0.0,
    cotenants: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """Each pipeline's share of ``capacity_gpus``, in workers (fractional).

    The one-worker floor is inside the share, not on top of it: a share is
    ``clamp(level x weight, floor, need)`` in GPUs, with one water level
    for everybody, chosen so the shares add up to the capacity. A job's
    ``guaranteed`` workers (its free home bundles, see :mod:`rlix.core.homes`;
    they always fit: with tenants, :func:`rlix.core.tenants.fit_guarantees` cuts
    them to each tenant's part) are its floor first; then, while the capacity holds
    them, one worker each for the others: first those starving (waiting
    ``min_residency_s`` or more for a first worker, so a wide bundle that
    never fits the leftover capacity still gets its turn), longest waiting
    first, then by :func:`rank_key` (most weight first); the others get
    nothing this round. With ``floor_share``, one of ``cotenants`` (jobs with no home of
    their own) that is not starving and whose share without floors would be under that many
    workers gets no share this round either (:func:`_taking_part`): its turn comes once it
    starves, so co-tenants whose weights are small among many take turns at the capacity
    instead of each holding one worker at once.
    """
    guaranteed = guaranteed or {}
    shares = {n.pipeline_id: 0.0 for n in needs}
    left = capacity_gpus - sum(guaranteed[n.pipeline_id] * n.tp for n in needs if n.pipeline_id in guaranteed)
    floored = []
    first = sorted(
        (n for n in needs if n.need > 0), key=lambda n: (n.pipeline_id not in guaranteed, starving_key(n), rank_key(n))
    )
    for n in first:
        if n.pipeline_id in guaranteed:
            floored.append(n)
        elif n.tp <= left:
            floored.append(n)
            left -= n.tp
    owed = {n.pipeline_id: float(guaranteed.get(n.pipeline_id, 0) * n.tp) for n in floored}
    if floor_share and cotenants and len(floored) > 1:
        floored = _taking_part(floored, owed, capacity_gpus, floor_share, cotenants)
    lows = {n.pipeline_id: max(owed[n.pipeline_id], float(n.floor * n.tp)) for n in floored}
    if sum(lows.values()) > capacity_gpus:  # home floors do not all fit: guarantees, else one worker each
        lows = {n.pipeline_id: max(owed[n.pipeline_id], float(n.tp)) for n in floored}
    level = water_level([(n.weight, lows[n.pipeline_id], float(n.need * n.tp)) for n in floored], float(capacity_gpus))
    for n in floored:
        shares[n.pipeline_id] = min(float(n.need * n.tp), max(lows[n.pipeline_id], level * n.weight)) / n.tp
    return shares


def _taking_part(
    floored: list[RolloutNeed], owed: dict[str, float], capacity_gpus: int, floor_share: float, cotenants: frozenset[str]
) -> list[RolloutNeed]:
    """Those of ``floored`` that take part in this round's split: all but the co-tenants neither
    starving nor owed ``floor_share`` workers by weight (the water level with only the
    guarantees, ``owed``, as floors). The others get no share this round: they take turns."""
    level = water_level([(n.weight, owed[n.pipeline_id], float(n.need * n.tp)) for n in floored], float(capacity_gpus))
    return [
        n
        for n in floored
        if n.pipeline_id not in cotenants or n.starving or min(float(n.need), level * n.weight / n.tp) >= floor_share
    ]


def starving_key(n: RolloutNeed) -> tuple[bool, float]:
    """Starving jobs first, the one waiting longest first (so each gets its turn), then the others."""
    return (not n.starving, n.entry.wanting_since if n.starving else 0.0)


def water_level(items: list[tuple[float, float, float]], capacity: float) -> float:
    """The level L with sum(clamp(L x w, lo, hi)) == capacity (inf if all fit at hi).

    ``items`` are (weight > 0, lo, hi) in a fixed order. The sum is piecewise
    linear and non-decreasing in L: sweep its breakpoints in order, keeping
    the sum as ``fixed + slope x L``, and solve inside the segment where it
    reaches the capacity (O(n log n)).
    """
    if sum(hi for _, _, hi in items) <= capacity:
        return math.inf
    # (level, kind, i): kind 0 = item i leaves its floor, 1 = item i reaches its cap
    points = sorted(
        [(lo / w, 0, i) for i, (w, lo, _) in enumerate(items)] + [(hi / w, 1, i) for i, (w, _, hi) in enumerate(items)]
    )
    fixed = sum(lo for _, lo, _ in items)
    slope = 0.0
    for level, kind, i in points:
        if slope > 0 and fixed + slope * level >= capacity:
            break
        w, lo, hi = items[i]
        if kind == 0:
            fixed -= lo
            slope += w
        else:
            fixed += hi
            slope -= w
    return (capacity - fixed) / slope if slope > 0 else 0.0
