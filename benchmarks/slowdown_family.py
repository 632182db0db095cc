"""Worst per-job JCT rlix/static, makespan rlix/static and rlix/lower bound, per trace and redraw.

Tune on families, never one file. Not a test: figures.

    python benchmarks/slowdown_family.py ROOT two_jobs,queued_cluster s,0,1,2,3,4,5 [KNOB=VALUE ...]

ROOT is the checkout whose ``rlix`` and ``traces/`` are measured. ``s`` is the shipped trace, a
number its ``Trace.reseeded`` redraw.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench_args import Parser, knob_values


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="slowdown_family", description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the checkout to measure (its rlix and traces/)")
    parser.add_argument("traces", help="shipped trace names, comma-separated, e.g. two_jobs,queued_cluster")
    parser.add_argument("seeds", help="s (the shipped draw) and redraw seeds, comma-separated, e.g. s,0,1,2")
    parser.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="scheduler knobs over each trace's own")
    args = parser.parse_args(argv)
    if not (Path(args.root) / "rlix").is_dir():
        parser.error(f"ROOT {args.root}: no rlix package there; give a checkout of the project")
    try:
        args.seeds = [None if s == "s" else int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"SEEDS {args.seeds}: write s or whole numbers, comma-separated, e.g. s,0,1,2")
    if any(s is not None and s < 0 for s in args.seeds):
        parser.error("SEEDS: seeds are whole numbers >= 0; drop the minus sign")
    args.knobs = knob_values("slowdown_family", args.knobs)
    return args


def main(argv: list[str]) -> None:
    args = parse(argv)
    sys.path.insert(0, args.root)
    from rlix.sim.simulator import replay
    from rlix.trace import TraceError, load_trace

    try:  # every trace and the knobs are checked before the first replay
        bases = {name: load_trace(f"{args.root}/traces/{name}.json") for name in args.traces.split(",")}
        for base in bases.values():
            base.with_scheduler(args.knobs)
    except TraceError as exc:
        print(f"slowdown_family: {exc}", file=sys.stderr)
        sys.exit(2)
    for name, base in bases.items():
        for seed in args.seeds:
            t0 = time.time()
            t = base if seed is None else base.reseeded(seed)
            t = t.with_scheduler(args.knobs) if args.knobs else t
            r, s = replay(t, "rlix"), replay(t, "static")
            ratios = {p: r.pipelines[p].jct_s / s.pipelines[p].jct_s for p in r.pipelines}
            w = max(sorted(ratios), key=ratios.get)
            print(
                f"{name:<20} seed={str(seed):<4} worst {w:<16} {ratios[w]:.3f}  mk r/s {r.makespan_s / s.makespan_s:.3f}  "
                f"r/LB {r.makespan_s / r.makespan_lower_bound_s:.3f}  thr {s.makespan_s / r.makespan_s:.2f}x  "
                f"({time.time() - t0:.0f}s)",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
