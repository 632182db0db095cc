"""Order independence: registration order never decides an allocation.

Ties between pipelines are broken by weight, then remaining-work fraction,
then pipeline id (see ``rlix.core.shares.rank_key``), never by who
registered first.
"""

from __future__ import annotations

import random

import pytest
from core_fuzz import random_knobs, random_spec
from helpers import demand, owners, register, spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlix.core import (
    ClusterSpec,
    Register,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Scheduler,
    SchedulerConfig,
    Stage,
    WorkerLoad,
)


def _events(rng: random.Random, specs, steps: int):
    """A fixed event script (reports by pipeline id, so it reads the same under any registration order)."""
    script = []
    for _ in range(steps):
        batch = []
        for s in specs:
            if rng.random() < 0.6:
                pending = rng.choice([0, rng.randint(1, 8), rng.randint(1, 120)])
                batch.append(
                    (
                        "demand",
                        s.pipeline_id,
                        pending,
                        rng.random(),
                        rng.uniform(1, 300),
                        rng.choice([0, rng.randint(0, 400)]),
                        rng.uniform(0, 5000),
                    )
                )
            elif rng.random() < 0.15:
                batch.append(("gang", s.pipeline_id, 0, 0.0, 0.0, 0, 0.0))
        script.append((rng.choice([0.0, 5.0, 60.0]), batch))
    return script


def _play(cluster, specs, knobs, script) -> list[dict[str, list[int]]]:
    sched = Scheduler(cluster, "rlix", knobs)
    sched.step(0.0, [Register(spec=s) for s in specs])
    by_id = {s.pipeline_id: s for s in specs}
    held: set[str] = set()
    now = 0.0
    seen = []
    for dt, batch in script:
        now += dt
        for kind, pid, pending, busy, traj_s, backlog, path_s in sorted(batch):
            if kind == "gang":
                event = (
                    ReleaseStage(pipeline_id=pid, stage=Stage.ACTOR_TRAIN)
                    if pid in held
                    else RequestStage(pipeline_id=pid, stage=Stage.ACTOR_TRAIN)
                )
                held.symmetric_difference_update({pid})
                sched.submit(event, now)
                continue
            slots = by_id[pid].slots_per_worker
            loads = tuple(WorkerLoad(first_gpu=w.gpus[0], active=int(busy * slots)) for w in sched.workers(pid))
            running = sum(x.active for x in loads)
            report = ReportDemand(
                pipeline_id=pid,
                pending=pending,
                loads=loads,
                batch_size=pending + running + 10,
                backlog=backlog,
                trajectory_s=traj_s,
                path_s=path_s,
            )
            sched.submit(report, now)
        sched.plan(now)
        seen.append({pid: [w.gpus[0] for w in sched.workers(pid)] for pid in sorted(by_id)})
    return seen


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_permuting_registration_order_gives_the_same_allocation(rng, shuffler):
    cluster = ClusterSpec(nodes=rng.randint(1, 2), gpus_per_node=rng.choice([2, 4, 8]))
    specs = [random_spec(rng, cluster, f"p{i}") for i in range(rng.randint(2, 5))]
    knobs = random_knobs(rng)
    script = _events(rng, specs, rng.randint(1, 12))
    permuted = list(specs)
    shuffler.shuffle(permuted)
    assert _play(cluster, specs, knobs, script) == _play(cluster, permuted, knobs, script)


@pytest.mark.parametrize(
    ("config", "winner"),
    [(SchedulerConfig(weight_by_demand=True, small_first=0.0, path_halving_s=0.0), "big"), (SchedulerConfig(), "small")],
    ids=["proportional", "small-first"],
)
def test_the_same_pipeline_wins_the_node_in_either_order(config, winner):
    # TP-4 pipeline 'big' with 40x the demand of TP-1 'small' on one 4-GPU node: the
    # proportional split gives 'big' the node, the default split 'small' (least work left first).
    node = ClusterSpec(nodes=1, gpus_per_node=4)
    expected = {"big": [0], "small": []} if winner == "big" else {"big": [], "small": [0]}
    for order in (("small", "big"), ("big", "small")):
        sched = Scheduler(node, "rlix", config)
        specs = {
            "big": spec("big", range(4), range(4), tp=4, slots=1),
            "small": spec("small", range(4), range(4), slots=1),
        }
        register(sched, *(specs[pid] for pid in order))
        sched.step(0, [demand("small", 1), demand("big", 10)])
        assert owners(sched) == expected, order
