"""Co-tenants in the simulator: eight jobs mapped onto one 8-GPU node share the slowdown.

The figures over whole families are `benchmarks/cotenancy.py`'s; this checks the mechanism end
to end on two draws where the one-worker floors and the uncapped makespan factor made it unfair.
"""

from __future__ import annotations

import statistics

import pytest

from rlix.sim.alone import alone_jcts, slowdowns
from rlix.sim.scenarios import cotenancy_family
from rlix.sim.simulator import replay
from rlix.trace import Trace, TraceModel

OFF = {"urgency_cap": "0", "floor_share": "0"}


def eight_on_one_node(seed: int, staggered: bool) -> Trace:
    raw = cotenancy_family(jobs=8, nodes=1, staggered=staggered, seed=seed)
    return Trace(TraceModel.model_validate({"format": "rlix-trace", "version": 1, **raw}), raw["name"])


def unfairness(trace: Trace, alone: dict[str, float]) -> float:
    slow = slowdowns(replay(trace, "rlix"), alone)
    return max(slow.values()) / statistics.fmean(slow.values())


@pytest.mark.parametrize(("seed", "staggered"), [(0, True), (6, False)])
def test_eight_cotenants_on_one_node_share_the_slowdown(seed: int, staggered: bool):
    # Before urgency_cap and floor_share the worst job was 1.70x (seed 0, staggered: a small late
    # job on its one-worker floor) and 1.69x (seed 6: a multi-LoRA job the makespan factor weighed
    # at 3e-7 of the longest chain's) the mean slowdown; with them, 1.27x and 1.34x.
    trace = eight_on_one_node(seed, staggered)
    alone = alone_jcts(trace, "rlix")
    assert unfairness(trace.with_scheduler(OFF), alone) > 1.6
    assert unfairness(trace, alone) < 1.4
