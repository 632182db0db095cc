"""Benchmark: what a job gains by over-reporting its demand, and what it costs the others.

Each job of a trace in turn reports ``--factor`` times its queued trajectories,
its open batch and its backlog (the running ones stay true: they sit on the
workers the scheduler gave it) while the others report the truth. Prints, per
trace, redraw and liar, the liar's JCT gain against the honest replay and the
largest JCT change of any other job, then the worst of each against the
target (a lie gains at most 2%). Not a test: figures.

    python benchmarks/overreport.py [traces/x.json ...] [--seeds s,0,1] [--factor 2]

``s`` is the shipped trace, a number its ``Trace.reseeded`` redraw.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix

from bench_args import Parser, fail, replayable  # noqa: E402

from rlix.sim.simulator import Simulation  # noqa: E402
from rlix.trace import Trace, TraceError, load_trace  # noqa: E402

TARGET = 0.02
MAX_FACTOR = 1000.0  # past it a job's report overflows the counts it scales


def jcts(trace: Trace, liar: str | None = None, factor: float = 2.0) -> dict[str, float]:
    """Each job's JCT under ``rlix``, with ``liar`` (if any) over-reporting by ``factor``."""
    sim = Simulation(trace, "rlix")
    if liar is not None:
        pipeline = sim.pipelines[liar]
        honest = pipeline.demand_report

        def inflated():
            r = honest()
            scaled = {name: int(getattr(r, name) * factor) for name in ("pending", "batch_size", "backlog")}
            return dataclasses.replace(r, **scaled)

        pipeline.demand_report = inflated  # the job's side of the protocol: what it chooses to say
    return {pid: m.jct_s for pid, m in sim.run().pipelines.items()}


def _factor(text: str) -> float:
    """``--factor``: a finite number >= 1 (below 1 a job under-reports, and at 0 it reports no work: it never ends)."""
    try:
        factor = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number; give e.g. 2") from None
    if not (math.isfinite(factor) and 1 <= factor <= MAX_FACTOR):
        raise argparse.ArgumentTypeError(f"{text}: give a number from 1 to {MAX_FACTOR:g} (a liar reports more than it has)")
    return factor


def _seeds(text: str) -> list[str]:
    """``--seeds``: ``s`` (as shipped) and whole numbers >= 0, comma-separated."""
    seeds = [s.strip() for s in text.split(",")]
    if not all(s == "s" or (s.isdecimal() and s.isascii()) for s in seeds) or len(set(seeds)) != len(seeds):
        fail("overreport", f"--seeds {text}: write s and whole numbers >= 0, comma-separated, each once, e.g. s,0,1")
    return seeds


def main() -> None:
    parser = Parser(prog="overreport", description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", default=[str(ROOT / "traces" / n) for n in ("two_jobs.json", "queued_cluster.json")])
    parser.add_argument("--seeds", default="s", help="comma-separated: s (as shipped) or redraw seeds")
    parser.add_argument("--factor", type=_factor, default=2.0, help="how many times its queue a liar reports (>= 1)")
    args = parser.parse_args()
    seeds = _seeds(args.seeds)
    try:
        bases = {path: load_trace(path) for path in args.traces}
        traces = {(path, s): base if s == "s" else base.reseeded(int(s)) for path, base in bases.items() for s in seeds}
    except TraceError as exc:
        fail("overreport", str(exc))
    for trace in traces.values():
        replayable("overreport", trace, ["rlix"])
    worst_gain = worst_change = 0.0
    print(f"{'trace':<16} {'seed':>4} {'liar':<16} {'liar gain':>9} {'others worst':>12}")
    for path in args.traces:
        for seed in seeds:
            trace = traces[(path, seed)]
            honest = jcts(trace)
            for liar in sorted(honest):
                lied = jcts(trace, liar, args.factor)
                gain = honest[liar] / lied[liar] - 1
                change = max((lied[q] / honest[q] - 1 for q in sorted(honest) if q != liar), default=0.0, key=abs)
                worst_gain, worst_change = max(worst_gain, gain), max(worst_change, change, key=abs)
                print(f"{Path(path).stem:<16} {seed:>4} {liar:<16} {gain:>+9.3f} {change:>+12.3f}", flush=True)
    verdict = "met" if worst_gain <= TARGET else "NOT met"
    print(f"worst liar gain {worst_gain:+.3f} (target <= {TARGET:+.2f}: {verdict})")
    print(f"largest JCT change of another job: {worst_change:+.3f}")


if __name__ == "__main__":
    main()
