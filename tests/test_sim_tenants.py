"""Tenants with shares in replays: GPU-seconds by weight under contention, a guarantee met, per-tenant accounting,
and the trace format's tenants (declared, named by pipelines, set with --set)."""

from __future__ import annotations

import pytest

from rlix.sim.simulator import Simulation
from rlix.trace import TraceError, parse_trace


def pipeline(pid: str, tenant: str, train: list[int], *, seed: int, steps: int = 3) -> dict:
    """A rollout-heavy job that trains on its own 3 GPUs and may roll out on all 12; large batches, two steps
    of staleness: it wants more rollout GPUs than it gets nearly all the time (contention, not batch tails)."""
    return {
        "id": pid,
        "tenant": tenant,
        "roles": {"actor_train": {"gpus": train}, "actor_infer": {"gpus": "0-11"}},
        "staleness": 2,
        "slots_per_worker": 8,
        "preempt": "continue",
        "init_s": 10.0,
        "generate": {
            "steps": steps,
            "trajectories_per_step": 2048,
            "duration": {"dist": "lognormal", "median_s": 20.0, "p99_s": 80.0, "max_s": 120.0},
            "stages": {"old_logprobs": 5.0, "actor_train": 10.0},
            "seed": seed,
        },
    }


def contended(tenants: list[dict], **knobs) -> dict:
    jobs = [
        pipeline("a1", "a", [0, 1, 2], seed=1),
        pipeline("a2", "a", [3, 4, 5], seed=2),
        pipeline("b1", "b", [6, 7, 8], seed=3),
        pipeline("b2", "b", [9, 10, 11], seed=4),
    ]
    return {
        "cluster": {"nodes": 1, "gpus_per_node": 12},
        "scheduler": {"tenants": tenants, "small_first": 0, "path_halving_s": 0, **knobs},
        "pipelines": jobs,
    }


def gpu_seconds_until(sim: Simulation, end: float, tenant_of: dict[str, str]) -> dict[str, float]:
    """GPU-seconds each tenant's jobs held from the start until ``end`` (s)."""
    out: dict[str, float] = {}
    for seg in sim.usage.iter_segments():
        if seg.start < end and seg.pipeline_id:
            t = tenant_of[seg.pipeline_id]
            out[t] = out.get(t, 0.0) + min(seg.end, end) - seg.start
    return out


@pytest.mark.parametrize("home_guarantee", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_tenants_weighted_two_to_one_get_gpu_seconds_two_to_one_under_contention(seed, home_guarantee):
    # Every GPU is some job's home: with home_guarantee on, the homes hold only within each tenant's
    # part (before, they split the cluster 1:1 whatever the weights).
    tenants = [{"name": "a", "weight": 2}, {"name": "b", "weight": 1}]
    trace = parse_trace(contended(tenants, home_guarantee=home_guarantee)).reseeded(seed)
    sim = Simulation(trace, "rlix", keep_segments=True)
    m = sim.run()
    contention_ends = min(p.finish_s for p in m.pipelines.values())  # every job has work until the first ends
    got = gpu_seconds_until(sim, contention_ends, {pid: p.tenant for pid, p in m.pipelines.items()})
    assert got["a"] / got["b"] == pytest.approx(2.0, rel=0.10), got
    # the run's per-tenant accounting adds up its jobs'
    assert m.tenants["a"].jobs == 2 and m.tenants["a"].gpu_seconds_used == pytest.approx(
        m.pipelines["a1"].gpu_seconds_used + m.pipelines["a2"].gpu_seconds_used
    )


def test_a_guarantee_is_met_while_its_jobs_have_demand():
    tenants = [{"name": "a", "weight": 0.05, "guarantee_gpus": 6}, {"name": "b", "weight": 1}]
    trace = parse_trace(contended(tenants))
    sim = Simulation(trace, "rlix", keep_segments=True)
    m = sim.run()
    contention_ends = min(p.finish_s for p in m.pipelines.values())
    got = gpu_seconds_until(sim, contention_ends, {pid: p.tenant for pid, p in m.pipelines.items()})
    assert got["a"] >= 0.9 * 6 * contention_ends, got  # its 6 GPUs, less the switching moments
    without = parse_trace(contended([{"name": "a", "weight": 0.05}, {"name": "b", "weight": 1}]))
    plain = Simulation(without, "rlix", keep_segments=True)
    mp = plain.run()
    ends = min(p.finish_s for p in mp.pipelines.values())
    assert gpu_seconds_until(plain, ends, {pid: p.tenant for pid, p in mp.pipelines.items()})["a"] < 0.6 * 6 * ends


def test_tenants_in_the_trace_format_and_from_the_command_line():
    raw = contended([{"name": "a"}, {"name": "b"}])
    trace = parse_trace(raw).with_scheduler({"tenants": "a:2:4:2,b:1"})
    assert [(t.name, t.weight, t.guarantee_gpus, t.borrow_limit_gpus) for t in trace.model.scheduler.to_config().tenants] == [
        ("a", 2.0, 4, 2),
        ("b", 1.0, 0, None),
    ]
    raw["pipelines"][0]["tenant"] = "nobody"
    with pytest.raises(TraceError, match=r"pipelines\[0\]\.tenant: 'nobody' is not declared in scheduler.tenants"):
        parse_trace(raw)
    with pytest.raises(TraceError, match="is not a tenant; write name:weight"):
        parse_trace(contended([{"name": "a"}, {"name": "b"}])).with_scheduler({"tenants": "a:1:2:3:4"})
