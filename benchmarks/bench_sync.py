"""Where a weight sync's time goes on a GPU, and how fast each way of moving the bytes is.

    python benchmarks/bench_sync.py [--preset 0.5b] [--reps 3] [--json out.json]

A publisher actor (the trainer's stand-in: its own process) publishes a new version of the
model's weights every repetition, as :func:`rlix.weightsync.buckets.publish_of` does, so Ray
stores the buckets in its object store; a probe actor (a rollout worker's stand-in: one torch
thread, as workers run) holds the same model in bfloat16 on the GPU and loads each version into
it. Each way is timed on fresh versions (pages the probe has not touched yet, as in a real sync):

- ``staged-N``: :func:`~rlix.weightsync.buckets.load_into` through a
  :class:`~rlix.weightsync.buckets.PinnedStaging` whose host copy runs on N threads (what a worker
  does; N=1 is the single-threaded copy before);
- ``pageable``: each bucket's view handed to ``.to(device)`` (the driver stages it), then the
  parameter copies;
- phases of the staged copy, each alone: the copy from the object store into pinned memory (1 and
  4 threads), and the pinned host-to-device copy;

and the plain host-to-device copy speed of the same bytes (pinned and pageable, warm pages) as
the yardstick (issue target: a sync at >= 50% of the pageable figure). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ray
from bench_gpu_torch import PRESETS, h2d_speed  # model sizes; the plain copy speed, a sync's yardstick


@ray.remote(num_cpus=0)
class Publisher:
    def __init__(self, path: str):
        from rlix.exec.data.model import load_model

        self.model = load_model(path)

    def publish(self, version: int):
        from rlix.weightsync.buckets import publish_of

        return publish_of(self.model, version, "bfloat16")


@ray.remote(num_cpus=0)
class Probe:
    def __init__(self, path: str):
        import torch

        from rlix.exec.data.model import load_model

        torch.set_num_threads(1)  # as a rollout worker process runs
        self.model = load_model(path).to(torch.bfloat16).to("cuda")
        self.staging = {}

    def load(self, way: str, w) -> float:
        import torch

        from rlix.weightsync.buckets import PinnedStaging, _flat, _torch_dtype, load_into

        torch.cuda.synchronize()
        t = time.perf_counter()
        if way.startswith("staged-"):
            n = int(way.split("-")[1])
            staging = self.staging.setdefault(n, PinnedStaging(copy_threads=n))
            load_into(self.model, w, "cuda", staging)
        elif way == "pageable":
            target = self.model.state_dict()
            dt = _torch_dtype(w.dtype)
            flats = [_flat(b, dt).to("cuda") for b in w.buckets]
            with torch.no_grad():
                for s in w.slots:
                    target[s.name].copy_(flats[s.bucket][s.offset : s.offset + s.numel].view(s.shape))
        else:
            raise ValueError(way)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def phases(self, w, threads: int) -> dict:
        """The staged copy's halves alone, on fresh pages: object store -> pinned, pinned -> device."""
        import torch

        from rlix.weightsync.buckets import PinnedStaging, _flat

        staging = PinnedStaging(copy_threads=threads)
        flats = [_flat(b, torch.uint8) for b in w.buckets if b.nbytes]
        pinned = [torch.empty(f.numel(), dtype=torch.uint8, pin_memory=True) for f in flats]
        t = time.perf_counter()
        for p, f in zip(pinned, flats):
            staging._host_copy(p, f)
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev = [p.to("cuda", non_blocking=True) for p in pinned]
        torch.cuda.synchronize()
        h2d = time.perf_counter() - t
        del dev
        return {"host_copy_s": host, "pinned_h2d_s": h2d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ways", default="staged-1,staged-4,staged-8,pageable")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_sync needs a CUDA GPU")

    from rlix.exec.data.model import ModelSize, build_model

    p = PRESETS[args.preset]
    size = ModelSize(
        arch="qwen2", hidden_size=p["hidden"], num_layers=p["layers"], num_heads=p["heads"], intermediate_size=p["intermediate"]
    )
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    out: dict = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(build_model(size, Path(tmp) / "m"))
            pub, probe = Publisher.remote(path), Probe.options(num_gpus=1).remote(path)
            version = iter(range(1, 10_000))
            nbytes = ray.get(pub.publish.remote(next(version))).nbytes
            ray.get(probe.load.remote("staged-1", pub.publish.remote(next(version))))  # warm: buffers, kernels
            out["weight_bytes"] = nbytes
            for way in args.ways.split(","):
                secs = [ray.get(probe.load.remote(way, pub.publish.remote(next(version)))) for _ in range(args.reps)]
                out[f"{way}_s"] = s = statistics.median(secs)
                out[f"{way}_GBps"] = nbytes / s / 1e9
                print(f"{way:>10}: {s:.3f} s  {nbytes / s / 1e9:6.1f} GB/s", flush=True)
            for threads in (1, 4):
                ph = ray.get(probe.phases.remote(pub.publish.remote(next(version)), threads))
                out[f"host_copy_{threads}t_GBps"] = nbytes / ph["host_copy_s"] / 1e9
                out["pinned_h2d_GBps"] = nbytes / ph["pinned_h2d_s"] / 1e9
            out |= h2d_speed(nbytes)
            for way in args.ways.split(","):
                out[f"{way}_fraction_of_pageable_h2d"] = out[f"{way}_GBps"] / out["h2d_pageable_GBps"]
    finally:
        ray.shutdown()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
