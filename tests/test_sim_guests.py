"""Simulator property: jobs queued for one partition. On random small traces where each node's
home is wanted by 2-4 jobs arriving over time (as ``queued_cluster``, of other sizes, tails,
model loads and staleness), the job admitted first owns the home and the others are its guests.
Under ``rlix`` (default knobs) no job, owner or guest, finishes more than 4% later than under
``static`` (where the owner has the home to itself and a guest waits for it to leave), nearly
every draw keeps every job within 2%, and the makespan is never longer. What keeps an owner
whole: a guest's gang stages go on the owner's GPUs only when, by what the scheduler has
measured, they cost the owner nothing (``guest_stage_fit``). Without that rule, owners on these
draws finished up to 1.715x later, and 20 of the 30 draws had a job more than 2% later.
"""

from __future__ import annotations

import random

import pytest
from helpers import drawn_job

from rlix.sim.simulator import replay
from rlix.trace import Trace, TraceModel


def queued_trace(seed: int) -> Trace:
    """1-2 nodes of 8 GPUs; on each a home of 4 or 8 GPUs that 2-4 jobs queue for."""
    rng = random.Random(seed)
    nodes = rng.choice([1, 2])
    gpus = nodes * 8
    jobs = []
    for node in range(nodes):
        width, start, arrival = rng.choice([4, 8]), node * 8, 0.0
        for k in range(rng.randint(2, 4)):
            train = (start, start + max(1, width // 4) - 1)
            job = drawn_job(rng, f"n{node}-{k}", arrival=arrival, train=train, gpus=gpus, max_steps=5)
            job["home"] = list(range(start, start + width))
            job["init_s"] = rng.choice([20.0, 60.0])
            jobs.append(job)
            arrival += round(rng.uniform(0, 400), 1)
    raw = {"format": "rlix-trace", "version": 1, "name": f"queued-{seed}", "cluster": {"nodes": nodes, "gpus_per_node": 8}}
    return Trace(TraceModel.model_validate({**raw, "pipelines": jobs}), f"queued-{seed}")


DRAWS = range(30)


def slowdowns(seed: int) -> tuple[dict[str, float], float]:
    """Each job's JCT under rlix over its JCT under static, and the makespan ratio, on draw ``seed``."""
    trace = queued_trace(seed)
    rlix, static = replay(trace, "rlix"), replay(trace, "static")
    assert any(p.queue_delay_s > 0 for p in static.pipelines.values()), "the draw has jobs queued under static"
    assert rlix.trajectories_lost == 0
    return {p: rlix.pipelines[p].jct_s / static.pipelines[p].jct_s for p in rlix.pipelines}, rlix.makespan_s / static.makespan_s


@pytest.mark.parametrize("seed", DRAWS)
def test_no_job_queued_for_a_home_finishes_much_later_than_under_static(seed):
    slow, makespan = slowdowns(seed)
    worst = max(sorted(slow), key=slow.get)
    assert slow[worst] <= 1.04, f"{worst} {slow[worst]:.3f}x its static JCT"
    assert makespan <= 1 + 1e-9


def test_nearly_every_draw_keeps_every_job_within_two_percent_of_static():
    # 29 of these 30 draws (the other: an owner 1.029x, a guest's stage that fitted the owner's
    # shortest rollout so far, and the next rollout was shorter still)
    within = [seed for seed in DRAWS if max(slowdowns(seed)[0].values()) <= 1.02]
    assert len(within) >= 27, f"only {len(within)} of {len(DRAWS)} draws"
