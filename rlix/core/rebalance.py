"""Core layer: moving rollout workers between pipelines (the rebalance pass).

Two phases. Shares: a pipeline owed a whole worker of its share takes one
from a pipeline above its share. Work: a pipeline still below its need takes
workers their holders cannot use (idle surplus, or the spare workers of a
resumable pipeline whose stragglers can be packed onto fewer workers).

The donor rules (:class:`DonorRules`) hold after every single victim:
no worker expanded earlier in the same plan is shrunk; no pipeline with
a floor in its share, nor one finishing a protected batch, loses its last
worker; a donor gives only above its share; both rules yield to a starving
receiver (no worker for ``min_residency_s`` with trajectories queued): its
first worker may come from any donor not finishing a protected batch, so a
wide bundle split between several holders is still assembled, and jobs that
cannot all hold a worker at once take turns, longest waiting first: the worker
a starving job got is not taken by this pass while busy until the job has
finished a trajectory more (or ``turn_limit_s``), so turns progress even where
preemption throws running work away (gang stages and home owners still take
GPUs back as they always do), and once the job starving longest has waited twice
``min_residency_s`` one of its bundles is kept for it (:func:`muster`); busy workers of a nearly finished (protected)
batch are not taken for shares, unless the receiver has no worker at all
(protection never keeps a pipeline with demand below its floor), but its
stragglers may be packed onto fewer of its workers; a worker is moved only after
it has amortised its own switch (switch-aware residency) and only to a
receiver with more work per worker than the switch costs it.
"""

from __future__ import annotations

import enum
import heapq

from rlix.core.homes import owned_bundles
from rlix.core.ledger import Draft
from rlix.core.shares import RolloutNeed, starving_key
from rlix.core.state import View
from rlix.core.types import GangHolder, Gpus, RolloutWorker, ShrinkReason

_EPS = 1e-9
# A moved worker must first have held its GPUs this many times its own switch
# cost (seconds of wake + weight sync), so at most half its life is switching.
AMORTIZE = 2.0


class Phase(enum.Enum):
    SHARE = "share"
    WORK = "work"


