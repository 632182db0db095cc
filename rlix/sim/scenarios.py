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

import numpy as np

from rlix.trace import TraceModel

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
            _job(
                "rlvr-7b",
                arrival=0,
                train=(0, 7),
                infer=(0, 7),
                steps=8,
                trajectories=256,
                median_s=20,
                p99_s=200,
                max_s=400,
                typical_rollout_s=120,
                seed=seed,
            ),
        ],
    }


def two_jobs(seed: int) -> dict:
    """Two full-finetune jobs, one node each, rollout allowed on both nodes."""
    return {
        "name": "two_jobs",
        "description": "Two full-finetune RLVR jobs on two 8-GPU nodes; each trains on its own node, rollout may use both.",
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "pipelines": [
            _job(
                "math-a",
                arrival=0,
                train=(0, 7),
                infer=(0, 15),
                steps=8,
                trajectories=256,
                median_s=20,
                p99_s=200,
                max_s=400,
                typical_rollout_s=120,
                seed=seed,
            ),
            _job(
                "code-b",
                arrival=120,
                train=(8, 15),
                infer=(0, 15),
                steps=8,
                trajectories=256,
                median_s=30,
                p99_s=300,
                max_s=600,
                typical_rollout_s=180,
                seed=seed + 1,
                staleness=1,
            ),
        ],
    }


