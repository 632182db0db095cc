"""Simulator layer: named scenarios that ``rlix-sim generate`` writes as traces.

Each scenario returns a compact trace (distributions and seeds), calibrated
by published figures (design brief, "Published figures worth knowing"):

- rollout is 50-80% of a step: verl's colocated DAPO 7B baseline spends
  178 s rolling out, 54 s on old log-probs and 114 s on the actor update, so
  stages here keep roughly old-logprobs = 0.3x and actor update = 0.65x of
  the typical rollout, scaled to the job's size;
- response lengths are lognormal with p99 about 10x the median for RLVR
  (median 500 tokens, p99 5,000) and heavier for agentic rollouts (up to 20
  minutes a step), capped as real configs cap response length;
- switching: vLLM sleep-mode wake-up 0.1-6 s (level 1), cold reloads of
  30-100+ s at job start.
"""

from __future__ import annotations

from collections.abc import Callable

from rlix.sim.trace import TraceModel

Scenario = Callable[[int], dict]


def _range(lo: int, hi: int) -> str:
    """Inclusive GPU range string ``lo-hi``."""
    return f"{lo}-{hi}"


def _stages(rollout_s: float, *, ref: bool = True) -> dict[str, float]:
    stages = {"old_logprobs": round(0.30 * rollout_s, 1), "actor_train": round(0.65 * rollout_s, 1)}
    if ref:
        stages["ref_logprobs"] = round(0.20 * rollout_s, 1)
    return stages


def _job(
    pid: str,
    *,
    arrival: float,
    train: tuple[int, int],
    infer: tuple[int, int],
    steps: int,
    trajectories: int,
    median_s: float,
    p99_s: float,
    max_s: float,
    typical_rollout_s: float,
    seed: int,
    slots: int = 16,
    staleness: int = 0,
    tp: int = 1,
    kind: str = "full_finetune",
    adapters: int = 0,
) -> dict:
    gen = {
        "steps": steps,
        "trajectories_per_step": trajectories,
        "duration": {"median_s": median_s, "p99_s": p99_s, "max_s": max_s},
        "stages": _stages(typical_rollout_s),
        "stage_jitter": 0.1,
    }
    job = {
        "id": pid,
        "kind": kind,
        "arrival_s": arrival,
        "roles": {
            "actor_train": {"gpus": _range(*train), "gpus_per_worker": 1},
            "actor_infer": {"gpus": _range(*infer), "gpus_per_worker": tp},
        },
        "staleness": staleness,
        "slots_per_worker": slots,
        "init_s": 60.0,
        "switch": {"offload_s": 2.0, "load_s": 4.0, "weight_sync_s": 1.5, "adapter_sync_s": 0.2, "resume_s": 1.0},
    }
    if kind == "multi_lora":
        job["adapters"] = [{"id": f"{pid}-lora{i}", "generate": dict(gen, seed=seed * 100 + i)} for i in range(adapters)]
    else:
        job["generate"] = dict(gen, seed=seed)
    return job


def single(seed: int) -> dict:
    """One RLVR job alone on one 8-GPU node."""
    return {
        "name": "single",
        "description": "One full-finetune RLVR job alone on one 8-GPU node (no one to share with).",
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "pipelines": [
            _job("rlvr-7b", arrival=0, train=(0, 7), infer=(0, 7), steps=8, trajectories=256, median_s=20, p99_s=200,
                 max_s=400, typical_rollout_s=120, seed=seed),
        ],
    }


def two_jobs(seed: int) -> dict:
    """Two full-finetune jobs, one node each, rollout allowed on both nodes."""
    return {
        "name": "two_jobs",
        "description": "Two full-finetune RLVR jobs on two 8-GPU nodes; each trains on its own node, rollout may use both.",
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "pipelines": [
            _job("math-a", arrival=0, train=(0, 7), infer=(0, 15), steps=8, trajectories=256, median_s=20, p99_s=200,
                 max_s=400, typical_rollout_s=120, seed=seed),
            _job("code-b", arrival=120, train=(8, 15), infer=(0, 15), steps=8, trajectories=256, median_s=30, p99_s=300,
                 max_s=600, typical_rollout_s=180, seed=seed + 1, staleness=1),
        ],
    }