class DonorRules:
    """Who may give which worker to whom, given the victims already chosen."""

    def __init__(
        self, view: View, draft: Draft, needs: list[RolloutNeed], shares: dict[str, float], caps: dict[str, int] | None = None
    ) -> None:
        self.cfg = view.config
        self.caps = caps or {}  # the most workers a job of a tenant with a limit may hold (tenants.worker_caps)
        self.now = view.now
        self.draft = draft
        self.placed_at = draft.ledger.placed_at
        self.by_pid = {n.pipeline_id: n for n in needs}
        self.shares = shares
        # Some pipeline starves (no worker for min_residency_s): donors at or below their share may give too.
        self.starving = any(n.starving and draft.worker_count(n.pipeline_id) == 0 for n in needs)

    def owed(self, n: RolloutNeed, phase: Phase) -> bool:
        count = self.draft.worker_count(n.pipeline_id)
        if count >= self.caps.get(n.pipeline_id, count + 1):
            return False  # its tenant's limit: no more, whatever work it has
        if phase is Phase.SHARE:
            return count + 1 <= self.shares[n.pipeline_id] + _EPS
        return count < n.need

    def worth_a_switch(self, n: RolloutNeed) -> bool:
        """The receiver would keep one more worker busy longer than it takes to switch it in."""
        return pays_for_switch(n, self.draft.worker_count(n.pipeline_id))

    def movable(self, pid: str, phase: Phase) -> list[RolloutWorker]:
        """Workers of ``pid`` that some receiver could take in this phase.

        A superset of what :meth:`may_take` allows (it is checked again victim
        by victim); within a phase donors only lose eligibility, so the list
        built at the start of the phase stays a superset.
        """
        draft = self.draft
        d = self.by_pid.get(pid)
        shrunk = draft.shrunk
        placed = draft.ledger.workers_of(pid).values()
        if d is None or d.need == 0:
            return [w for w in placed if not shrunk or w not in shrunk]  # gone, silent, or wants nothing: all lendable
        count = draft.worker_count(pid)
        if count <= 1 and (d.protected or (self.shares[pid] > 0 and not self.starving)):
            return []
        surplus = count > d.need
        moves = (
            (self.starving or count - 1 >= self.shares[pid] - self.cfg.rebalance_margin_workers)
            if phase is Phase.SHARE
            else d.resumable and surplus
        )
        if not (surplus or moves):
            return []
        if shrunk:
            placed = [w for w in placed if w not in shrunk]
        cutoff = self.now - self.horizon(d)
        loads = d.loads
        placed_at = self.placed_at
        if moves:  # one comprehension: this loop dominates a plan
            if surplus:
                return [w for w in placed if placed_at[w.gpus[0]] <= cutoff or not loads.get(w.gpus[0])]
            return [w for w in placed if placed_at[w.gpus[0]] <= cutoff]
        return [w for w in placed if not loads.get(w.gpus[0])]  # surplus: its idle workers

    def may_take(self, w: RolloutWorker, receiver: RolloutNeed | None, taken: dict[str, int], phase: Phase) -> bool:
        """May ``w`` go to ``receiver``, after ``taken`` workers already chosen per donor?

        ``receiver=None`` asks whether some receiver with no worker yet could take it.
        """
        draft = self.draft
        pid = w.pipeline_id
        if w in draft.shrunk or w in draft.expanded or (receiver is not None and pid == receiver.pipeline_id):
            return False
        d = self.by_pid.get(pid)
        if d is None or d.need == 0:
            return True  # gone, silent, or wants nothing: lendable
        have = draft.worker_count(pid) - taken.get(pid, 0)
        first = phase is Phase.SHARE and receiver is not None and receiver.starving
        first = first and draft.worker_count(receiver.pipeline_id) == 0  # a starving receiver's first worker
        if have <= 1 and (d.protected or (self.shares[pid] > 0 and not first)):
            return False  # the one-worker floor holds after every victim (a starving receiver's aside)
        busy = d.loads.get(w.gpus[0], 0) > 0
        if busy and d.entry.in_turn(w.gpus[0], self.now, self.cfg):
            return False  # the turn of a job that starved: kept until it finishes a trajectory
        if not busy and have > d.need:
            return True  # idle surplus
        floor_receiver = receiver is None or draft.worker_count(receiver.pipeline_id) == 0
        if busy and d.protected and phase is Phase.SHARE and not floor_receiver:
            return False  # a nearly finished batch keeps its share (packing it is fine: see below)
        if not self._resident(w, d):
            return False
        if phase is Phase.SHARE:
            return first or have - 1 >= self.shares[pid] - self.cfg.rebalance_margin_workers
        # Packing stragglers onto fewer workers, a protected batch's too: the
        # donor keeps enough slots for every trajectory it has, so each one
        # continues at once on a worker its own pipeline keeps.
        return d.resumable and have > d.need

    def horizon(self, d: RolloutNeed) -> float:
        """Seconds a worker of ``d`` must hold its GPUs before it may move (switch-aware residency)."""
        return max(self.cfg.min_residency_s, AMORTIZE * d.switch_s)

    def _resident(self, w: RolloutWorker, d: RolloutNeed) -> bool:
        return self.now - self.placed_at.get(w.gpus[0], self.now) >= self.horizon(d)

    def donor_key(self, w: RolloutWorker) -> tuple[float, float]:
        """Prefer the donor furthest above its share, then furthest from finishing its batch."""
        d = self.by_pid.get(w.pipeline_id)
        if d is None or d.need == 0:
            return (-1e18, -1.0)
        return (self.shares[d.pipeline_id] - self.draft.worker_count(d.pipeline_id), -d.remaining_fraction)


def pays_for_switch(n: RolloutNeed, count: int) -> bool:
    """``n`` holding ``count`` workers would keep one more busy longer than it takes to switch it in.

    Unknown work or switch cost (0): allowed, as before switch costs were reported.
    A job with demand and no worker at all is always allowed: without one its
    trajectories wait for ever, however little work they are (its work is only an
    estimate from the mean trajectory over the slots, and its straggler may be long).
    """
    if n.switch_s <= 0 or n.work_s <= 0 or count == 0:
        return True
    return n.work_s / (count + 1) > n.switch_s