def _prompts(generate: dict, *, group: float, epoch: float) -> dict:
    """Prompt ids for a generated stream: groups of 8 (1 where 8 does not divide a step), its prompts coming
    round twice over its steps, lengths correlated within a group and across epochs (docs/lengths.md)."""
    size = 8 if generate["trajectories_per_step"] % 8 == 0 else 1
    per_step = generate["trajectories_per_step"] // size
    dataset = max(per_step, per_step * generate["steps"] // 2)
    return {"group_size": size, "dataset": dataset, "group_correlation": group, "epoch_correlation": epoch}


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
        job = _job(
            pid,
            kind=kind,
            adapters=adapters,
            arrival=arrival,
            train=(home, home + 1),
            infer=(0, 31),
            steps=steps,
            trajectories=n,
            median_s=med,
            p99_s=p99,
            max_s=cap,
            typical_rollout_s=med * 5,
            seed=seed + 17 * i,
            slots=16,
            staleness=stale,
        )
        job["home"] = _range(home, home + 3)
        for block in [job, *job.get("adapters", [])]:
            if "generate" in block:
                block["generate"]["prompts"] = _prompts(block["generate"], group=0.9, epoch=0.85)
        jobs.append(job)
    return {
        "name": "mixed_agentic",
        "description": "Agentic long-tail mix on 4x8 GPUs: 6 full-finetune and 2 multi-LoRA jobs of very different sizes "
        "arriving over 40 minutes; each owns half a node and trains on 2 of its GPUs; rollout may use the whole cluster. "
        "Each step samples 8 trajectories per prompt and each job's prompts come round twice; lengths correlate within "
        "a group (0.9) and across epochs (0.85), a reading of RhymeRL's rank stability (docs/lengths.md).",
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
            _job(
                f"job-{i:02d}",
                kind=kind,
                adapters=2,
                arrival=60.0 * i,
                train=(node0 * 8, node0 * 8 + 7),
                infer=(max(0, node0 - 6) * 8, min(128, node0 + 8) * 8 - 1),
                steps=4,
                trajectories=4096 if kind == "full_finetune" else 2048,
                median_s=20,
                p99_s=200,
                max_s=400,
                typical_rollout_s=120,
                seed=seed + i,
                slots=32,
                staleness=i % 2,
            )
        )
        jobs[-1]["home"] = _range(node0 * 8, node0 * 8 + 15)
    return {
        "name": "large",
        "description": "Scale test: 128 nodes x 8 GPUs, 64 jobs (8 multi-LoRA), 4 steps of 4,096 trajectories each; "
        "rollout mappings overlap neighbouring jobs' nodes.",
        "cluster": {"nodes": 128, "gpus_per_node": 8},
        "pipelines": jobs,
    }


# ------------------------------------------------------------------ calibrated scenarios
#
# Each cites the published figures it is fitted to. Response lengths become
# seconds of decoding at an assumed per-trajectory decode speed (DECODE_TPS).

DECODE_TPS = 60.0  # tokens per second one trajectory decodes at full speed (7B model, vLLM, batch of 64)


def _tokens_s(tokens: float) -> float:
    return round(tokens / DECODE_TPS, 1)


def verl_dapo_colocated(seed: int) -> dict:
    """verl's colocated synchronous DAPO 7B step on 128 GPUs: 356 s = 178 s generation + 54 s old log-probs + 114 s update.

    Source: verl's published DAPO 7B baseline (design brief, "Published
    figures worth knowing"). Everything is colocated on 16 nodes x 8 GPUs; a
    step rolls out 512 prompts x 16 responses with every trajectory in its own
    slot (64 TP-2 workers x 128 slots), so the rollout lasts as long as its
    slowest response: the 12K-token cap (8K + 4K overlong buffer) is reached
    at the p99, and 12,288 tokens at 69 tokens/s is the published 178 s.
    Switching is vLLM sleep-mode level 1 (wake 0.1-6 s); old log-probs and
    the update share one model load on the training GPUs.
    """
    tps = 12_288 / 178.0  # tokens/s that make the cap the published generation time
    job = {
        "id": "dapo-7b",
        "roles": {"actor_train": {"gpus": "0-127"}, "actor_infer": {"gpus": "0-127", "gpus_per_worker": 2}},
        "slots_per_worker": 128,
        "init_s": 90.0,  # cold load of a 7B model with optimizer state (30-100+ s)
        "switch": {"offload_s": 2.0, "load_s": 2.0, "weight_sync_s": 1.0, "adapter_sync_s": 0.2, "resume_s": 1.0},
        "stage_cost": {"reference_gpus": 128, "share_load": True},
        "generate": {
            "steps": 6,
            "trajectories_per_step": 512 * 16,
            "duration": {"median_s": round(1_200 / tps, 1), "p99_s": 178.0, "max_s": 178.0},
            "stages": {"old_logprobs": 54.0, "actor_train": 114.0},
            "seed": seed,
        },
    }
    return {
        "name": "verl_dapo_colocated",
        "description": "verl's colocated synchronous DAPO 7B on 128 GPUs (published step: 356 s = 178 s generation + "
        "54 s old log-probs + 114 s actor update); 12K-token cap, vLLM sleep-mode switching.",
        "cluster": {"nodes": 16, "gpus_per_node": 8},
        "pipelines": [job],
    }


def async_disaggregated(seed: int) -> dict:
    """Fully asynchronous RL: rollout and training on separate 64-GPU sets, staleness 1, streaming and partial rollout.

    Sources (design brief): verl's fully-async recipe caps responses at 28K
    tokens and runs rollout and training on disjoint GPU sets; the response
    lengths are the common lognormal (median 500 tokens, p99 5,000); the
    stage seconds are verl's DAPO 7B ones (54 s old log-probs, 114 s update on
    128 GPUs) scaled to the 64 training GPUs by the stage cost model. The same
    job in batch mode is ``rollout_mode: batch`` in the notebook's comparison.
    """
    job = {
        "id": "async-7b",
        "roles": {"actor_train": {"gpus": "64-127"}, "actor_infer": {"gpus": "0-63", "gpus_per_worker": 2}},
        "staleness": 1,
        "slots_per_worker": 128,
        "rollout_mode": "streaming",
        "partial_rollout": True,
        "init_s": 90.0,
        "switch": {"offload_s": 2.0, "load_s": 2.0, "weight_sync_s": 1.0, "adapter_sync_s": 0.2, "resume_s": 1.0},
        "stage_cost": {"reference_gpus": 128, "token_fraction": 0.5, "share_load": True},
        "generate": {
            "steps": 6,
            "trajectories_per_step": 512 * 16,
            "duration": {"median_s": _tokens_s(500), "p99_s": _tokens_s(5_000), "max_s": _tokens_s(28_000)},
            "stages": {"old_logprobs": 54.0, "actor_train": 114.0},
            "seed": seed,
        },
    }
    return {
        "name": "async_disaggregated",
        "description": "Fully asynchronous 7B job: rollout on GPUs 0-63, training on 64-127, staleness 1, streaming "
        "with partial rollout; 28K-token cap (verl fully-async), stage times from verl's DAPO 7B scaled to 64 GPUs.",
        "cluster": {"nodes": 16, "gpus_per_node": 8},
        "pipelines": [job],
    }


def agentic_swe(seed: int) -> dict:
    """Agentic SWE jobs: many turns, long tool time, about 20 minutes a step.

    Sources (design brief): agentic SWE training runs up to 100 turns per
    rollout and about 20 minutes per step (NeMo Gym case study); responses up
    to 32-64K tokens (DeepSWE). A trajectory here decodes 2K tokens median
    (p99 20K, cap 48K) over 10-100 turns, with a tool call between turns of
    5 s median (p99 60 s: test runs, builds); a tool call holds its slot and
    KV but no compute. Two jobs on 4 nodes: one on-policy in batch mode, one
    streaming with staleness 1; their rollout may use every GPU. (128
    trajectories a step keep the replay quick; the shape is what matters.)
    """
    tools = {"turns": 10, "turns_max": 100, "tool": {"median_s": 5.0, "p99_s": 60.0, "max_s": 300.0}, "seed": seed + 1}
    jobs = []
    for i, (pid, mode, stale) in enumerate((("swe-batch", "batch", 0), ("swe-stream", "streaming", 1))):
        lo = 16 * i
        jobs.append(
            {
                "id": pid,
                "arrival_s": 600.0 * i,
                "roles": {"actor_train": {"gpus": _range(lo, lo + 7)}, "actor_infer": {"gpus": "0-31", "gpus_per_worker": 2}},
                "home": _range(lo, lo + 15),
                "staleness": stale,
                "rollout_mode": mode,
                "slots_per_worker": 32,
                "init_s": 90.0,
                "switch": {"offload_s": 2.0, "load_s": 4.0, "weight_sync_s": 2.0, "adapter_sync_s": 0.2, "resume_s": 3.0},
                "decode_speed": {"knee": 16, "exponent": 0.7},
                "generate": {
                    "steps": 3,
                    "trajectories_per_step": 128,
                    "duration": {"median_s": _tokens_s(2_000), "p99_s": _tokens_s(20_000), "max_s": _tokens_s(48_000)},
                    "stages": {"old_logprobs": 60.0, "actor_train": 150.0},
                    "stage_jitter": 0.1,
                    "seed": seed + 10 * i,
                    "agentic": tools,
                },
            }
        )
    return {
        "name": "agentic_swe",
        "description": "Two agentic SWE jobs on 4x8 GPUs: 10-100 turns per trajectory, 5 s median tool calls (p99 60 s), "
        "about 20 minutes a step (NeMo Gym), 48K-token cap (DeepSWE); one batch on-policy, one streaming with staleness 1.",
        "cluster": {"nodes": 4, "gpus_per_node": 8},
        "pipelines": jobs,
    }


def queued_cluster(seed: int) -> dict:
    """A multi-tenant cluster with a job queue: small RLVR tasks arrive as a Poisson process.

    Source (design brief): the seed article's RL-aware scheduler claim,
    12 -> 47 tasks per hour and average task latency 14.5 -> 4.1 minutes on
    a shared cluster. Eight templates, one per node of 8 x 8 GPUs, each
    receive five tasks at 6 an hour (about 48 tasks an hour offered to the
    cluster); a task alone takes about 4 minutes (4 steps of 256
    trajectories, RLVR lengths: median 500 tokens, p99 5,000, 8K cap) and its
    rollout may use any GPU. A task's node is its home (a guarantee: the first
    admitted there owns it), and the node's queue admits at most 3 tasks at once.
    """
    jobs = []
    for node in range(8):
        lo = 8 * node
        job = _job(
            f"task-n{node}",
            arrival=0.0,
            train=(lo, lo + 1),
            infer=(0, 63),
            steps=4,
            trajectories=256,
            median_s=_tokens_s(500),
            p99_s=_tokens_s(5_000),
            max_s=_tokens_s(8_192),
            typical_rollout_s=_tokens_s(2_000),
            seed=seed + node,
            slots=32,
        )
        job["home"] = _range(lo, lo + 7)
        job["init_s"] = 20.0
        job["arrivals"] = {"per_hour": 6.0, "count": 5, "seed": seed * 31 + node}
        jobs.append(job)
    return {
        "name": "queued_cluster",
        "description": "Multi-tenant 8x8 GPU cluster: 40 small RLVR tasks arriving as Poisson processes (6/hour per node, "
        "about 48/hour in all), each about 4 minutes alone; calibrated by the seed article's tasks/hour and latency figures; "
        "each task's node is its home, and each node's queue admits at most 3 tasks at once.",
        "cluster": {"nodes": 8, "gpus_per_node": 8},
        "scheduler": {"queues": [{"name": f"node{n}", "gpus": _range(8 * n, 8 * n + 7), "max_jobs": 3} for n in range(8)]},
        "pipelines": jobs,
    }


def colocated_node(seed: int) -> dict:
    """RLix's own deployment: every job mapped onto the same 8-GPU node, time-shared (co-tenants).

    Four jobs of unlike sizes arrive over 15 minutes: two full-finetune RLVR jobs, an agentic job
    with a heavier tail and a multi-LoRA job with two adapters. Each maps ``actor_train`` and
    ``actor_infer`` onto GPUs 0-7 and names no home: none owns the node; a job's gang stage
    preempts whichever rollout workers it overlaps, and the rollout capacity left is shared.
    """
    specs = [
        # id, kind, arrival s, trajectories/step, steps, median s, p99 s, cap s, adapters
        ("math-a", "full_finetune", 0, 256, 6, 20, 200, 400, 0),
        ("code-b", "full_finetune", 240, 256, 5, 30, 300, 600, 0),
        ("agent-c", "full_finetune", 480, 128, 4, 60, 600, 1200, 0),
        ("lora-d", "multi_lora", 900, 128, 4, 20, 200, 400, 2),
    ]
    jobs = [
        _job(
            pid,
            kind=kind,
            adapters=adapters,
            arrival=arrival,
            train=(0, 7),
            infer=(0, 7),
            steps=steps,
            trajectories=n,
            median_s=med,
            p99_s=p99,
            max_s=cap,
            typical_rollout_s=med * 5,
            seed=seed + 13 * i,
        )
        for i, (pid, kind, arrival, n, steps, med, p99, cap, adapters) in enumerate(specs)
    ]
    return {
        "name": "colocated_node",
        "description": "RLix's deployment: 3 full-finetune jobs and a multi-LoRA job, arriving over 15 minutes, all mapped "
        "onto one 8-GPU node with no home of their own (co-tenants, time-shared).",
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "pipelines": jobs,
    }


def cotenancy_family(*, jobs: int, nodes: int, staggered: bool, seed: int) -> dict:
    """One member of the co-tenancy families: ``jobs`` jobs of unlike sizes (drawn from ``seed``)
    mapped onto the same GPUs of ``nodes`` 8-GPU nodes, arriving together or ``staggered``.

    On one node every job maps all 8 GPUs. On two, each job trains on one node (alternating; two
    jobs both train on both) and may roll out on all 16. No job names a home: all are co-tenants.
    Sizes: 128-512 trajectories a step, 3-7 steps, RLVR to agentic tails (median 10-60 s, p99 10x),
    one job in four multi-LoRA with two adapters.
    """
    rng = np.random.default_rng(seed)
    gpus = 8 * nodes
    gaps = rng.uniform(0, 400, size=jobs)  # drawn either way: together and staggered get the same jobs
    arrivals = [round(float(gaps[i]) * i, 1) if staggered else 0.0 for i in range(jobs)]
    out = []
    for i in range(jobs):
        med = float(rng.choice([10.0, 20.0, 30.0, 60.0]))
        if nodes == 1 or jobs == 2:
            train = (0, gpus - 1)
        else:
            lo = 8 * (i % nodes)
            train = (lo, lo + 7)
        kind = "multi_lora" if i % 4 == 3 else "full_finetune"
        out.append(
            _job(
                f"job{i}",
                kind=kind,
                adapters=2,
                arrival=arrivals[i],
                train=train,
                infer=(0, gpus - 1),
                steps=int(rng.integers(3, 8)),
                trajectories=int(rng.choice([128, 256, 512])),
                median_s=med,
                p99_s=10 * med,
                max_s=20 * med,
                typical_rollout_s=med * 5,
                seed=seed * 101 + i,
            )
        )
    arrive = "staggered" if staggered else "together"
    return {
        "name": f"cotenancy_{jobs}j_{nodes}n_{arrive}_s{seed}",
        "description": f"{jobs} co-tenant jobs of unlike sizes on {nodes}x8 GPUs, arriving {arrive} (seed {seed}).",
        "cluster": {"nodes": nodes, "gpus_per_node": 8},
        "pipelines": out,
    }


SCENARIOS: dict[str, Scenario] = {
    "single": single,
    "two_jobs": two_jobs,
    "mixed_agentic": mixed_agentic,
    "large": large,
    "verl_dapo_colocated": verl_dapo_colocated,
    "async_disaggregated": async_disaggregated,
    "agentic_swe": agentic_swe,
    "queued_cluster": queued_cluster,
    "colocated_node": colocated_node,
}


def build(name: str, seed: int = 0) -> TraceModel:
    raw = SCENARIOS[name](seed)
    raw = {"format": "rlix-trace", "version": 1, **raw}
    return TraceModel.model_validate(raw)
