"""A job with trajectories queued gets a rollout worker within bounded time, whatever its bundle width.

Before: a job whose workers need a 4-GPU bundle, while single-GPU workers of jobs with less
work (favoured by ``small_first``) held every GPU of its mapping, never got a worker: the
leftover capacity after the others' one-worker floors was always narrower than its bundle, and
the GPUs of each bundle were split between holders at their shares. Now a job that has waited
``min_residency_s`` for a first worker is floored first, and its first worker may come from any
donor not finishing a protected batch.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from helpers import demand, owners, register, spec

from rlix.core import (
    ClusterSpec,
    ReleaseStage,
    RequestStage,
    Scheduler,
    SchedulerConfig,
    SchedulingError,
    Stage,
    TenantSpec,
    check_ledger,
)


def first_worker_at(sched: Scheduler, narrow: dict[str, int], wide: str, wide_demand: int, until: int) -> int | None:
    """Step once a second, every job busy on its workers and keeping its demand; when ``wide`` got a worker."""
    for t in range(1, until):
        events = [demand(p, n, loads={w.gpus[0]: 4 for w in sched.workers(p)}) for p, n in narrow.items()]
        events.append(demand(wide, wide_demand, loads={w.gpus[0]: 4 for w in sched.workers(wide)}))
        sched.step(float(t), events)
        check_ledger(sched.ledger)
        if sched.workers(wide):
            return t
    return None


def test_a_four_gpu_bundle_gets_its_worker_from_single_gpu_workers_that_hold_every_gpu():
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(min_residency_s=5))
    register(sched, spec("a", (0,), range(4), tp=1), spec("b", (3,), range(4), tp=4))
    sched.step(0.0, [demand("a", 40)])
    assert owners(sched) == {"a": [0, 1, 2, 3], "b": []}
    assert first_worker_at(sched, {"a": 40}, "b", 400, 60) == 6  # 5 s of waiting, then a's workers (resident 5 s) give
    assert owners(sched) == {"a": [], "b": [0]}


@pytest.mark.parametrize("floor_share", [0.0, 0.5])
@pytest.mark.parametrize("home_guarantee", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_every_job_with_demand_gets_a_worker_in_bounded_time(seed: int, home_guarantee: bool, floor_share: float):
    # With home_guarantee on, the narrow jobs own the GPUs of their homes, which the wide job's
    # bundles overlap: their guarantees are cut to make room for its turn (before: it never got one).
    # With a floor for every job (floor_share 0), the wide job waits twice the residency at most.
    # With floor_share, narrow co-tenants owed under half a worker starve too and may take their
    # turns first: it then also waits for those turns to end (no trajectory finishes here, so each
    # lasts turn_limit_s, shortened here to twice the residency).
    rng = random.Random(seed)
    gpn = rng.choice([4, 8])
    tp = rng.choice([2, 4] if gpn == 4 else [2, 4, 8])
    residency = rng.choice([5.0, 30.0])
    turn = 2 * residency if floor_share else SchedulerConfig().turn_limit_s
    config = SchedulerConfig(min_residency_s=residency, home_guarantee=home_guarantee, turn_limit_s=turn, floor_share=floor_share)
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=gpn), "rlix", config)
    narrow = {f"a{i}": rng.choice([8, 40, 400]) for i in range(rng.choice([1, 2, 3]))}
    register(sched, *[spec(p, (i,), range(gpn)) for i, p in enumerate(narrow)], spec("b", (gpn - 1,), range(gpn), tp=tp))
    sched.step(0.0, [demand(p, n) for p, n in narrow.items()])
    bound = 2 * residency + (turn if floor_share else 0.0)
    got = first_worker_at(sched, narrow, "b", rng.choice([40, 400, 4000]), int(2 * bound))
    assert got is not None and got <= bound + 1, (got, owners(sched))


def one_gpu_turns(turn_limit_s: float, first_trajectory_s: float, jobs: str = "ab", until: int = 200) -> list[tuple[int, str]]:
    """Jobs wanting the one GPU of a cluster, every worker busy; a holder finishes its first
    trajectory ``first_trajectory_s`` after it got the GPU. When the GPU changed hands, and to whom."""
    # Equals on one GPU: without the guarantee (with it, the job admitted first owns the GPU they share).
    config = SchedulerConfig(min_residency_s=5, turn_limit_s=turn_limit_s, home_guarantee=False)
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=1), "rlix", config)
    register(sched, *[spec(p, (0,), (0,)) for p in jobs])
    sched.step(0.0, [demand("a", 40)])
    finished, holder, since, handovers = dict.fromkeys(jobs, 0), "a", 0, []
    for t in range(1, until):
        if t - since == first_trajectory_s:
            finished[holder] += 1
        loads = {p: {w.gpus[0]: 4 for w in sched.workers(p)} for p in jobs}
        sched.step(float(t), [demand(p, 40, loads=loads[p], finished=finished[p]) for p in jobs])
        check_ledger(sched.ledger)
        now_holder = next(p for p in jobs if sched.workers(p))
        if now_holder != holder:
            holder, since = now_holder, t
            handovers.append((t, holder))
    return handovers


def test_jobs_that_starve_in_turn_keep_each_turn_until_a_trajectory_finishes():
    # Each holder finishes its first trajectory 30 s after it got the GPU. Without turns the GPU
    # changed hands every 5 s (min_residency_s), and a job whose preempted trajectories start
    # over never finished one. Now a turn lasts until its job finished one (30 s; the plan that
    # gets the report of it hands the GPU over).
    turns = [(5, "b"), (10, "a"), (40, "b"), (70, "a"), (100, "b"), (130, "a"), (160, "b"), (190, "a")]
    assert one_gpu_turns(900.0, first_trajectory_s=30) == turns


def test_a_turn_ends_after_turn_limit_s_if_the_job_finishes_nothing():
    # Nobody ever finishes a trajectory: each turn lasts turn_limit_s (40 s), so no wait is unbounded.
    assert one_gpu_turns(40.0, first_trajectory_s=1000) == [(5, "b"), (10, "a"), (50, "b"), (90, "a"), (130, "b"), (170, "a")]


def test_starving_jobs_take_their_turns_longest_waiting_first():
    # Three jobs, one GPU: before, two of them took turns and the third never got the GPU (they
    # were served by weight and id, not by how long they had waited). Now in order of waiting.
    turns = one_gpu_turns(900.0, first_trajectory_s=30, jobs="abc", until=300)
    assert "".join(p for _, p in turns) == ("bca" * 4)[: len(turns)]
    assert len(turns) >= 8 and all(later - t <= 40 for (t, _), (later, _) in zip(turns, turns[1:]))


@pytest.mark.parametrize("limit", [0.0, -1.0, float("inf")])
def test_a_turn_limit_that_would_not_end_or_not_protect_a_turn_is_refused(limit: float):
    with pytest.raises(SchedulingError, match="turn_limit_s"):
        Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", SchedulerConfig(turn_limit_s=limit))


def wide_wait_among_turns(gpn: int, tp: int, narrow: int, arrival: int, trajectory_s: int) -> int | None:
    """Seconds until a job with ``tp``-GPU bundles gets a worker while ``narrow`` single-GPU jobs,
    more than the GPUs, take turns; each worker finishes a trajectory every ``trajectory_s``."""
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=gpn), "rlix", SchedulerConfig(min_residency_s=5))
    jobs = [f"a{i}" for i in range(narrow)]
    register(sched, *[spec(p, (i % gpn,), range(gpn)) for i, p in enumerate(jobs)], spec("w", (gpn - 1,), range(gpn), tp=tp))
    sched.step(0.0, [demand(jobs[0], 40)])
    finished, since = dict.fromkeys(jobs, 0), {}
    for t in range(1, 1000):
        held = {(p, w.gpus[0]) for p in jobs for w in sched.workers(p)}
        since = {k: since.get(k, t) for k in held}
        for p, _ in sorted(k for k in held if (t - since[k]) % trajectory_s == trajectory_s - 1):
            finished[p] += 1
        events = [demand(p, 40, loads={w.gpus[0]: 4 for w in sched.workers(p)}, finished=finished[p]) for p in jobs]
        events += [demand("w", 400)] if t >= arrival else []
        sched.step(float(t), events)
        check_ledger(sched.ledger)
        if sched.workers("w"):
            return t - arrival
    return None


@pytest.mark.parametrize("gpn,tp,narrow", [(2, 2, 3), (2, 2, 6), (4, 2, 5), (4, 4, 6)])
@pytest.mark.parametrize("arrival,trajectory_s", [(0, 20), (10, 60)])
def test_a_wide_job_among_more_narrow_starving_jobs_than_gpus_waits_a_few_turns(gpn, tp, narrow, arrival, trajectory_s):
    # Turns end as trajectories finish, so the wide job's wait is a few turns (measured over 180
    # such setups: at most three turns of 60 s, 3.5 of 20 s); were turns to last turn_limit_s
    # (900 s) whatever the jobs finish, it would wait that long.
    got = wide_wait_among_turns(gpn, tp, narrow, arrival, trajectory_s)
    assert got is not None and got <= 4 * trajectory_s, got


def test_a_wide_job_among_narrow_jobs_of_two_widths_is_not_shut_out_by_turns_that_start_one_after_another():
    """Before: a four-GPU job among eight one- and two-GPU jobs, all starving by turns, waited 1,375 s
    for a worker where turns lasted 20-60 s: a turn that started in one bundle as another ended left
    a turn in every bundle. Now the bundle nearest to free is kept for it once it has waited twice
    ``min_residency_s``, and it waits for the turns already there (135 s here)."""
    jobs = {"wide": (4, 1, 20), "a0": (1, 4, 20), "a1": (1, 1, 60), "a2": (1, 1, 60), "a3": (1, 4, 60)}
    jobs |= {"a4": (1, 1, 20), "b0": (2, 1, 60), "b1": (2, 4, 40), "b2": (2, 4, 40)}
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=8), "rlix")  # every knob at its default (residency 30 s)
    register(sched, *[spec(p, range(8), range(8), tp=tp, slots=slots) for p, (tp, slots, _) in jobs.items()])
    finished, since, started, longest = dict.fromkeys(jobs, 0), None, {}, 0
    for t in range(5, 2500, 5):
        events = []
        for p, (_, slots, trajectory_s) in jobs.items():
            held = [w.gpus[0] for w in sched.workers(p)]
            for g in held:
                if t - started.setdefault((p, g), t) >= trajectory_s:
                    finished[p], started[(p, g)] = finished[p] + 1, t
            started = {k: v for k, v in started.items() if k[0] != p or k[1] in held}
            events.append(demand(p, 100, dict.fromkeys(held, slots), batch=1000, trajectory_s=trajectory_s, finished=finished[p]))
        sched.step(float(t), events)
        check_ledger(sched.ledger)
        since = None if sched.workers("wide") else (t if since is None else since)
        longest = max(longest, 0 if since is None else t - since)
    assert longest <= 2 * 30 + 2 * 60, longest  # the residency twice, then the turns in its bundle (60 s at most each)
    assert finished["wide"] >= min(finished[p] for p in jobs if p != "wide") - 4


def test_no_bundle_is_kept_for_a_starving_job_its_tenant_holds_to_no_worker():
    """Found in review of the kept bundle: one kept for a job its tenant's limit allows no worker (its
    tenant's training holds the limit) stayed idle for good, out of another tenant's reach."""
    config = SchedulerConfig(tenants=(TenantSpec(name="a", guarantee_gpus=2, borrow_limit_gpus=0), TenantSpec(name="b")))
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=8), "rlix", config)
    register(
        sched,
        *(replace(spec(p, (0, 1), range(8), tp=2, slots=4), tenant="a") for p in ("a1", "a2")),
        replace(spec("b1", (7,), range(8), slots=4), tenant="b"),
    )
    for t, pid in ((0, "a1"), (2, "a2")):
        sched.step(float(t), [RequestStage(pipeline_id=pid, stage=Stage.INIT)])
        sched.step(t + 1.0, [ReleaseStage(pipeline_id=pid, stage=Stage.INIT)])
    sched.step(4.0, [RequestStage(pipeline_id="a1", stage=Stage.ACTOR_TRAIN)])  # tenant a's 2 GPUs, for good
    for t in range(5, 600, 5):
        events = [demand("a2", 400, dict.fromkeys((w.gpus[0] for w in sched.workers("a2")), 4), trajectory_s=1000)]
        if t >= 200:
            events.append(demand("b1", 400, dict.fromkeys((w.gpus[0] for w in sched.workers("b1")), 4), trajectory_s=1000))
        sched.step(float(t), events)
        check_ledger(sched.ledger)
    assert owners(sched) == {"a1": [], "a2": [], "b1": [2, 3, 4, 5, 6, 7]}