def rebalance(
    view: View, draft: Draft, needs: list[RolloutNeed], shares: dict[str, float], caps: dict[str, int] | None = None
) -> None:
    """Move workers to pipelines owed them (shares), then to pipelines short of work; ``caps``: the most
    workers a job may end with (a tenant's limit)."""
    rules = DonorRules(view, draft, needs, shares, caps)
    for phase in (Phase.SHARE, Phase.WORK):
        _phase(draft, needs, rules, phase)


def reclaim_homes(view: View, draft: Draft, needs: list[RolloutNeed], guaranteed: dict[str, int]) -> None:
    """A job below its guarantee takes its home bundles back from borrowers, at once.

    The borrowers' residency and protection do not count: they borrowed on
    the owner's terms; only a borrower's last worker stays while it has
    demand (it would have nowhere to go). Bundles go fewest aborted trajectories
    first, then lowest GPU id; a bundle a gang holds, or with a worker
    expanded in this plan, is skipped. Jobs in pipeline-id order.
    """
    if not guaranteed:  # home_guarantee off, or no owner wants its home
        return
    owned = owned_bundles(view)
    by_pid = {n.pipeline_id: n for n in needs}
    owner = draft.owner
    for pid in sorted(guaranteed):
        n = by_pid[pid]
        if draft.worker_count(pid) >= guaranteed[pid] or not pays_for_switch(n, draft.worker_count(pid)):
            continue
        options = []
        for bundle in owned.get(pid, ()):
            if not n.entry.is_candidate(bundle):
                continue  # cooling after a lost worker, or its process still starting
            holders = {owner[g] for g in bundle} - {None}
            if any(isinstance(h, GangHolder) or h.pipeline_id == pid or h in draft.expanded for h in holders):
                continue
            victims = sorted(holders, key=lambda w: w.sort_key)
            if any(_last_wanted(draft, by_pid.get(v.pipeline_id)) for v in victims):
                continue
            aborted = sum(by_pid[v.pipeline_id].loads.get(v.gpus[0], 0) for v in victims if v.pipeline_id in by_pid)
            options.append(((aborted, bundle[0]), bundle, victims))
        options.sort(key=lambda o: o[0])
        for _, bundle, victims in options:
            if draft.worker_count(pid) >= guaranteed[pid]:
                break
            if any(owner[g] is not None and owner[g] not in victims for g in bundle):
                continue  # taken earlier in this loop
            if any(v not in draft.shrunk and _last_wanted(draft, by_pid.get(v.pipeline_id)) for v in victims):
                continue  # an earlier reclaim in this loop left it one worker
            for v in victims:
                if v not in draft.shrunk:
                    draft.shrink(v, ShrinkReason.REBALANCE)
            draft.expand(pid, bundle)


def muster(view: View, draft: Draft, needs: list[RolloutNeed], caps: dict[str, int]) -> None:
    """Keep a bundle for the job starving longest, once it has waited twice ``min_residency_s`` with no worker.

    Its first worker may come from any donor, but not from a worker that is another starving job's turn
    (:meth:`DonorRules.may_take`). Where its bundles are wider than the others' workers, turns that start
    one after another can leave a turn in every bundle for as long as jobs starve (a four-GPU job among
    one- and two-GPU ones waited 1,375 s where turns lasted 20-60 s). So the bundle of its that is
    nearest to free (fewest workers it may not take now: turns, a nearly finished batch's last worker;
    then fewest running trajectories, its preference and first GPU) is kept from every other job's
    rollout: no worker of theirs is placed there or moves there, until it has its worker (as each turn
    there ends). Only a job that may hold a worker (``caps``: its tenant's limit), and only on a bundle no
    gang stage holds and no other job owns as its home (an owner keeps its home, :func:`reclaim_homes`).
    """
    wait = 2.0 * view.config.min_residency_s
    hungry = [
        n
        for n in needs
        if n.starving
        and n.need > 0
        and caps.get(n.pipeline_id, 1) > 0
        and draft.worker_count(n.pipeline_id) == 0
        and view.now - n.entry.wanting_since >= wait
    ]
    if not hungry:
        return
    n = min(hungry, key=lambda m: (starving_key(m), m.pipeline_id))
    by_pid = {m.pipeline_id: m for m in needs}
    homes = {g for pid, bundles in owned_bundles(view).items() if pid != n.pipeline_id for b in bundles for g in b}

    def stuck(h: RolloutWorker) -> bool:
        d = by_pid.get(h.pipeline_id)
        if d is None or not d.loads.get(h.gpus[0], 0):
            return False
        return d.entry.in_turn(h.gpus[0], view.now, view.config) or (d.protected and draft.worker_count(d.pipeline_id) <= 1)

    def nearest_free(bundle: Gpus) -> tuple:
        holders = sorted({draft.owner[g] for g in bundle} - {None}, key=lambda w: w.sort_key)
        running = sum(by_pid[h.pipeline_id].loads.get(h.gpus[0], 0) for h in holders if h.pipeline_id in by_pid)
        return (sum(map(stuck, holders)), running, n.entry.bundle_rank[bundle], bundle[0])

    owner = draft.owner
    bundles = [
        b
        for b in sorted(set(n.entry.bundle_of.values()))
        if homes.isdisjoint(b) and not any(isinstance(owner[g], GangHolder) for g in b)
    ]
    if bundles:
        draft.mustered = (n.pipeline_id, frozenset(min(bundles, key=nearest_free)))


