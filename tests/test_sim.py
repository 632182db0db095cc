"""Simulator tests: conservation of trajectories, staleness, determinism, targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlix.core import POLICIES
from rlix.job import lower_bounds
from rlix.sim.report import results_json, write_json
from rlix.sim.simulator import Simulation, replay
from rlix.trace import Trace, TraceModel, load_trace

TRACES = Path(__file__).parent.parent / "traces"


@st.composite
def small_traces(draw, cotenants: bool = False):
    """Small random traces; ``cotenants``: one node, every job training and rolling out on all of it, no homes."""
    nodes, gpn = draw(st.sampled_from([(1, 4), (1, 8)] if cotenants else [(1, 4), (1, 8), (2, 4)]))
    n = nodes * gpn
    pipelines = []
    for i in range(draw(st.integers(2 if cotenants else 1, 3))):
        lo = 0 if cotenants else draw(st.integers(0, n - 2))
        train = f"0-{n - 1}" if cotenants else f"{lo}-{min(n - 1, lo + draw(st.integers(0, 3)))}"
        kind = draw(st.sampled_from(["full_finetune", "full_finetune", "multi_lora"]))
        gen = lambda seed: {
            "steps": draw(st.integers(1, 3)),
            "trajectories_per_step": draw(st.integers(1, 24)),
            "duration": {"median_s": draw(st.floats(1, 30)), "p99_s": 200.0, "max_s": 300.0},
            "stages": {"old_logprobs": draw(st.floats(0, 20)), "actor_train": draw(st.floats(1, 40))},
            "seed": seed,
            **(
                {"agentic": {"turns": draw(st.integers(1, 4)), "tool": {"median_s": 5.0, "p99_s": 60.0}}}
                if draw(st.booleans())
                else {}
            ),
        }
        p = {
            "id": f"p{i}",
            "kind": kind,
            "arrival_s": draw(st.floats(0, 100)),
            "roles": {"actor_train": {"gpus": train}, "actor_infer": {"gpus": f"0-{n - 1}"}},
            **({} if cotenants else {"home": train}),
            "staleness": draw(st.integers(0, 2)),
            "slots_per_worker": draw(st.integers(1, 8)),
            "preempt": draw(st.sampled_from(["continue", "requeue"])),
            "placement": draw(st.sampled_from(["lowest_gpu", "longest_held"])),
            "init_s": 5.0,
        }
        mode = draw(st.sampled_from(["batch", "streaming", "partial"]))
        if mode != "batch":
            p["rollout_mode"] = "streaming"
            p["partial_rollout"] = mode == "partial"
        if draw(st.booleans()):
            p["decode_speed"] = {"knee": draw(st.integers(1, 8)), "exponent": draw(st.sampled_from([0.5, 1.0, 2.0]))}
        if draw(st.booleans()):
            p["stage_cost"] = {
                "reference_gpus": draw(st.integers(1, 4)),
                "token_fraction": draw(st.sampled_from([0.0, 0.5])),
                "share_load": draw(st.booleans()),
            }
        if draw(st.booleans()):
            p["arrivals"] = {"per_hour": 60.0, "count": draw(st.integers(1, 2)), "seed": i}
        if kind == "multi_lora":
            p["adapters"] = [{"id": f"p{i}-a{j}", "generate": gen(10 * i + j)} for j in range(draw(st.integers(1, 3)))]
        else:
            p["generate"] = gen(i)
        pipelines.append(p)
    return Trace(TraceModel.model_validate({"cluster": {"nodes": nodes, "gpus_per_node": gpn}, "pipelines": pipelines}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_traces(), st.sampled_from(list(POLICIES)))
def test_every_trajectory_completes_exactly_once_and_staleness_holds(trace, policy):
    sim = Simulation(trace, policy)
    metrics = sim.run()  # a trajectory finishing twice would fire its batch's event twice and raise
    total = trace.total_trajectories()
    assert metrics.trajectories_completed == total
    assert metrics.trajectories_lost == 0
    for p in trace.pipelines:
        sp = sim.pipelines[p.id]
        assert sp.engine.running == 0 and not sp.engine.book
        by_stream: dict[int, list] = {}
        for rec in sp.history:
            by_stream.setdefault(rec.stream, []).append(rec)
        for recs in by_stream.values():
            for k, rec in enumerate(recs):
                assert rec.rollout_start <= rec.rollout_end <= rec.train_end
                if k > 0 and p.rollout_mode == "batch":
                    assert rec.rollout_start >= recs[k - 1].rollout_end  # one rollout at a time
                if k > 0:
                    assert rec.train_end >= recs[k - 1].train_end  # trained in order
                gate = k - 1 - p.staleness
                if gate >= 0:
                    assert rec.rollout_start >= recs[gate].train_end  # never staler than the bound
                    assert rec.version >= gate + 1  # counted by each trajectory's oldest segment
    if all(p.kind == "full_finetune" for p in trace.pipelines):  # adapter loads are rebooked from work after the fact
        assert metrics.slot_utilization <= metrics.gpu_utilization + 1e-9
    fractions = metrics.gpu_utilization + metrics.idle_fraction + metrics.held_idle_fraction + metrics.switch_overhead_fraction
    assert fractions == pytest.approx(1.0, abs=1e-6)
    assert metrics.makespan_s >= metrics.makespan_lower_bound_s - 1e-6


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_traces(cotenants=True), st.sampled_from(list(POLICIES)))
def test_no_policy_beats_the_bound_where_co_tenants_gang_stages_stop_each_other(trace, policy):
    """Every job's gang stages span the node, so the critical path adds the other jobs' stages
    (rlix.job.lower_bounds); no policy may finish sooner than that."""
    metrics = replay(trace, policy)
    assert metrics.makespan_s >= metrics.makespan_lower_bound_s - 1e-6
    # at the least, each job's chain plus the model loads of the jobs arriving with it or after it
    shapes = trace.job_shapes()
    loads = [
        lower_bounds([s], trace.cluster.num_gpus)[1] + sum(o.init_s for o in shapes if o is not s and o.arrival_s >= s.arrival_s)
        for s in shapes
    ]
    assert metrics.lower_bound_critical_path_s >= max(loads) - 1e-9


def test_same_trace_and_seed_give_byte_identical_json(tmp_path):
    trace = load_trace(TRACES / "two_jobs.json")
    paths = []
    for i in range(2):
        runs = {p: replay(trace, p) for p in POLICIES}
        paths.append(tmp_path / f"run{i}.json")
        write_json(results_json("two_jobs", "two_jobs.json", trace.cluster.num_gpus, runs), paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    reseeded = [replay(trace.reseeded(7), "rlix").to_json() for _ in range(2)]
    assert reseeded[0] == reseeded[1]
    assert reseeded[0] != json.loads(paths[0].read_text())["policies"]["rlix"]


def test_rlix_beats_static_on_the_mixed_long_tail_trace():
    trace = load_trace(TRACES / "mixed_agentic.json")
    static, rlix = replay(trace, "static"), replay(trace, "rlix")
    assert rlix.trajectories_lost == 0 and static.trajectories_lost == 0
    assert rlix.throughput_steps_per_hour >= 2.0 * static.throughput_steps_per_hour
    assert rlix.idle_fraction <= 0.05
    assert rlix.gpu_utilization > static.gpu_utilization + 0.4
    assert rlix.stranded_fraction < static.stranded_fraction


def test_switch_costs_are_charged():
    raw = json.loads((TRACES / "two_jobs.json").read_text())
    cheap = json.loads(json.dumps(raw))
    for p in cheap["pipelines"]:
        p["switch"] = {"offload_s": 0, "load_s": 0, "weight_sync_s": 0, "adapter_sync_s": 0, "resume_s": 0}
    costly, free = replay(Trace(TraceModel.model_validate(raw)), "rlix"), replay(Trace(TraceModel.model_validate(cheap)), "rlix")
    assert free.switch_overhead_fraction < costly.switch_overhead_fraction
    assert free.makespan_s < costly.makespan_s
