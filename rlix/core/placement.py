"""Core layer: handing free GPUs to rollout workers, placement-aware.

Two named passes share one loop: :func:`place_on_idle` gives free bundles to
pipelines owed a whole worker of their share (before anyone is shrunk), and
:func:`fill_idle` keeps no bundle idle while a pipeline could use it (work
conservation). Who is served next follows the shares: floors first (widest
tensor-parallel size first, as it is the hardest to place), then the largest
shortfall against the share. Where a worker goes: the free bundle that the
fewest other pipelines still wanting workers could use, so nothing placed
now stands in the way of someone else's floor or has to be moved again at
the next residency; then the pipeline's own preference (home first); then
the lowest GPU id.
"""

from __future__ import annotations

import heapq
import math

from rlix.core.ledger import Draft
from rlix.core.shares import RolloutNeed
from rlix.core.types import Gpus

_EPS = 1e-9


def place_on_idle(draft: Draft, needs: list[RolloutNeed], shares: dict[str, float]) -> None:
    """Free bundles to pipelines below the whole part of their share."""
    _hand_out(draft, needs, shares, {n.pipeline_id: whole(shares[n.pipeline_id]) for n in needs})


def fill_idle(
    draft: Draft, needs: list[RolloutNeed], shares: dict[str, float] | None = None, caps: dict[str, int] | None = None
) -> None:
    """Work conservation: free bundles to every pipeline below its need.

    Without ``shares`` (the baselines), the shortfall is measured against the need.
    ``caps``: pipelines that may hold no more workers than this (a tenant's borrowing limit).
    """
    shares = shares if shares is not None else {n.pipeline_id: float(n.need) for n in needs}
    caps = caps or {}
    _hand_out(draft, needs, shares, {n.pipeline_id: min(n.need, caps.get(n.pipeline_id, n.need)) for n in needs})


def whole(share: float) -> int:
    return math.floor(share + _EPS)


def _serve_key(draft: Draft, n: RolloutNeed, shares: dict[str, float]) -> tuple:
    count = draft.worker_count(n.pipeline_id)
    if count == 0:
        return (0, -n.tp, -n.weight, -n.remaining_fraction, n.pipeline_id)
    return (1, count - shares[n.pipeline_id], -n.remaining_fraction, n.pipeline_id)


def _hand_out(draft: Draft, needs: list[RolloutNeed], shares: dict[str, float], limit: dict[str, int]) -> None:
    wanting = [n for n in needs if draft.worker_count(n.pipeline_id) < limit[n.pipeline_id]]
    if not wanting or draft.free_count == 0:
        return
    crowd = _crowd(draft, wanting)
    heap = [(_serve_key(draft, n, shares), n) for n in wanting]
    heapq.heapify(heap)
    while heap and draft.free_count > 0:
        _, n = heapq.heappop(heap)
        bundle = _best_free_bundle(draft, n, crowd)
        if bundle is not None:
            draft.expand(n.pipeline_id, bundle)
            for g in bundle:
                crowd.pop(g, None)
            if draft.worker_count(n.pipeline_id) < limit[n.pipeline_id]:
                heapq.heappush(heap, (_serve_key(draft, n, shares), n))
                continue
        # it is served (or nothing free fits it, and later expansions only use more)
        _leave(draft, n, crowd)


def _own_free_gpus(draft: Draft, n: RolloutNeed) -> list[int]:
    """Free GPUs inside ``n``'s candidate bundles (scanning the smaller side), none held back for their owner."""
    bundle_of = n.entry.bundle_of
    owner, held = draft.owner, draft.kept_from(n.pipeline_id)
    if len(bundle_of) < draft.free_count:
        return [g for g in bundle_of if owner[g] is None and g not in held]
    return [g for g in draft.free_gpus() if g in bundle_of and g not in held]


def _crowd(draft: Draft, wanting: list[RolloutNeed]) -> dict[int, int]:
    """Free GPU -> how many wanting pipelines have a candidate bundle on it."""
    crowd: dict[int, int] = {}
    for n in wanting:
        for g in _own_free_gpus(draft, n):
            crowd[g] = crowd.get(g, 0) + 1
    return crowd


def _leave(draft: Draft, n: RolloutNeed, crowd: dict[int, int]) -> None:
    for g in _own_free_gpus(draft, n):
        if g in crowd:
            crowd[g] -= 1


def _best_free_bundle(draft: Draft, n: RolloutNeed, crowd: dict[int, int]) -> Gpus | None:
    """The wholly free candidate bundle of ``n`` fewest others could use, no GPU of it held back for its owner."""
    owner, held = draft.owner, draft.kept_from(n.pipeline_id)
    bundle_of = n.entry.bundle_of
    rank = n.entry.bundle_rank
    best = None
    if n.tp == 1:  # fast path: every free GPU of the mapping is a free bundle
        for g in _own_free_gpus(draft, n):
            bundle = bundle_of[g]
            key = (crowd.get(g, 1) - 1, rank[bundle], g)
            if best is None or key < best[0]:
                best = (key, bundle)
        return None if best is None else best[1]
    seen: set[Gpus] = set()
    for g in _own_free_gpus(draft, n):
        bundle = bundle_of[g]
        if bundle in seen:
            continue
        seen.add(bundle)
        if all(owner[x] is None and x not in held for x in bundle):
            key = (sum(crowd.get(x, 1) for x in bundle) - len(bundle), rank[bundle], bundle[0])
            if best is None or key < best[0]:
                best = (key, bundle)
    return None if best is None else best[1]
