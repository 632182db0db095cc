"""Simulator features beyond batch rollout: streaming and partial rollout, the
decode-speed curve, agentic tool segments, and the metrics that show them."""

from __future__ import annotations

import pytest

from rlix.core import POLICIES
from rlix.sim.simulator import Simulation, replay
from rlix.trace import Trace, TraceModel


def _trace(*pipelines: dict, nodes: int = 1, gpus_per_node: int = 8, scheduler: dict | None = None) -> Trace:
    raw = {"cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node}, "pipelines": list(pipelines)}
    return Trace(TraceModel.model_validate({**raw, "scheduler": scheduler} if scheduler else raw))


NO_SWITCH = {"offload_s": 0, "load_s": 0, "weight_sync_s": 0, "adapter_sync_s": 0, "resume_s": 0}


def _one_worker(steps: list[dict], *, slots: int, **extra) -> dict:
    """A job whose rollout has exactly one worker (GPU 1) and trains on GPU 0, switching free."""
    return {
        "id": "job",
        "roles": {"actor_train": {"gpus": "0"}, "actor_infer": {"gpus": "1"}},
        "slots_per_worker": slots,
        "init_s": 0,
        "switch": NO_SWITCH,
        "steps": steps,
        **extra,
    }


def _rollout_seconds(trace: Trace, policy: str = "rlix") -> list[float]:
    sim = Simulation(trace, policy)
    sim.run()
    return [r.rollout_end - r.rollout_start for r in sim.pipelines["job"].history]


# ------------------------------------------------------------------ fixes


def test_disjoint_rollout_without_home_replays_under_every_policy():
    job = {
        "id": "apart",
        "roles": {"actor_train": {"gpus": "0-3"}, "actor_infer": {"gpus": "4-7", "gpus_per_worker": 2}},
        "generate": {
            "steps": 2,
            "trajectories_per_step": 16,
            "duration": {"median_s": 5, "p99_s": 20},
            "stages": {"actor_train": 5},
        },
    }
    trace = _trace(job)
    spec = trace.spec(trace.pipelines[0])
    assert spec.home == () and spec.home_gpus == tuple(range(8))  # training GPUs hold no rollout bundle
    for policy in POLICIES:
        assert replay(trace, policy).trajectories_completed == 32


# ------------------------------------------------------------------ streaming


def _async_job(mode: str, *, partial: bool = False, staleness: int = 1) -> dict:
    """Rollout on GPUs 0-3 (128 slots), training on 4-7: 66 s of training per step (10 + 50 s work, 2 + 1 s load/offload each)."""
    return {
        "id": "async",
        "roles": {"actor_train": {"gpus": "4-7"}, "actor_infer": {"gpus": "0-3"}},
        "staleness": staleness,
        "slots_per_worker": 32,
        "init_s": 10,
        "rollout_mode": mode,
        "partial_rollout": partial,
        "switch": {"offload_s": 1, "load_s": 2, "weight_sync_s": 1, "resume_s": 0.5},
        "generate": {
            "steps": 12,
            "trajectories_per_step": 192,
            "duration": {"median_s": 30, "p99_s": 60, "max_s": 70},
            "stages": {"old_logprobs": 10, "actor_train": 50},
            "seed": 3,
        },
    }


def _steady_interval(trace: Trace, policy: str = "rlix") -> float:
    sim = Simulation(trace, policy)
    sim.run()
    ends = [r.train_end for r in sim.pipelines["async"].history]
    gaps = [b - a for a, b in zip(ends, ends[1:])][4:]  # past the warm-up
    return sum(gaps) / len(gaps)


@pytest.mark.parametrize("partial", [False, True])
def test_streaming_step_interval_is_near_the_larger_of_generation_and_training_not_their_sum(partial):
    trace = _trace(_async_job("streaming", partial=partial))
    steps = trace.streams["async"][0][1]
    generation = sum(float(s.trajectories.sum()) for s in steps) / len(steps) / 128  # seconds of one batch on 128 slots
    training = 10 + 50 + 2 * (2 + 1)
    interval = _steady_interval(trace)
    on_policy_batch = _steady_interval(_trace(_async_job("batch", staleness=0)))
    assert on_policy_batch >= 0.95 * (generation + training)  # one after the other
    assert max(generation, training) <= interval <= 1.2 * max(generation, training)
    assert interval <= 0.6 * on_policy_batch


def test_streaming_beats_batch_at_the_same_staleness_and_partial_rollout_helps():
    batch = _steady_interval(_trace(_async_job("batch")))
    streaming = _steady_interval(_trace(_async_job("streaming")))
    partial = _steady_interval(_trace(_async_job("streaming", partial=True)))
    assert partial <= streaming < batch


def test_streaming_overlaps_batches_within_the_staleness_bound():
    sim = Simulation(_trace(_async_job("streaming", staleness=2)), "rlix")
    sim.run()
    recs = sim.pipelines["async"].history
    assert any(recs[k].rollout_start < recs[k - 1].rollout_end for k in range(1, len(recs)))  # batches overlap
    for k, rec in enumerate(recs):
        assert rec.version >= k - 2


def test_partial_rollout_is_refused_without_streaming():
    with pytest.raises(ValueError, match="partial_rollout needs rollout_mode 'streaming'"):
        _trace(_async_job("batch", partial=True))


# ------------------------------------------------------------------ decode speed


def test_generation_slows_past_the_knee_and_a_straggler_speeds_up_when_alone():
    step = {"trajectories": [10, 10, 10, 10, 40]}
    flat = _rollout_seconds(_trace(_one_worker([step], slots=8)))
    curved = _rollout_seconds(_trace(_one_worker([step], slots=8, decode_speed={"knee": 4, "exponent": 1})))
    assert flat == [40.0]
    # 5 generating at 4/5 speed: the four 10 s ones end at 12.5 s; the straggler has 30 s left, alone at full speed.
    assert curved == [pytest.approx(42.5)]


def test_below_the_knee_speed_is_flat():
    step = {"trajectories": [10, 10, 10, 40]}
    assert _rollout_seconds(_trace(_one_worker([step], slots=8, decode_speed={"knee": 4, "exponent": 2}))) == [40.0]


# ------------------------------------------------------------------ agentic


def test_a_tool_call_holds_the_slot_but_no_compute():
    step = {"segments": [[5, 20, 5], [10]]}
    trace = _trace(_one_worker([step], slots=1))
    assert _rollout_seconds(trace) == [40.0]  # the second waits for the slot the first holds through its tool call
    m = replay(trace, "rlix")
    rollout_gpu = 1 / 8  # one of 8 GPUs
    assert m.gpu_utilization * m.makespan_s == pytest.approx(20 * rollout_gpu * 8 / 8)  # 20 s of generation on one GPU, over 8
    assert m.held_idle_fraction * m.makespan_s * 8 >= 20 - 1e-9  # the tool call: held, not working


def test_tool_time_does_not_slow_the_others_on_the_worker():
    step = {"segments": [[2, 10, 2], [20], [20]]}
    # knee 2: three generate at 2/3 speed until 3 s; during the 10 s tool call the other two run at full speed
    # (18 -> 8 s left at 13 s); all three at 2/3 again until the agentic one ends at 16 s (6 s left); then full: 22 s.
    curved = _rollout_seconds(_trace(_one_worker([step], slots=4, decode_speed={"knee": 2, "exponent": 1})))
    assert curved == [pytest.approx(22.0)]


def test_slot_utilization_sees_the_within_worker_tail():
    step = {"trajectories": [1] * 7 + [100]}
    m = replay(_trace(_one_worker([step], slots=8)), "rlix")
    assert m.gpu_utilization * m.makespan_s * 8 == pytest.approx(100)  # busy while any slot runs
    assert m.slot_utilization * m.makespan_s * 8 == pytest.approx((7 * 1 + 100) / 8)  # slot-seconds / slots


def test_generated_agentic_turns_keep_the_plain_generation_seconds():
    gen = {"steps": 2, "trajectories_per_step": 50, "duration": {"median_s": 20, "p99_s": 200}, "seed": 5}
    plain = _trace({"id": "job", "roles": {"actor_train": {"gpus": "0"}, "actor_infer": {"gpus": "1-7"}}, "generate": gen})
    tools = {"turns": 3, "turns_max": 6, "tool": {"median_s": 8, "p99_s": 60, "max_s": 120}, "seed": 1}
    agentic = _trace(
        {
            "id": "job",
            "roles": {"actor_train": {"gpus": "0"}, "actor_infer": {"gpus": "1-7"}},
            "generate": {**gen, "agentic": tools},
        }
    )
    for a, b in zip(plain.streams["job"][0][1], agentic.streams["job"][0][1]):
        assert b.segments is not None and all(5 <= len(s) <= 11 and len(s) % 2 == 1 for s in b.segments)
        assert b.generation_s() == pytest.approx(a.trajectories)
        assert all(max(s[1::2]) <= 120 for s in b.segments)
    assert replay(agentic, "rlix").trajectories_completed == 100


# ------------------------------------------------------------------ waiting while others hold


def test_held_gpus_while_another_job_waits_are_counted_and_rlix_lends_them():
    def job(pid: str, lo: int, n: int) -> dict:
        return {
            "id": pid,
            "roles": {"actor_train": {"gpus": f"{lo}"}, "actor_infer": {"gpus": "0-7"}},
            "home": f"{lo}-{lo + 3}",
            "slots_per_worker": 2,
            "init_s": 0,
            "switch": NO_SWITCH,
            "steps": [{"trajectories": [5.0] * n, "stages": {"actor_train": 100}}, {"trajectories": [5.0] * n}],
        }

    trace = _trace(job("small", 0, 8), job("big", 4, 64))
    static, rlix = replay(trace, "partial_overlap"), replay(trace, "rlix")
    # small's batch ends at 5 s; while it trains on GPU 0 its workers on GPUs 1-3 sit idle, and big's
    # 64 trajectories wait for its 8 slots until the last wave starts at 35 s
    assert static.held_while_waiting_gpu_s == pytest.approx(3 * 30)
    assert rlix.held_while_waiting_gpu_s < static.held_while_waiting_gpu_s


# ------------------------------------------------------------------ stage cost model


def _stage_job(cost: dict, *, steps: list[dict] | None = None, train: str = "0-3") -> dict:
    return {
        "id": "job",
        "roles": {"actor_train": {"gpus": train}, "actor_infer": {"gpus": "4-7"}},
        "init_s": 0,
        "switch": {"offload_s": 3, "load_s": 5, "weight_sync_s": 0, "resume_s": 0},
        "stage_cost": cost,
        "steps": steps or [{"trajectories": [10.0], "stages": {"old_logprobs": 20, "actor_train": 40}}],
    }


def _stages(trace: Trace) -> list[dict]:
    return [{s.value: v for s, v in step.stages.items()} for step in trace.streams["job"][0][1]]


def test_stage_seconds_scale_with_the_mapping_gpu_count():
    assert _stages(_trace(_stage_job({"reference_gpus": 2}))) == [{"old_logprobs": 10, "actor_train": 20}]  # 4 GPUs: half
    assert _stages(_trace(_stage_job({"reference_gpus": 8}, train="0-1"))) == [{"old_logprobs": 80, "actor_train": 160}]
    sub = _stages(_trace(_stage_job({"reference_gpus": 2, "gpu_exponent": 0.5})))[0]
    assert sub["actor_train"] == pytest.approx(40 / 2**0.5)
    assert _stages(_trace(_stage_job({}))) == [{"old_logprobs": 20, "actor_train": 40}]  # no model: as given


def test_stage_seconds_scale_with_the_batch_tokens():
    steps = [
        {"trajectories": [10.0, 10.0], "stages": {"actor_train": 40}},
        {"trajectories": [30.0, 30.0], "stages": {"actor_train": 40}},
    ]
    full = _stages(_trace(_stage_job({"token_fraction": 1.0}, steps=steps)))
    assert [s["actor_train"] for s in full] == [pytest.approx(20), pytest.approx(60)]  # 0.5x and 1.5x the mean step
    half = _stages(_trace(_stage_job({"token_fraction": 0.5}, steps=steps)))
    assert [s["actor_train"] for s in half] == [pytest.approx(30), pytest.approx(50)]


def test_consecutive_stages_on_the_same_gpus_share_one_load_and_offload():
    def train_span(cost: dict, **switch) -> float:
        job = _stage_job(cost)
        job["switch"].update(switch)
        sim = Simulation(_trace(job), "rlix")
        sim.run()
        rec = sim.pipelines["job"].history[0]
        return rec.train_end - rec.rollout_end

    assert train_span({}) == pytest.approx(2 * (5 + 3) + 20 + 40)
    assert train_span({"share_load": True}) == pytest.approx(5 + 20 + 40 + 3)
    # a stage's own load and offload seconds, where given, stand in for the rollout worker's
    assert train_span({}, stage_load_s=1, stage_offload_s=0.5) == pytest.approx(2 * (1 + 0.5) + 20 + 40)


def test_jobs_sharing_training_gpus_with_shared_loads_lose_nothing_under_every_policy():
    # Both train on GPU 0: between one job's two stages the other may take the GPU (it then waits for
    # the offload owed, and the first job's next stage loads again).
    def job(pid: str, arrival: float) -> dict:
        return {
            "id": pid,
            "arrival_s": arrival,
            "roles": {"actor_train": {"gpus": "0"}, "actor_infer": {"gpus": "1" if pid == "a" else "2"}},
            "init_s": 0,
            "switch": {"offload_s": 3, "load_s": 5, "weight_sync_s": 0, "resume_s": 0},
            "stage_cost": {"share_load": True},
            "steps": [{"trajectories": [10.0], "stages": {"old_logprobs": 20, "actor_train": 40}}] * 2,
        }

    trace = _trace(job("a", 0), job("b", 1))
    for policy in POLICIES:
        m = replay(trace, policy)
        assert m.trajectories_completed == 4 and m.trajectories_lost == 0


# ------------------------------------------------------------------ job queue


def _queued(arrivals: dict, **extra) -> dict:
    return {
        "id": "task",
        "roles": {"actor_train": {"gpus": "0-7"}, "actor_infer": {"gpus": "0-7"}},
        "init_s": 30,
        "switch": NO_SWITCH,
        "generate": {
            "steps": 2,
            "trajectories_per_step": 32,
            "duration": {"median_s": 5, "p99_s": 20},
            "stages": {"actor_train": 10},
        },
        "arrivals": arrivals,
        **extra,
    }


def test_poisson_arrivals_expand_into_seeded_copies():
    trace = _trace(_queued({"per_hour": 12, "count": 5, "seed": 4}, arrival_s=100))
    jobs = trace.pipelines
    assert [p.id for p in jobs] == [f"task-{k}" for k in range(5)]
    times = [p.arrival_s for p in jobs]
    assert times[0] == 100 and times == sorted(times) and len(set(times)) == 5
    assert _trace(_queued({"per_hour": 12, "count": 5, "seed": 4}, arrival_s=100)).pipelines == jobs  # same seed, same jobs
    seeds = {p.generate.seed for p in jobs}
    assert len(seeds) == 5  # the copies draw different trajectories


ONE_AT_A_TIME = {"queues": [{"name": "node", "gpus": "0-7", "max_jobs": 1}]}


def test_queued_jobs_wait_for_admission_and_the_wait_counts_in_jct():
    trace = _trace(_queued({"times_s": [0, 10]}), scheduler=ONE_AT_A_TIME)
    for policy in POLICIES:
        m = replay(trace, policy)
        first, second = m.pipelines["task-0"], m.pipelines["task-1"]
        assert first.queue_delay_s == 0
        # admitted once the first job has left: its queue holds one job at a time, under every policy
        assert second.queue_delay_s == pytest.approx(first.finish_s - 10)
        assert second.jct_s == pytest.approx(second.finish_s - 10)
        assert m.queue_delay_mean_s == pytest.approx(second.queue_delay_s / 2)
        assert m.tasks_per_hour == pytest.approx(2 * 3600 / m.makespan_s)


def test_jobs_mapped_onto_the_same_gpus_with_no_queue_are_cotenants_and_run_at_once():
    trace = _trace(_queued({"times_s": [0, 10]}))
    rlix, static = replay(trace, "rlix"), replay(trace, "static")
    second = rlix.pipelines["task-1"]
    assert second.queue_delay_s < 35  # waits at most for the first job's model load (30 s), not for the job
    assert static.pipelines["task-1"].queue_delay_s == pytest.approx(static.pipelines["task-0"].finish_s - 10)
    assert rlix.makespan_s < static.makespan_s


def test_a_queue_refuses_a_job_whose_model_memory_does_not_fit():
    small, large = (_queued({"times_s": [0]}, resident_gb=gb) for gb in (30.0, 60.0))
    trace = _trace(
        {**small, "id": "small"},
        {**large, "id": "large", "arrival_s": 5},
        scheduler={"queues": [{"name": "host", "gpus": "0-7", "max_resident_gb": 80}]},
    )
    m = replay(trace, "rlix")
    # 30 + 60 GB do not fit in 80: the large job is admitted once the small one leaves (at the next plan, 5 s at most)
    waited, left = m.pipelines["large-0"].queue_delay_s, m.pipelines["small-0"].finish_s - 5
    assert left <= waited <= left + 5


def test_arrival_copies_may_not_clash_with_other_ids():
    with pytest.raises(ValueError, match="'task-1' appears more than once"):
        _trace(_queued({"times_s": [0, 10]}), {**_queued({"times_s": [0]}), "id": "task-1", "arrivals": None})


# ------------------------------------------------------------------ priority


def _twin(pid: str, priority: int) -> dict:
    """Equal jobs on one 8-GPU node: training on 0-3 for both, rollout anywhere."""
    return {
        "id": pid,
        "roles": {"actor_train": {"gpus": "0-3"}, "actor_infer": {"gpus": "0-7"}},
        "init_s": 10,
        "switch": NO_SWITCH,
        "priority": priority,
        "generate": {
            "steps": 4,
            "trajectories_per_step": 64,
            "duration": {"median_s": 5, "p99_s": 20},
            "stages": {"actor_train": 10},
            "seed": 3,
        },
    }


def test_a_higher_priority_job_finishes_sooner_than_its_equal_twin():
    equal = replay(_trace(_twin("a", 0), _twin("b", 0)), "rlix")
    ranked = replay(_trace(_twin("a", 0), _twin("b", 1)), "rlix")
    assert ranked.pipelines["b"].jct_s < equal.pipelines["b"].jct_s
    assert ranked.pipelines["b"].jct_s < ranked.pipelines["a"].jct_s
    assert ranked.trajectories_completed == equal.trajectories_completed == 2 * 4 * 64


@pytest.mark.parametrize(
    ("start", "home_up", "other_up"),
    [({"start_s": 0.0}, 10.0, 10.0), ({"start_s": 20.0}, 20.0, 30.0), ({"start_s": 20.0, "start_later_s": 5.0}, 20.0, 15.0)],
)
def test_worker_processes_start_on_the_home_at_arrival_and_elsewhere_once_the_model_is_loaded(start, home_up, other_up):
    """With a process start-up time, no worker goes where its process is not up: those on the home
    start when the job arrives, the others once its model is loaded (as the executor does), and the
    job reports the bundles still starting, so no GPU is held waiting for a process."""
    job = {
        "id": "job",
        "roles": {"actor_train": {"gpus": "0"}, "actor_infer": {"gpus": "0-3"}},
        "home": [0, 1],
        "slots_per_worker": 1,
        "init_s": 10,
        "switch": {**NO_SWITCH, **start},
        "steps": [{"trajectories": [50.0] * 8, "stages": {"actor_train": 1}}],
    }
    sim = Simulation(_trace(job, gpus_per_node=4), "rlix", keep_segments=True)
    sim.run()
    first_busy = {}
    for g, start, _, activity, _, stage in sim.usage.segments:
        if stage == "rollout" and activity.value == "work":
            first_busy[g] = min(first_busy.get(g, start), start)
    assert first_busy == {0: home_up, 1: home_up, 2: other_up, 3: other_up}
    assert not [seg for seg in sim.usage.segments if seg[5] == "start"]  # no GPU held waiting for a process