def mixed_agentic(seed: int) -> dict:
    """Agentic long tail on a shared 4-node cluster, jobs arriving over time.

    Eight jobs of very different sizes (agentic SWE/web jobs with 1-2K
    trajectories a step and heavy tails, RLVR math jobs, two multi-LoRA jobs)
    each own half a node and train on two of its GPUs; rollout may use the whole cluster.
    """
    specs = [
        # id, kind, arrival s, home GPU, trajectories/step, steps, median s, p99 s, cap s, adapters, staleness
        ("web-agent-a", "full_finetune", 0, 0, 6144, 4, 90, 900, 1800, 0, 0),
        ("math-rlvr-b", "full_finetune", 0, 4, 1024, 6, 20, 200, 400, 0, 1),
        ("lora-tools-c", "multi_lora", 300, 8, 512, 4, 45, 450, 900, 3, 0),
        ("swe-agent-d", "full_finetune", 600, 12, 6144, 4, 60, 600, 1200, 0, 0),
        ("math-rlvr-e", "full_finetune", 900, 16, 1024, 6, 20, 200, 400, 0, 0),
        ("lora-chat-f", "multi_lora", 1200, 20, 512, 4, 30, 300, 600, 2, 1),
        ("swe-agent-g", "full_finetune", 1800, 24, 4096, 4, 60, 600, 1200, 0, 1),
        ("code-rlvr-h", "full_finetune", 2400, 28, 1536, 5, 30, 300, 600, 0, 0),
    ]
    jobs = []
    for i, (pid, kind, arrival, home, n, steps, med, p99, cap, adapters, stale) in enumerate(specs):
        job = _job(pid, kind=kind, adapters=adapters, arrival=arrival, train=(home, home + 1), infer=(0, 31), steps=steps,
                   trajectories=n, median_s=med, p99_s=p99, max_s=cap, typical_rollout_s=med * 5,
                   seed=seed + 17 * i, slots=16, staleness=stale)
        job["home"] = _range(home, home + 3)
        jobs.append(job)
    return {
        "name": "mixed_agentic",
        "description": "Agentic long-tail mix on 4x8 GPUs: 6 full-finetune and 2 multi-LoRA jobs of very different sizes "
                       "arriving over 40 minutes; each owns half a node and trains on 2 of its GPUs; rollout may use the whole cluster.",
        "cluster": {"nodes": 4, "gpus_per_node": 8},
        "pipelines": jobs,
    }


def large(seed: int) -> dict:
    """1,024 GPUs, 64 jobs, over a million trajectories (scale test)."""
    jobs = []
    for i in range(64):
        node0 = 2 * i  # each job's home: two 8-GPU nodes
        kind = "multi_lora" if i % 8 == 7 else "full_finetune"
        jobs.append(
            _job(f"job-{i:02d}", kind=kind, adapters=2, arrival=60.0 * i, train=(node0 * 8, node0 * 8 + 7),
                 infer=(max(0, node0 - 6) * 8, min(128, node0 + 8) * 8 - 1), steps=4,
                 trajectories=4096 if kind == "full_finetune" else 2048, median_s=20, p99_s=200, max_s=400,
                 typical_rollout_s=120, seed=seed + i, slots=32, staleness=i % 2)
        )
        jobs[-1]["home"] = _range(node0 * 8, node0 * 8 + 15)
    return {
        "name": "large",
        "description": "Scale test: 128 nodes x 8 GPUs, 64 jobs (8 multi-LoRA), 4 steps of 4,096 trajectories each; "
                       "rollout mappings overlap neighbouring jobs' nodes.",
        "cluster": {"nodes": 128, "gpus_per_node": 8},
        "pipelines": jobs,
    }


SCENARIOS: dict[str, Scenario] = {"single": single, "two_jobs": two_jobs, "mixed_agentic": mixed_agentic, "large": large}


def build(name: str, seed: int = 0) -> TraceModel:
    raw = SCENARIOS[name](seed)
    raw = {"format": "rlix-trace", "version": 1, **raw}
    return TraceModel.model_validate(raw)