def _last_wanted(draft: Draft, n: RolloutNeed | None) -> bool:
    """``n`` has demand and one worker left."""
    return n is not None and n.need > 0 and draft.worker_count(n.pipeline_id) <= 1


def _receiver_key(draft: Draft, n: RolloutNeed, shares: dict[str, float]) -> tuple:
    count = draft.worker_count(n.pipeline_id)
    return (count > 0, starving_key(n), count - shares[n.pipeline_id], -n.remaining_fraction, n.pipeline_id)


def _phase(draft: Draft, needs: list[RolloutNeed], rules: DonorRules, phase: Phase) -> None:
    # A transfer changes only its receiver's and donors' counts, and donors are
    # never receivers in a phase, so a heap keyed on how owed each receiver is stays valid.
    receivers = [(_receiver_key(draft, n, rules.shares), n) for n in needs if n.need > 0 and rules.owed(n, phase)]
    if not receivers:
        return
    heapq.heapify(receivers)
    pool = _pool(draft, [n for _, n in receivers], rules, phase)
    while receivers and pool:
        _, n = heapq.heappop(receivers)
        choice = _cheapest_takeover(draft, n, pool, rules, phase)
        if choice is None:
            continue  # nothing it could take now will appear later in this phase
        bundle, victims = choice
        for worker in victims:
            draft.shrink(worker, ShrinkReason.REBALANCE)
        draft.expand(n.pipeline_id, bundle)
        _prune(pool, victims, draft)
        if rules.owed(n, phase):
            heapq.heappush(receivers, (_receiver_key(draft, n, rules.shares), n))


def _pool(draft: Draft, receivers: list[RolloutNeed], rules: DonorRules, phase: Phase) -> dict[int, RolloutWorker]:
    """GPU -> the placed worker on it that some receiver might take in this phase.

    A receiver takes only its own bundles, so only the holders of GPUs inside
    some receiver's bundles are asked which of their workers may move (on a
    large cluster, a few of the pipelines): the pool differs from one built
    from every pipeline only on GPUs no receiver can take.
    """
    owner = draft.ledger.owner
    donors = set()
    for n in receivers:
        for g in n.entry.bundle_of:
            held = owner[g]
            if isinstance(held, RolloutWorker):
                donors.add(held.pipeline_id)
    return {g: w for pid in sorted(donors) for w in rules.movable(pid, phase) for g in w.gpus}


def _prune(pool: dict[int, RolloutWorker], victims: list[RolloutWorker], draft: Draft) -> None:
    """Drop from ``pool`` the victims' GPUs the receiver now holds (a victim's other GPUs are
    free now, and stay candidates). Workers their donors may no longer give stay in the pool:
    :meth:`DonorRules.may_take` refuses them victim by victim, which costs less than asking
    every donor again after each move (the pool only has to be a superset)."""
    owner = draft.owner
    for v in victims:
        for g in v.gpus:
            if owner[g] is not None:
                pool.pop(g, None)


