"""Core layer: home partitions as guarantees (sharing incentive).

Under ``static`` a job rolls out on the bundles of its own home partition
whenever its own gang stages leave them free. Under ``rlix`` it is owed at
least as much: its *guarantee* is the number of those bundles it could use
now, and lending them to others lasts only while it does not want them. A
GPU whose homes overlap (jobs queued for one partition) belongs to the job
admitted first, the one ``static`` would be running there; the others are
guests until it leaves. A guest's gang stages go after the owners' and start
on an owner's GPUs only where they cost it nothing (:func:`guest_stage_fits`),
with or without the guarantee. A job far enough ahead of its ``static`` pace
(:meth:`rlix.core.state.PipelineEntry.lends`, decided once a plan) lends its
guarantee until its lead falls back: it needs none to finish no later than
under ``static``. An owner that has just finished rolling out and is about
to ask for its gang stage keeps the GPUs of that stage from other jobs'
rollout meanwhile (:func:`held_for_owners`): a worker moved there would be
taken back before it had paid for its switch, and the stage would wait for it.
"""

from __future__ import annotations

from rlix.core.ledger import Draft
from rlix.core.lifecycle import PipelineState
from rlix.core.shares import RolloutNeed
from rlix.core.state import GangRequest, PipelineEntry, View, homeless, own_home, worker_loads
from rlix.core.types import GangHolder, Gpus, Holder


def home_owners(view: View) -> dict[int, str]:
    """GPU -> the job that owns it: the earliest-admitted active job whose home (:func:`own_home`)
    holds it (first come, first served, as ``static`` admits; jobs admitted at one instant by pipeline id)."""
    return _homes(view)[0]


def owned_bundles(view: View) -> dict[str, tuple[Gpus, ...]]:
    """Each admitted job's rollout bundles lying wholly on GPUs it owns (see :func:`home_owners`).

    Recomputed only when the active or admitted jobs change.
    """
    return _homes(view)[1]


def _homes(view: View) -> tuple[dict[int, str], dict[str, tuple[Gpus, ...]]]:
    # Recomputed only when the active jobs or their admissions change (registration order is stable).
    key = tuple((e.order, e.admitted_at) for e in view.pipelines.values() if e.state is PipelineState.ACTIVE)
    memo = view.memo.get("homes")
    if isinstance(memo, tuple) and memo[0] == key:
        return memo[1]
    active = view.active()
    admitted = sorted((e for e in active if e.admitted), key=lambda e: (e.admitted_at, e.spec.pipeline_id))
    owners: dict[int, str] = {}
    owned: dict[str, tuple[Gpus, ...]] = {}
    for e in admitted:  # the first admitted owns a shared home
        pid = e.spec.pipeline_id
        home = own_home(e.spec, (o.spec for o in active if o is not e))
        mine = {g for g in home if g not in owners}
        owners.update((g, pid) for g in sorted(mine))
        owned[pid] = tuple(b for b in e.rollout_bundles if mine.issuperset(b))
    view.memo["homes"] = (key, (owners, owned))
    return owners, owned


def gang_order(view: View) -> list[GangRequest]:
    """Pending gang requests, a guest's after every owner's of the same job priority (a job is a guest
    while some GPU of its home is another job's: it shares a partition it was not first in), then as
    :attr:`~rlix.core.state.GangRequest.sort_key` orders them, with ``slowdown_weight`` the most slowed
    co-tenant's first among stages of one priority that waited alike (finish-time fairness)."""
    owners = home_owners(view)
    guests = {r.pipeline_id for r in view.pending if _is_guest(view, owners, r.pipeline_id)}
    fair = homeless(view) if view.config.slowdown_weight > 0 else frozenset()
    slowed = {
        r.pipeline_id: -view.pipelines[r.pipeline_id].slowdown(view.now) if r.pipeline_id in fair else 0.0 for r in view.pending
    }
    return sorted(
        view.pending,
        key=lambda r: (-r.job_priority, r.pipeline_id in guests, -r.passed, r.stage.priority, slowed[r.pipeline_id], r.seq),
    )


def _is_guest(view: View, owners: dict[int, str], pipeline_id: str) -> bool:
    """Is some GPU of its default home another job's (see :func:`home_owners`)? Co-tenants are no
    one's guests: no job owns the GPUs they share."""
    return any(owners.get(g, pipeline_id) != pipeline_id for g in view.pipelines[pipeline_id].spec.home_gpus)


