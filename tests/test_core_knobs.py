"""Never stuck: no knob setting makes the core raise or hand out a bad plan."""

from __future__ import annotations

import random
import warnings

from core_fuzz import run_setup
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlix.core import ClusterSpec, PipelineSpec, Register, ReportDemand, Role, RoleSpec, Scheduler, SchedulerConfig, check_ledger


def _spec(pid: str, gpus: tuple[int, ...], tp: int = 1) -> PipelineSpec:
    roles = (RoleSpec(role=Role.ACTOR_TRAIN, gpus=gpus), RoleSpec(role=Role.ACTOR_INFER, gpus=gpus, gpus_per_worker=tp))
    return PipelineSpec(pipeline_id=pid, roles=roles, slots_per_worker=1)


def test_zero_residency_and_a_one_worker_margin_do_not_wedge_the_scheduler():
    # Rebalance once listed a worker expanded earlier in the same plan as a victim;
    # the plan failed validation and every later plan raised the same way.
    cfg = SchedulerConfig(min_residency_s=0.0, rebalance_margin_workers=1.0)
    s = Scheduler(ClusterSpec(nodes=1, gpus_per_node=4), "rlix", cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.step(
            0,
            [
                Register(spec=_spec("c", (0, 1), tp=2)),
                Register(spec=_spec("a", (0,))),
                Register(spec=_spec("b", (1,))),
                Register(spec=_spec("e", (2, 3))),
            ],
        )
        s.step(0, [ReportDemand(pipeline_id="b", pending=1), ReportDemand(pipeline_id="e", pending=2)])
        plan = s.step(1, [ReportDemand(pipeline_id="a", pending=1), ReportDemand(pipeline_id="c", pending=10)])
        for t in range(2, 6):
            s.step(t, [ReportDemand(pipeline_id="c", pending=10 - t)])
    assert not s.violations
    assert not ({x.worker for x in plan.shrinks} & {x.worker for x in plan.expands})
    check_ledger(s.ledger)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_random_setups_and_knobs_never_raise_nor_violate(rng: random.Random):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a replaced plan warns: fail on it
        sched = run_setup(rng)
    assert sched.violations == []


def test_pruning_the_rebalance_pool_changes_no_plan(monkeypatch):
    """Rebalance drops from its candidate pool what no receiver may take any more: a speed-up
    only. Over random setups and knobs, every plan is the same without it."""
    import random

    from rlix.core import rebalance

    def plans_of(seed: int) -> list:
        plans: list = []
        run_setup(random.Random(seed), plans=plans)
        return plans

    seeds = range(1500)
    pruned = [plans_of(s) for s in seeds]
    monkeypatch.setattr(rebalance, "_prune", lambda *args: None)
    assert [plans_of(s) for s in seeds] == pruned
