"""Benchmark: simulator wall time and trajectories per second.

Replays a trace (default: the shipped large trace, 1,024 GPUs, 64 pipelines,
over a million trajectories) under each requested policy and prints wall
seconds, trajectories replayed per wall second, and plans made. Not a test.

    python benchmarks/bench_sim.py [TRACE] [--policy rlix ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix, whatever is installed

from bench_args import Parser, fail, replayable  # noqa: E402

from rlix.core import POLICIES  # noqa: E402
from rlix.sim.simulator import replay  # noqa: E402
from rlix.trace import TraceError, load_trace  # noqa: E402


def main() -> None:
    parser = Parser(prog="bench_sim", description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(ROOT / "traces" / "large.json"))
    parser.add_argument("--policy", action="append", choices=POLICIES, help="default: rlix")
    args = parser.parse_args()
    t0 = time.perf_counter()
    try:
        trace = load_trace(args.trace)
        total = trace.total_trajectories()  # expands the generated streams
    except TraceError as exc:
        fail("bench_sim", str(exc))
    replayable("bench_sim", trace, args.policy or ["rlix"])
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
