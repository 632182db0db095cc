"""Core layer: tenants with shares, the level above the jobs' rollout split.

With tenants declared (:attr:`SchedulerConfig.tenants`), the cluster's GPUs
are split between tenants first, the Kueue way: each tenant's total (the
GPUs its jobs hold for gang stages, plus its rollout share) is
``clamp(level x weight, floor, cap)`` with one water level for all, where
the floor is its guarantee and the cap its guarantee plus borrowing limit,
both cut to what its jobs can use. Gang stages are not preemptable, so they
count towards their tenant as they are; what is left of a tenant's total is
its rollout capacity, split between its own jobs by
:func:`rlix.core.shares.proportional_shares`, with their home guarantees
(``home_guarantee``) cut to fit it (:func:`fit_guarantees`). A tenant with a
limit admits a new job only while its model load fits under that limit.

Tenants are visited in name order and sums run in that order, so
registration order cannot change a float. No tenant declared: the jobs'
split alone, exactly as without this module.
"""

from __future__ import annotations

from rlix.core.ledger import Draft
from rlix.core.placement import whole
from rlix.core.shares import RolloutNeed, proportional_shares, starving_key, water_level
from rlix.core.state import GangRequest, View
from rlix.core.types import Role, ShrinkReason


def tenant_gang_gpus(view: View, draft: Draft) -> dict[str, int]:
    """GPUs each tenant's jobs hold for gang stages, or are granted in this plan."""
    out: dict[str, int] = {}
    held = [(pid, len(gpus)) for (pid, _), gpus in view.ledger.gangs.items()]
    held += [(g.pipeline_id, len(g.gpus)) for g in draft.grants]
    for pid, n in sorted(held):
        tenant = view.pipelines[pid].spec.tenant
        out[tenant] = out.get(tenant, 0) + n
    return out


def tenant_parts(view: View, draft: Draft, needs: list[RolloutNeed], capacity_gpus: int) -> dict[str, float] | None:
    """The rollout GPUs of each tenant's part, by name: its total (``clamp(level x weight, floor, cap)``,
    see the module docstring) less the GPUs its gang stages hold. None: no tenants declared."""
    config = view.config
    if not config.tenants:
        return None
    gangs = tenant_gang_gpus(view, draft)
    groups = _by_tenant(needs)
    names = sorted(set(groups) | set(gangs))
    bounds = []
    for name in names:
        t, held = config.tenant(name), gangs.get(name, 0)
        usable = float(sum(n.need * n.tp for n in groups.get(name, ())))
        floor = held + min(usable, max(0.0, t.guarantee_gpus - held))
        cap = held + min(usable, max(0.0, t.limit_gpus - held))
        bounds.append((t.weight, floor, cap))
    total = float(capacity_gpus + sum(gangs.values()))
    bounds = _fit_floors(bounds, total, [gangs.get(n, 0) for n in names])
    level = water_level(bounds, total)
    return {
        name: max(min(cap, max(floor, level * weight)) - gangs.get(name, 0), 0.0)
        for name, (weight, floor, cap) in zip(names, bounds)
    }


def fit_guarantees(
    needs: list[RolloutNeed], parts: dict[str, float] | None, guaranteed: dict[str, int], capacity_gpus: int
) -> dict[str, int]:
    """Home guarantees (``home_guarantee``) cut to what there is room for.

    The room is each tenant's part (the whole rollout capacity with no tenants declared), less
    a first worker for each of its jobs that starves (waited ``min_residency_s`` or more with
    trajectories queued and no worker, longest waiting first, while the room holds it): homes
    never override the tenants' weights, and a job whose bundles lie on other jobs' homes still
    gets its turn (see :mod:`rlix.core.rebalance`). Guarantees beyond the room are cut one worker
    at a time to each job in turn (pipeline-id order); turns are by worker, not GPU.
    """
    if not guaranteed:
        return guaranteed
    groups = {"": needs} if parts is None else _by_tenant(needs)
    out: dict[str, int] = {}
    for name, group in sorted(groups.items()):
        room = float(capacity_gpus) if parts is None else parts.get(name, 0.0)
        for n in sorted(
            (n for n in group if n.starving and n.pipeline_id not in guaranteed), key=lambda n: (starving_key(n), n.pipeline_id)
        ):
            if n.tp <= room:
                room -= n.tp
        out.update(_cut([n for n in group if guaranteed.get(n.pipeline_id, 0) > 0], guaranteed, room))
    return out


def _cut(owed: list[RolloutNeed], guaranteed: dict[str, int], room: float) -> dict[str, int]:
    """The guarantees of ``owed`` (in pipeline-id order) within ``room`` GPUs, one worker each in turn."""
    if sum(guaranteed[n.pipeline_id] * n.tp for n in owed) <= room:
        return {n.pipeline_id: guaranteed[n.pipeline_id] for n in owed}
    given = dict.fromkeys((n.pipeline_id for n in owed), 0)
    while owed:
        owed = [n for n in owed if given[n.pipeline_id] < guaranteed[n.pipeline_id] and n.tp <= room]
        for n in owed:
            if n.tp <= room:
                given[n.pipeline_id] += 1
                room -= n.tp
    return {pid: k for pid, k in given.items() if k > 0}