def guest_stage_fits(view: View, draft: Draft, req: GangRequest) -> bool:
    """May this gang stage start on GPUs that other jobs own?

    A job whose home is its own, or a stage on no GPU that a job of its priority or above
    owns, always may. A guest's stage (under ``static`` it would wait for the owner to
    leave) may if, by what the scheduler has measured, it holds up none of those owners:
    the owner asks for no gang stage now, its rollout left (queued and running) fits on
    its home bundles that are free or its own and that the stage does not touch (what it
    runs on the stage's GPUs continues on those), and the stage ends within
    ``guest_stage_fit`` of the owner's shortest rollout, counted from its last release.
    The stage's duration is its own last one, or the longest any active job's took where
    it has none. Unmeasured: it waits, at worst until the owner leaves (as under ``static``).
    """
    owners = home_owners(view)
    pid = req.pipeline_id
    if not _is_guest(view, owners, pid):
        return True
    # owners of a higher job priority than the request's go first anyway (gang_order)
    others = sorted(
        {o for g in req.gpus if (o := owners.get(g, pid)) != pid and view.pipelines[o].spec.priority >= req.job_priority}
    )
    if not others:
        return True
    fit = view.config.guest_stage_fit
    if fit <= 0:
        return False
    took = view.pipelines[pid].gang_times.stage_s.get(req.stage)
    if took is None:  # not measured for this job yet: the longest measured of any active job
        took = max((t for e in view.active() if (t := e.gang_times.stage_s.get(req.stage)) is not None), default=None)
    if took is None:
        return False
    asking = {r.pipeline_id for r in view.pending}
    return all(o not in asking and _costs_owner_nothing(view, draft, view.pipelines[o], req, took, fit) for o in others)


def _costs_owner_nothing(view: View, draft: Draft, owner: PipelineEntry, req: GangRequest, took: float, fit: float) -> bool:
    times = owner.gang_times
    gap = times.rollout_s()
    if times.free_since is None or gap is None or view.now + took > times.free_since + fit * gap:
        return False
    oid, gpus, holder = owner.spec.pipeline_id, set(req.gpus), draft.owner
    # Room for the owner's rollout: its home bundles apart from the stage's GPUs that are free or
    # its own (not a gang's, granted in this draft too, nor a borrower's, which it would wait for).
    room = sum(
        1
        for b in owned_bundles(view).get(oid, ())
        if not gpus.intersection(b) and all(holder[g] is None or _rollout_of(holder[g], oid) for g in b)
    )
    return _workers_left(owner) <= room


def _rollout_of(holder: Holder, pipeline_id: str) -> bool:
    return not isinstance(holder, GangHolder) and holder.pipeline_id == pipeline_id


def _workers_left(entry: PipelineEntry) -> int:
    """Workers the job's reported rollout still fills (queued and running trajectories over its slots)."""
    report = entry.demand
    if report is None:
        return 0
    left = report.pending + sum(worker_loads(entry.spec, report).values())
    return -(-left // entry.spec.slots_per_worker)


def held_for_owners(view: View) -> frozenset[int]:
    """GPUs kept from other jobs' rollout workers in this plan: those of an owner's gang stages
    (:attr:`~rlix.core.types.PipelineSpec.init_gpus`, where it owns them) while it is *between
    stages*: it has reported no trajectory queued or running, holds and asks for no gang stage, and
    entered that state (its last report going empty, or its last release) less than
    ``min_residency_s`` ago. After a rollout it asks for its next stage within moments (a shell
    computes rewards and builds the batch first); after a step's last stage it reports its next
    rollout, on its home. Either way a borrower placed there would be shrunk before it had resided
    ``min_residency_s``, and the owner would wait for that shrink; under ``static`` the GPUs wait
    idle for it. Past ``min_residency_s`` (a job pausing for something else) they are lent again.
    Only with ``home_guarantee``, and not for a job lending its guarantee."""
    if not view.config.home_guarantee:
        return frozenset()
    owners = home_owners(view)
    asking = {r.pipeline_id for r in view.pending}
    held: set[int] = set()
    for e in view.active():
        pid, times = e.spec.pipeline_id, e.gang_times
        if e.lending or e.empty_since is None or times.free_since is None or pid in asking:
            continue
        if view.now - max(e.empty_since, times.free_since) < view.config.min_residency_s:
            held.update(g for g in e.spec.init_gpus if owners.get(g) == pid)
    return frozenset(held)


def guarantees(view: View, draft: Draft, needs: list[RolloutNeed]) -> dict[str, int]:
    """Workers each job with demand is guaranteed now: its owned home bundles that are among its
    candidates (not cooling after a lost worker, no process still starting) and that no gang stage
    holds (or is granted in this draft), at most its need. Jobs without one are absent."""
    if not view.config.home_guarantee:
        return {}
    owned = owned_bundles(view)
    owner = draft.owner
    out: dict[str, int] = {}
    for n in needs:
        bundles = owned.get(n.pipeline_id, ())
        if n.need <= 0 or not bundles or n.entry.lending:
            continue
        free = sum(1 for b in bundles if n.entry.is_candidate(b) and not any(isinstance(owner[g], GangHolder) for g in b))
        if free:
            out[n.pipeline_id] = min(n.need, free)
    return out
