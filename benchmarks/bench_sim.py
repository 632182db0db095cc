"""Benchmark: simulator wall time and trajectories per second.

Replays a trace (default: the shipped large trace, 1,024 GPUs, 64 pipelines,
over a million trajectories) under each requested policy and prints wall
seconds, trajectories replayed per wall second, and plans made. Not a test.

    python benchmarks/bench_sim.py [TRACE] [--policy rlix ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rlix.sim.simulator import replay
from rlix.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(ROOT / "traces" / "large.json"))
    parser.add_argument("--policy", action="append", help="default: rlix")
    args = parser.parse_args()
    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    total = trace.total_trajectories()  # expands the generated streams
    load_s = time.perf_counter() - t0
    print(
        f"{Path(args.trace).name}: {trace.cluster.num_gpus} GPUs, {len(trace.pipelines)} pipelines, {total:,} trajectories "
        f"(load + expand {load_s:.2f} s)"
    )
    print(f"{'policy':>16} {'wall s':>8} {'traj/s':>10} {'plans':>7} {'makespan s':>11} {'lost':>5}")
    for policy in args.policy or ["rlix"]:
        t0 = time.perf_counter()
        m = replay(trace, policy)
        wall = time.perf_counter() - t0
        print(
            f"{policy:>16} {wall:>8.1f} {total / wall:>10,.0f} {m.plans:>7,} {m.makespan_s:>11,.0f} {m.trajectories_lost:>5}",
            flush=True,
        )


if __name__ == "__main__":
    main()