def tenant_shares(
    needs: list[RolloutNeed],
    capacity_gpus: int,
    parts: dict[str, float] | None,
    guaranteed: dict[str, int],
    *,
    floor_share: float = 0.0,
    cotenants: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """Each pipeline's rollout share, in workers: tenants first (``parts``, see :func:`tenant_parts`),
    then the jobs of each tenant. ``guaranteed``: home workers owed to jobs, already within each
    tenant's part (:func:`fit_guarantees`); ``floor_share`` and ``cotenants``: see :func:`proportional_shares`."""
    if parts is None:
        return proportional_shares(needs, capacity_gpus, guaranteed, floor_share=floor_share, cotenants=cotenants)
    shares: dict[str, float] = {}
    for name, group in sorted(_by_tenant(needs).items()):
        shares.update(proportional_shares(group, parts.get(name, 0.0), guaranteed, floor_share=floor_share, cotenants=cotenants))
    return shares


def _by_tenant(needs: list[RolloutNeed]) -> dict[str, list[RolloutNeed]]:
    groups: dict[str, list[RolloutNeed]] = {}
    for n in needs:
        groups.setdefault(n.entry.spec.tenant, []).append(n)
    return groups


def worker_caps(view: View, needs: list[RolloutNeed], shares: dict[str, float]) -> dict[str, int]:
    """The most rollout workers each job of a tenant with a borrowing limit may hold: its share, whole
    (idle GPUs beyond it stay idle: the tenant's limit holds even on an idle cluster)."""
    limited = {t.name for t in view.config.tenants if t.borrow_limit_gpus is not None}
    return {n.pipeline_id: whole(shares.get(n.pipeline_id, 0.0)) for n in needs if n.entry.spec.tenant in limited}


def trim_to_limits(view: View, draft: Draft, needs: list[RolloutNeed], shares: dict[str, float]) -> None:
    """A tenant that would hold more GPUs than its limit once its jobs below their shares get them (its
    gang stages grew beside rollout workers it already held) gives rollout workers back until it fits:
    from its job furthest above its share (whole workers, as :func:`worker_caps`), least busy worker
    first. A job is never cut below its share, so no later pass of the plan places the worker back.

    Where the tenant is within its limit now and the room is only for a job below its share, a worker
    moves as it would between jobs (:mod:`rlix.core.rebalance`): only once it has held its GPUs
    ``min_residency_s``; until then the jobs below their shares keep what they hold (their shares are
    cut to it), so a worker the split hands back and forth does not move at every plan."""
    gangs = tenant_gang_gpus(view, draft)
    loads = {n.pipeline_id: n.loads for n in needs}
    for tenant in sorted(view.config.tenants, key=lambda t: t.name):
        if tenant.borrow_limit_gpus is None:
            continue
        jobs = sorted(pid for pid, entry in view.pipelines.items() if entry.spec.tenant == tenant.name)
        workers = [w for pid in jobs for w in draft.live_workers(pid)]
        # what its jobs will hold once each is given its share (jobs below it are, later in the plan)
        tp = {pid: view.pipelines[pid].spec.role(Role.ACTOR_INFER).gpus_per_worker for pid in jobs}
        ahead = sum(max(draft.worker_count(pid), whole(shares.get(pid, 0.0))) * tp[pid] for pid in jobs)
        excess = gangs.get(tenant.name, 0) + ahead - tenant.limit_gpus
        held = gangs.get(tenant.name, 0) + sum(len(w.gpus) for w in workers)
        if excess > 0 and held <= tenant.limit_gpus and not _all_resident(view, draft, workers, shares):
            for pid in jobs:  # within its limit now: no room is made before its workers have resided
                shares[pid] = min(shares.get(pid, 0.0), float(draft.worker_count(pid)))
            continue
        while excess > 0:
            above = [w for w in workers if draft.worker_count(w.pipeline_id) > whole(shares.get(w.pipeline_id, 0.0))]
            if not above:
                break
            victim = min(
                above,
                key=lambda w: (
                    whole(shares.get(w.pipeline_id, 0.0)) - draft.worker_count(w.pipeline_id),
                    loads.get(w.pipeline_id, {}).get(w.gpus[0], 0),
                    w.sort_key,
                ),
            )
            draft.shrink(victim, ShrinkReason.REBALANCE)
            workers.remove(victim)
            excess -= len(victim.gpus)


def _all_resident(view: View, draft: Draft, workers: list, shares: dict[str, float]) -> bool:
    """Have the workers of jobs above their shares (those room would be made from) held their GPUs
    ``min_residency_s``?"""
    since = view.now - view.config.min_residency_s
    placed = draft.ledger.placed_at
    above = [w for w in workers if draft.worker_count(w.pipeline_id) > whole(shares.get(w.pipeline_id, 0.0))]
    return all(placed.get(w.gpus[0], since) <= since for w in above)


def _fit_floors(bounds: list[tuple[float, float, float]], total: float, held: list[int]) -> list[tuple[float, float, float]]:
    """Guarantees that together exceed the GPUs there are (gang stages beyond a guarantee) are cut
    in proportion, above what each tenant's gang stages hold."""
    wanted = sum(floor - h for (_, floor, _), h in zip(bounds, held))
    room = total - sum(held)
    if wanted <= room or wanted <= 0:
        return bounds
    scale = max(room, 0.0) / wanted
    return [(w, h + (floor - h) * scale, cap) for (w, floor, cap), h in zip(bounds, held)]


def admits_under_limit(view: View, draft: Draft, req: GangRequest) -> bool:
    """A job's model load starts only while its tenant's gang stages, with it, fit under the tenant's limit."""
    tenant = view.config.tenant(view.pipelines[req.pipeline_id].spec.tenant)
    if tenant.borrow_limit_gpus is None:
        return True
    held = tenant_gang_gpus(view, draft).get(tenant.name, 0)
    return held + len(req.gpus) <= tenant.limit_gpus
