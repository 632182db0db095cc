"""Executor benchmarks: control-plane round trip, shrink/expand, weight sync.

    python benchmarks/bench_exec.py [--requests 200] [--hidden 512 --layers 8] [--json out.json]
    python benchmarks/bench_exec.py --backend vllm --preset 0.5b    # on a GPU, with vllm installed
    python benchmarks/bench_exec.py --backend vllm --hidden 256 --layers 2 --heads 4 --reps 3   # CPU build: a smoke run

- scheduler round trip: one gang request + release through the Ray scheduler
  actor (no GPU contention, so it is pure control-plane time), and one demand report;
- cold start: the worker's ``prepare`` (imports, config) *and* its first
  ``wake`` (on a GPU the vLLM engine is built there);
- shrink / expand: a rollout worker's ``sleep`` (abort + drop weights) and
  ``wake`` (re-allocate + load a new published version), as a coordinator sees them;
- weight sync: bytes per second from the trainer's published buckets (Ray
  object store) into an awake worker (``update_weights``), a new version every
  repetition (a sync that moved no bytes is not counted); on a GPU also the plain
  host-to-device copy speed of the same bytes (pinned and pageable), and the
  sync's fraction of it;
- trainer offload: a training step on the device, then an offload; on a GPU the
  memory the trainer's process still holds after it (target: at most 1 GiB).

``--preset 0.5b`` builds a random-weight Qwen2 of about 0.53B parameters
(hidden 1024, 28 layers, intermediate 4864; the character tokenizer keeps the
embeddings small, so the layers carry the parameters).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ray
from bench_gpu_torch import PRESETS, h2d_speed  # model sizes; the plain copy speed, a sync's yardstick


@ray.remote(num_cpus=0)
class _NullCoordinator:
    async def shrink(self, gpus, reason):
        return None

    async def expand(self, gpus):
        return None


def bench_scheduler(n: int) -> dict:
    from rlix import protocol
    from rlix.core import ClusterSpec, PipelineSpec, ReportDemand, Role, RoleSpec, SchedulerConfig, Stage
    from rlix.exec.service.scheduler_actor import SchedulerActor
    from rlix.transport import RayTransport

    cluster = ClusterSpec(nodes=1, gpus_per_node=4)
    sched = RayTransport(SchedulerActor.remote(cluster, "rlix", SchedulerConfig(), time.time(), 0.5))
    sched.call_sync(protocol.Start())
    spec = PipelineSpec(
        pipeline_id="p",
        roles=(RoleSpec(role=Role.ACTOR_TRAIN, gpus=(0,)), RoleSpec(role=Role.ACTOR_INFER, gpus=(0, 1, 2, 3))),
    )
    sched.call_sync(protocol.Register(spec=spec, endpoint=_NullCoordinator.remote()))
    rt, rep = [], []
    for _ in range(n):
        t = time.perf_counter()
        sched.call_sync(protocol.RequestGang(pipeline_id="p", stage=Stage.ACTOR_TRAIN))
        sched.call_sync(protocol.ReleaseGang(pipeline_id="p", stage=Stage.ACTOR_TRAIN))
        rt.append(time.perf_counter() - t)
        t = time.perf_counter()
        sched.call_sync(protocol.Report(demand=ReportDemand(pipeline_id="p", pending=0)))
        rep.append(time.perf_counter() - t)
    ray.kill(sched.actor)
    return {
        "request_release_ms_mean": 1e3 * statistics.fmean(rt),
        "request_release_ms_p50": 1e3 * statistics.median(rt),
        "request_release_ms_p99": 1e3 * sorted(rt)[int(0.99 * (len(rt) - 1))],
        "report_ms_mean": 1e3 * statistics.fmean(rep),
    }


def bench_worker(
    hidden: int,
    layers: int,
    reps: int,
    *,
    heads: int = 8,
    intermediate: int = 0,
    backend: str = "torch",
    vllm_memory: float = 0.3,
) -> dict:
    """One rollout worker: cold start (process start-up *and* the engine build with the first weights),
    then ``reps`` times shrink, expand with a new version, and an awake sync of another new version."""
    import torch

    from rlix.exec.data.model import ModelSize, build_model, load_model, param_count
    from rlix.exec.rollout.actor import RolloutWorkerActor
    from rlix.exec.rollout.torch_backend import Emulation, VllmOptions
    from rlix.weightsync.buckets import publish_of

    size = ModelSize(
        arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=intermediate or 4 * hidden
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(size, Path(tmp) / "m")
        model = load_model(path)
        params = param_count(model)
        opts = VllmOptions(gpu_memory_utilization=vllm_memory)

        def version(v: int):
            """The trainer's publish of version ``v`` (one object-store put, as a trainer's return is)."""
            return ray.put(publish_of(model, v, opts.dtype if backend == "vllm" else "bfloat16"))

        worker = RolloutWorkerActor.options(num_cpus=0, runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": "0"}}).remote(
            Emulation(), backend=backend, vllm=opts
        )
        first = version(1)
        t = time.perf_counter()
        ray.get(worker.prepare.remote(str(path)))
        prepare_s = time.perf_counter() - t
        woke = ray.get(worker.wake.remote(first))  # the engine build where it needs the device (a GPU)
        cold = time.perf_counter() - t
        expand, shrink, sync, synced = [], [], [], []
        for i in range(reps):
            t = time.perf_counter()
            ray.get(worker.sleep.remote())
            shrink.append(time.perf_counter() - t)
            ref = version(2 * i + 2)
            t = time.perf_counter()
            ray.get(worker.wake.remote(ref))
            expand.append(time.perf_counter() - t)
            ref = version(2 * i + 3)  # a new version every time: a no-op sync would read as infinitely fast
            t = time.perf_counter()
            timing = ray.get(worker.update_weights.remote(ref))
            if timing.synced_bytes:
                sync.append(time.perf_counter() - t)
                synced.append(timing.synced_bytes)
        ray.kill(worker)
    if not sync:
        raise RuntimeError("no weight sync moved any bytes: the worker refused every new version")
    out = {
        "backend": backend,
        "params": params,
        "weight_bytes": synced[0],
        "prepare_s": prepare_s,
        "cold_start_s": cold,
        "first_wake_built_engine": woke.cold,
        "expand_s_mean": statistics.fmean(expand),
        "expand_s_p50": statistics.median(expand),
        "shrink_s_mean": statistics.fmean(shrink),
        "weight_sync_s_mean": statistics.fmean(sync),
        "weight_sync_GBps": sum(synced) / sum(sync) / 1e9,
    }
    if torch.cuda.is_available():
        out |= h2d_speed(synced[0])
        out["weight_sync_fraction_of_pageable_h2d"] = out["weight_sync_GBps"] / out["h2d_pageable_GBps"]
        out["weight_sync_fraction_of_pinned_h2d"] = out["weight_sync_GBps"] / out["h2d_pinned_GBps"]
    return out


def bench_trainer(hidden: int, layers: int, *, heads: int = 8, intermediate: int = 0, reps: int = 3) -> dict:
    """A trainer rank in this process: ``reps`` times a step's old log-probs and training (policy and
    optimizer onto the device) then an offload; the device memory the process still holds after each offload (PyTorch's
    reserved blocks, and the driver's count of what left the device). On a CPU only the seconds."""
    import torch

    from rlix.exec.data.model import ModelSize, build_model
    from rlix.exec.messages import Sample
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner

    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    size = ModelSize(
        arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=intermediate or 4 * hidden
    )
    g = torch.Generator().manual_seed(0)
    prompts = [tuple(torch.randint(3, 40, (8,), generator=g).tolist()) for _ in range(8)]
    samples = [Sample(prompt_ids=p, completion_ids=tuple(range(3, 35)), advantage=(-1.0) ** i) for i, p in enumerate(prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(size, Path(tmp) / "m")
        free_before = torch.cuda.mem_get_info()[0] if cuda else 0
        learner = GrpoLearner(str(path), device, GrpoConfig(kl_coef=0.0))
        learner.offload()
        step, offload, reserved, held = [], [], [], []
        for _ in range(reps):
            t = time.perf_counter()
            old = learner.logprobs(samples)  # the step's old log-probs, then its training
            learner.train([replace(x, old_logprobs=r) for x, r in zip(samples, old)])
            step.append(time.perf_counter() - t)
            peak = torch.cuda.memory_reserved() if cuda else 0
            t = time.perf_counter()
            learner.offload()
            offload.append(time.perf_counter() - t)
            if cuda:
                reserved.append(torch.cuda.memory_reserved())
                held.append(free_before - torch.cuda.mem_get_info()[0])
        out = {"device": device, "train_step_s_mean": statistics.fmean(step), "offload_s_mean": statistics.fmean(offload)}
        if cuda:  # what a waking engine on this GPU finds taken by the offloaded trainer
            out |= {
                "reserved_while_training_GiB": peak / 2**30,
                "reserved_after_offload_GiB_max": max(reserved) / 2**30,
                "held_after_offload_GiB_max": max(held) / 2**30,
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=0, help="default: 4 x hidden")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named model size (overrides --hidden/--layers/...)")
    ap.add_argument("--backend", choices=("torch", "vllm"), default="torch")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    for key, value in PRESETS.get(args.preset, {}).items():
        setattr(args, key, value)
    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        size = {"heads": args.heads, "intermediate": args.intermediate, "backend": args.backend, "vllm_memory": args.vllm_memory}
        out = {
            "scheduler": bench_scheduler(args.requests),
            # vLLM's attention kernels want head_dim >= 32: its tiny model is wider
            "worker_tiny": bench_worker(
                *((256, 2) if args.backend == "vllm" else (64, 2)),
                args.reps,
                heads=4 if args.backend == "vllm" else 8,
                backend=args.backend,
                vllm_memory=args.vllm_memory,
            ),
            "worker": bench_worker(args.hidden, args.layers, args.reps, **size),
            "trainer": bench_trainer(args.hidden, args.layers, heads=args.heads, intermediate=args.intermediate),
        }
    finally:
        ray.shutdown()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
