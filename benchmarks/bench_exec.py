"""Executor benchmarks (CPU is fine): control-plane round trip, shrink/expand, weight sync.

    python benchmarks/bench_exec.py [--requests 200] [--hidden 512 --layers 8] [--json out.json]

- scheduler round trip: one gang request + release through the Ray scheduler
  actor (no GPU contention, so it is pure control-plane time), and one demand report;
- shrink / expand: a rollout worker's ``sleep`` (abort + drop weights) and
  ``wake`` (re-allocate + load the newest CPU snapshot), as a coordinator sees them;
- weight sync: bytes per second from the trainer's CPU cache (Ray object store)
  into an awake worker (``update_weights``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=0)
class _NullCoordinator:
    async def shrink(self, gpus, reason):
        return None

    async def expand(self, gpus):
        return None


def bench_scheduler(n: int) -> dict:
    from rlix.core import ClusterSpec, PipelineSpec, ReportDemand, Role, RoleSpec, SchedulerConfig, Stage
    from rlix.exec.scheduler_actor import SchedulerActor

    cluster = ClusterSpec(nodes=1, gpus_per_node=4)
    sched = SchedulerActor.remote(cluster, "rlix", SchedulerConfig(), time.time(), 0.5)
    ray.get(sched.start.remote())
    spec = PipelineSpec(
        pipeline_id="p",
        roles=(RoleSpec(role=Role.ACTOR_TRAIN, gpus=(0,)), RoleSpec(role=Role.ACTOR_INFER, gpus=(0, 1, 2, 3))),
    )
    ray.get(sched.register.remote(spec, _NullCoordinator.remote()))
    rt, rep = [], []
    for _ in range(n):
        t = time.perf_counter()
        ray.get(sched.request.remote("p", Stage.ACTOR_TRAIN))
        ray.get(sched.release.remote("p", Stage.ACTOR_TRAIN))
        rt.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get(sched.report.remote(ReportDemand(pipeline_id="p", pending=0)))
        rep.append(time.perf_counter() - t)
    ray.kill(sched)
    return {
        "request_release_ms_mean": 1e3 * statistics.fmean(rt),
        "request_release_ms_p50": 1e3 * statistics.median(rt),
        "request_release_ms_p99": 1e3 * sorted(rt)[int(0.99 * (len(rt) - 1))],
        "report_ms_mean": 1e3 * statistics.fmean(rep),
    }


def bench_worker(hidden: int, layers: int, reps: int) -> dict:
    import torch

    from rlix.exec.model import ModelSize, build_model, load_model, param_count
    from rlix.exec.rollout import Emulation
    from rlix.exec.weights import snapshot_of
    from rlix.exec.workers import RolloutWorkerActor

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(ModelSize(arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=8, intermediate_size=4 * hidden), Path(tmp) / "m")
        model = load_model(path)
        params = param_count(model)
        snaps = [snapshot_of(model, v) for v in (1, 2)]
        refs = [ray.put(s) for s in snaps]
        nbytes = snaps[0].nbytes
        worker = RolloutWorkerActor.options(num_cpus=0, runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": "0"}}).remote(Emulation())
        t = time.perf_counter()
        ray.get(worker.prepare.remote(str(path)))
        cold = time.perf_counter() - t
        expand, shrink, sync = [], [], []
        for i in range(reps):
            t = time.perf_counter()
            ray.get(worker.wake.remote(refs[i % 2]))
            expand.append(time.perf_counter() - t)
            t = time.perf_counter()
            ray.get(worker.update_weights.remote(refs[(i + 1) % 2]))
            sync.append(time.perf_counter() - t)
            t = time.perf_counter()
            ray.get(worker.sleep.remote())
            shrink.append(time.perf_counter() - t)
        ray.kill(worker)
        del torch
    return {
        "params": params,
        "weight_bytes": nbytes,
        "cold_start_s": cold,
        "expand_s_mean": statistics.fmean(expand),
        "expand_s_p50": statistics.median(expand),
        "shrink_s_mean": statistics.fmean(shrink),
        "weight_sync_s_mean": statistics.fmean(sync),
        "weight_sync_GBps": nbytes / statistics.fmean(sync) / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        out = {"scheduler": bench_scheduler(args.requests), "worker_tiny": bench_worker(64, 2, args.reps), "worker": bench_worker(args.hidden, args.layers, args.reps)}
    finally:
        ray.shutdown()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