def _candidate_bundles(n: RolloutNeed, pool: dict[int, RolloutWorker]) -> list[Gpus]:
    """Receiver bundles that overlap a possible victim (scanning the smaller side), by first GPU."""
    bundle_of = n.entry.bundle_of
    if len(pool) >= len(bundle_of):
        found = {bundle_of[g] for g in bundle_of if g in pool}
    else:
        found = {bundle_of[g] for g in pool if g in bundle_of}
    return sorted(found)


def _cheapest_takeover(
    draft: Draft, n: RolloutNeed, pool, rules: DonorRules, phase: Phase
) -> tuple[Gpus, list[RolloutWorker]] | None:
    """The receiver bundle whose takeover aborts the fewest trajectories.

    Ties: fewest victims, then donors furthest above their share and furthest
    from finishing, then the receiver's preference (its own home first: what
    it takes back there is borrowed, elsewhere it takes another job's home). The bundles are grouped by
    (trajectories aborted, victims), cheapest group first; a group is ranked by
    its donors and checked against the donor rules in that order, so the first
    that passes is the answer and the donors of dearer groups are never ranked
    (on a large cluster a receiver sees some thirty bundles, three in its cheapest group).
    """
    worth = rules.worth_a_switch(n)
    groups: dict[tuple[int, int], list[tuple[Gpus, list[RolloutWorker]]]] = {}
    for bundle in _candidate_bundles(n, pool):
        victims = _holders(draft, bundle, n.pipeline_id)
        if victims is None or (victims and not worth):
            continue
        groups.setdefault((_aborted(victims, rules), len(victims)), []).append((bundle, victims))
    donor_keys: dict[str, tuple[float, float]] = {}  # per donor: the draft does not change during the ranking
    for cost in sorted(groups):
        ranked = sorted(groups[cost], key=lambda o: _donor_rank(o[1], o[0], rules, donor_keys, n.entry.bundle_rank))
        for bundle, victims in ranked:
            if _may_take_all(victims, n, rules, phase):
                return bundle, victims
    return None


def _aborted(victims: list[RolloutWorker], rules: DonorRules) -> int:
    """Trajectories running on ``victims`` (aborted if they go)."""
    aborted = 0
    for v in victims:
        d = rules.by_pid.get(v.pipeline_id)
        if d is not None:
            aborted += d.loads.get(v.gpus[0], 0)
    return aborted


def _donor_rank(
    victims: list[RolloutWorker],
    bundle: Gpus,
    rules: DonorRules,
    donor_keys: dict[str, tuple[float, float]],
    preference: dict[Gpus, int],
) -> tuple[float, float, int]:
    """(sums of the donors' keys, the receiver's preference for the bundle, its home first): among
    takeovers of one cost, smaller goes first, so a job takes back its own home before another's."""
    gaps, unfinished = [], []
    for v in victims:
        key = donor_keys.get(v.pipeline_id)
        if key is None:
            key = donor_keys[v.pipeline_id] = rules.donor_key(v)
        gaps.append(key[0])
        unfinished.append(key[1])
    return (sum(gaps), sum(unfinished), preference[bundle])


def _holders(draft: Draft, bundle: Gpus, receiver: str) -> list[RolloutWorker] | None:
    """The rollout workers holding part of ``bundle``, by first GPU in it; None if a gang stage holds
    any, or one is kept from ``receiver`` (held back for its owner, :func:`rlix.core.homes.held_for_owners`,
    or mustered for another job, :func:`muster`)."""
    victims: list[RolloutWorker] = []
    owner, held = draft.owner, draft.kept_from(receiver)
    for g in bundle:
        if g in held:
            return None
        other = owner[g]
        if other is None or other in victims:
            continue
        if not isinstance(other, RolloutWorker):
            return None
        victims.append(other)
    return victims


def _may_take_all(victims: list[RolloutWorker], n: RolloutNeed, rules: DonorRules, phase: Phase) -> bool:
    """May every one of ``victims`` go, so that ``n`` takes their GPUs (the donor rules hold after each)?"""
    taken: dict[str, int] = {}
    for other in victims:
        if not rules.may_take(other, n, taken, phase):
            return False
        taken[other.pipeline_id] = taken.get(other.pipeline_id, 0) + 1
    return True
