"""How much of a trace's makespan gap is the order its stragglers start in.

Replays a trace's redraws under ``rlix`` three times each: with every batch's
trajectories in the order they were drawn (what the scheduler faces: it learns a
trajectory's length only when it ends), longest first, and shortest first. The
two sorted orders are oracles no scheduler has (they know every duration before
it runs); between them they show how far the order alone moves the makespan,
against the same lower bound. Not a test: figures.

    python benchmarks/straggler_order.py [--trace traces/mixed_agentic.json] [--seeds 0,1,2,3,4,5] [KNOB=VALUE ...]

    python benchmarks/straggler_order.py small_first=0 path_halving_s=50   # the makespan setting
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix

from rlix.sim.simulator import replay
from rlix.sim.sweep import SweepError, parse_seeds
from rlix.trace import Trace, TraceError, load_trace

ORDERS = ("as drawn", "longest first", "shortest first")


def reordered(trace: Trace, order: str) -> Trace:
    """``trace`` with each step's trajectories sorted by seconds (in place; ``as drawn``: unchanged).

    Agentic trajectories sort by their total seconds, generation and tool alike.
    ``Trace.reseeded`` builds fresh steps, so a sort never reaches another replay.
    """
    if order == "as drawn":
        return trace
    sign = -1.0 if order == "longest first" else 1.0
    for streams in trace.streams.values():
        for _stream_id, steps in streams:
            for step in steps:
                idx = np.argsort(sign * step.trajectories, kind="stable")  # ties keep their drawn order
                step.trajectories = step.trajectories[idx]
                if step.segments is not None:
                    step.segments = [step.segments[i] for i in idx]
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(ROOT / "traces" / "mixed_agentic.json"))
    parser.add_argument("--seeds", default="0,1,2,3,4,5", help="redraws (Trace.reseeded), comma-separated")
    parser.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="scheduler knobs for every replay")
    args = parser.parse_args()
    bad = [kv for kv in args.knobs if "=" not in kv]
    if bad:
        _fail(f"'{bad[0]}' is not KNOB=VALUE; write e.g. small_first=0")
    knobs = dict(kv.split("=", 1) for kv in args.knobs)
    try:
        seeds = parse_seeds(args.seeds)
        base = load_trace(args.trace)
        base = base.with_scheduler(knobs) if knobs else base  # a bad knob fails here, before any replay
    except (SweepError, TraceError) as exc:
        _fail(str(exc))
    print(f"{Path(args.trace).name}, policy rlix, knobs {knobs or 'as shipped'}: makespan / lower bound")
    print(f"{'order':>15} {'max':>6}  " + " ".join(f"{'seed ' + str(s):>7}" for s in seeds))
    for order in ORDERS:
        ratios = []
        for seed in seeds:
            m = replay(reordered(base.reseeded(seed), order), "rlix")
            ratios.append(m.makespan_s / m.makespan_lower_bound_s)
        print(f"{order:>15} {max(ratios):6.3f}  " + " ".join(f"{x:7.3f}" for x in ratios), flush=True)


def _fail(message: str) -> None:
    print(f"straggler_order: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
