"""Random valid setups over the whole knob space, driven through the public API.

One generator, two drivers: ``tests/test_core_knobs.py`` feeds it a
hypothesis-controlled ``random.Random`` (a few hundred examples in the
suite), ``benchmarks/fuzz_core.py`` a seeded one (10,000 setups, prints the
count of violations and exceptions).
"""

from __future__ import annotations

import random

from rlix.core import (
    ClusterSpec,
    PipelineSpec,
    Register,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    RoleSpec,
    Scheduler,
    SchedulerConfig,
    Stage,
    Unregister,
    WorkerLoad,
    check_ledger,
)

POLICY_NAMES = ("rlix", "rlix", "rlix", "static", "partial_overlap")
GANG_STAGES = (Stage.INIT, Stage.ACTOR_TRAIN, Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS)


def random_knobs(rng: random.Random) -> SchedulerConfig:
    return SchedulerConfig(
        report_ttl_s=rng.choice([1.0, 30.0, 600.0, rng.uniform(0.1, 900.0)]),
        protect_fraction=rng.choice([0.0, 0.1, 1.0, rng.random()]),
        min_residency_s=rng.choice([0.0, 0.0, 30.0, rng.uniform(0.0, 120.0)]),
        rebalance_margin_workers=rng.choice([0.0, 0.5, 1.0, 2.0, rng.uniform(0.0, 4.0)]),
        backlog_weight=rng.choice([0.0, 0.0, 1.0, rng.uniform(0.0, 5.0)]),
        weight_by_duration=rng.random() < 0.5,
        home_floor=rng.random() < 0.3,
        priority_weight=rng.choice([1.0, 2.0, rng.uniform(1.0, 10.0)]),
        small_first=rng.choice([0.0, 1.0, 3.0, rng.uniform(0.0, 10.0)]),
        path_halving_s=rng.choice([0.0, 350.0, rng.uniform(0.01, 5000.0)]),
        home_guarantee=rng.random() < 0.3,
        guest_stage_fit=rng.choice([0.0, 0.75, 1.0, rng.random()]),
        stage_yield=rng.choice([0.0, 0.0, 1.5, rng.uniform(1.01, 4.0)]),
    )


def random_spec(rng: random.Random, cluster: ClusterSpec, pid: str) -> PipelineSpec:
    n, gpn = cluster.num_gpus, cluster.gpus_per_node
    tp = rng.choice([t for t in (1, 1, 2, 4, 8) if gpn % t == 0])
    bundles = [tuple(range(b, b + tp)) for b in range(0, n, tp)]
    chosen = sorted(rng.sample(bundles, rng.randint(1, len(bundles))))
    lo = rng.randrange(n)
    train = tuple(range(lo, min(n, lo + rng.randint(1, 2 * gpn))))
    roles = [
        RoleSpec(role=Role.ACTOR_TRAIN, gpus=train),
        RoleSpec(role=Role.ACTOR_INFER, gpus=tuple(g for b in chosen for g in b), gpus_per_worker=tp),
    ]
    if rng.random() < 0.3:
        r0 = rng.randrange(n)
        roles.append(RoleSpec(role=Role.REFERENCE, gpus=tuple(range(r0, min(n, r0 + gpn)))))
    home = tuple(sorted(set(train) | set(rng.choice(chosen))))
    return PipelineSpec(
        pipeline_id=pid,
        roles=tuple(roles),
        slots_per_worker=rng.randint(1, 4),
        home=home,
        resumable=rng.random() < 0.5,
        priority=rng.choice([0, 0, 0, 1, 2, -1]),
    )


def random_report(rng: random.Random, sched: Scheduler, spec: PipelineSpec) -> ReportDemand:
    slots = spec.slots_per_worker
    loads = tuple(WorkerLoad(first_gpu=w.gpus[0], active=rng.randint(0, slots)) for w in sched.workers(spec.pipeline_id))
    pending = rng.choice([0, 0, rng.randint(0, 8), rng.randint(0, 200)])
    remaining = pending + sum(x.active for x in loads)
    return ReportDemand(
        pipeline_id=spec.pipeline_id,
        pending=pending,
        loads=loads,
        batch_size=rng.choice([0, remaining, remaining + rng.randint(0, 100)]),
        backlog=rng.choice([0, rng.randint(0, 500)]),
        trajectory_s=rng.choice([0.0, rng.uniform(0.5, 2000.0)]),
        switch_s=rng.choice([0.0, rng.uniform(0.1, 10.0), rng.uniform(10.0, 200.0)]),
        path_s=rng.choice([0.0, rng.uniform(0.0, 100.0), rng.uniform(0.0, 1e6)]),
    )


def run_setup(rng: random.Random, steps: int = 40, plans: list | None = None) -> Scheduler:
    """Drive one random scheduler; raises on any core exception or broken ledger (``plans``: each plan is appended)."""
    cluster = ClusterSpec(nodes=rng.randint(1, 3), gpus_per_node=rng.choice([1, 2, 4, 8]))
    policy = rng.choice(POLICY_NAMES)
    sched = Scheduler(cluster, policy, random_knobs(rng))
    specs = [random_spec(rng, cluster, f"p{i}") for i in range(rng.randint(1, 6))]
    live: dict[str, PipelineSpec] = {}
    requested: set[tuple[str, Stage]] = set()
    now = 0.0
    for _ in range(rng.randint(1, steps)):
        now += rng.choice([0.0, 0.5, 5.0, rng.uniform(0.0, 300.0)])
        for _ in range(rng.randint(1, 3)):
            _random_event(rng, sched, specs, live, requested, now)
        plan = sched.plan(now)
        if plans is not None:
            plans.append(plan)
        check_ledger(sched.ledger)
    return sched


def _random_event(rng, sched: Scheduler, specs, live: dict, requested: set, now: float) -> None:
    spec = rng.choice(specs)
    pid = spec.pipeline_id
    if pid not in live:
        if not any(k[0] == pid for k in requested) and pid not in sched._view.pipelines:
            if policy_accepts(sched, spec):
                sched.submit(Register(spec=spec), now)
                live[pid] = spec
        return
    kind = rng.choice(["request", "release", "demand", "demand", "demand", "unregister"])
    if kind == "request":
        stage = rng.choice(GANG_STAGES)
        if (pid, stage) in requested or (stage is Stage.REF_LOGPROBS and not spec.has_role(Role.REFERENCE)):
            return
        sched.submit(RequestStage(pipeline_id=pid, stage=stage), now)
        requested.add((pid, stage))
    elif kind == "release":
        mine = sorted((k for k in requested if k[0] == pid), key=lambda k: k[1].priority)
        if mine:
            sched.submit(ReleaseStage(pipeline_id=pid, stage=mine[0][1]), now)
            requested.discard(mine[0])
    elif kind == "demand":
        sched.submit(random_report(rng, sched, spec), now)
    else:
        sched.submit(Unregister(pipeline_id=pid), now)
        del live[pid]
        requested.difference_update({k for k in requested if k[0] == pid})


def policy_accepts(sched: Scheduler, spec: PipelineSpec) -> bool:
    """Whether the policy lets the pipeline run rollout anywhere (else registering is a caller error)."""
    return bool(sched.policy.rollout_bundles(spec))
