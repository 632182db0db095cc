"""Simulator property: rebalancing never starves a nearly finished batch.

Over random crowded traces (more pipelines than a fair share of GPUs each,
random protection threshold, zero or short residency), no pipeline loses
its last rollout worker to a rebalance (share moves or straggler packing)
while it has trajectories queued or running on a protected batch (at most
``protect_fraction`` of the batch left). Gang stages of other jobs may
still preempt it: non-preemptable stages come first by design.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlix.core import Plan, ShrinkReason
from rlix.sim.simulator import Simulation
from rlix.trace import Trace, TraceModel


class WatchedSimulation(Simulation):
    """A replay that checks each plan against the pipelines' true demand before carrying it out."""

    def __init__(self, trace: Trace) -> None:
        super().__init__(trace, "rlix")
        self.starved: list[tuple[float, str, int, int]] = []  # (time s, pipeline, trajectories left, batch)
        self.last_worker_moves = 0

    def _carry_out(self, plan: Plan) -> None:
        protect = self.sched.config.protect_fraction
        for pid in sorted({s.worker.pipeline_id for s in plan.shrinks if s.reason is ShrinkReason.REBALANCE}):
            if self.sched.workers(pid):  # the ledger already holds the plan: some worker is left
                continue
            p = self.pipelines[pid]
            report = p.demand_report()
            left, batch = report.pending + sum(load.active for load in report.loads), report.batch_size
            self.last_worker_moves += left == 0
            if left > 0 and batch > 0 and left <= protect * batch:
                self.starved.append((self.env.now, pid, left, batch))
        super()._carry_out(plan)


@st.composite
def crowded_traces(draw):
    nodes, gpn = draw(st.sampled_from([(1, 4), (1, 8), (2, 4)]))
    n = nodes * gpn
    pipelines = []
    for i in range(draw(st.integers(2, 6))):
        home = draw(st.integers(0, n - 1))
        tp = draw(st.sampled_from([1, 1, 2])) if gpn % 2 == 0 else 1
        lo = home - home % tp
        pipelines.append(
            {
                "id": f"p{i}",
                "kind": "full_finetune",
                "arrival_s": draw(st.floats(0, 60)),
                "roles": {
                    "actor_train": {"gpus": f"{lo}-{lo + tp - 1}"},
                    "actor_infer": {"gpus": f"0-{n - 1}", "gpus_per_worker": tp},
                },
                "home": f"{lo}-{lo + tp - 1}",
                "staleness": draw(st.integers(0, 1)),
                "slots_per_worker": draw(st.integers(1, 4)),
                "preempt": draw(st.sampled_from(["continue", "requeue"])),
                "init_s": 5.0,
                "switch": {"offload_s": 1.0, "load_s": draw(st.sampled_from([0.5, 5.0, 60.0])), "weight_sync_s": 0.5},
                "generate": {
                    "steps": draw(st.integers(1, 2)),
                    "trajectories_per_step": draw(st.integers(4, 40)),
                    "duration": {"median_s": draw(st.floats(2, 30)), "p99_s": 200.0, "max_s": 300.0},
                    "stages": {"actor_train": draw(st.floats(1, 30))},
                    "seed": i,
                },
            }
        )
    scheduler = {
        "protect_fraction": draw(st.sampled_from([0.1, 0.25, 0.5])),
        "min_residency_s": draw(st.sampled_from([0.0, 5.0, 30.0])),
        "rebalance_margin_workers": draw(st.sampled_from([0.0, 0.5, 1.0])),
    }
    raw = {"cluster": {"nodes": nodes, "gpus_per_node": gpn}, "scheduler": scheduler, "pipelines": pipelines}
    return Trace(TraceModel.model_validate(raw))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_traces())
def test_no_pipeline_loses_its_last_worker_on_a_protected_batch(trace):
    sim = WatchedSimulation(trace)
    metrics = sim.run()
    assert metrics.trajectories_lost == 0
    assert sim.starved == []


def _crowded_turns_trace() -> Trace:
    """Five jobs on four GPUs, one with 2-GPU rollout bundles, all requeueing preempted trajectories."""

    def job(pid, arrival, train, steps, n, median, train_s, *, tp=1, slots=2, preempt="requeue", seed=0):
        infer = {"gpus": "0-3", "gpus_per_worker": tp}
        return {
            "id": pid,
            "kind": "full_finetune",
            "arrival_s": arrival,
            "roles": {"actor_train": {"gpus": train}, "actor_infer": infer},
            "home": train,
            "slots_per_worker": slots,
            "preempt": preempt,
            "init_s": 5.0,
            "switch": {"offload_s": 1.0, "weight_sync_s": 0.5},
            "generate": {
                "steps": steps,
                "trajectories_per_step": n,
                "duration": {"median_s": median, "p99_s": 200.0, "max_s": 300.0},
                "stages": {"actor_train": train_s},
                "seed": seed,
            },
        }

    pipelines = [
        job("p0", 15.6, "0-1", 2, 30, 25.8, 1.0, tp=2),
        job("p1", 26.5, "2", 1, 16, 5.6, 20.1, seed=1),
        job("p2", 0.0, "1", 1, 20, 24.2, 30.0, slots=1, preempt="continue", seed=2),
        job("p3", 0.0, "2", 2, 29, 30.0, 7.1, seed=3),
        job("p4", 2.6, "1", 1, 31, 19.7, 6.0, seed=4),
    ]
    raw = {"cluster": {"nodes": 1, "gpus_per_node": 4}, "scheduler": {"min_residency_s": 5.0}, "pipelines": pipelines}
    return Trace(TraceModel.model_validate(raw))


@pytest.mark.timeout(120, method="signal")  # a livelock fails this test alone
def test_jobs_that_take_turns_on_a_crowded_cluster_all_finish():
    """Starving jobs take workers from each other in turns; before a turn lasted only the
    residency (5 s), shorter than most trajectories, and requeueing jobs never finished one
    (a livelock: the replay ran forever). A turn now lasts until its job finishes a trajectory."""
    trace = _crowded_turns_trace()
    sim = Simulation(trace, "rlix")
    metrics = sim.run()
    static = Simulation(trace, "static").run()
    assert all(p.done for p in sim.pipelines.values())
    assert metrics.trajectories_lost == 0
    assert metrics.makespan_s < static.makespan_s
