"""What placing a job's front trajectories on the workers it has held longest does to the makespan.

Replays a trace's redraws under ``rlix`` with every job placed ``lowest_gpu`` (the default) and
``longest_held`` (:meth:`rlix.rollout_book.RolloutBook.fill_order`), under each preemption mode:
``continue`` (a shrunk worker's trajectories go on elsewhere from their progress) and ``requeue``
(they start again). Per mode and placement: the makespan over the lower bound, mean and max over the
seeds; the trajectories put back at the front of a queue (shrunk or lost workers'), summed, and for
``longest_held`` the change from ``lowest_gpu``; and how many seeds ``longest_held`` makes longer by
over 1%. Not a test: figures.

    python benchmarks/placement.py [--trace traces/mixed_agentic.json] [--seeds 0,1,2,3,4,5]

Seeds 0-5 were looked at first; 6-13 are the held-out ones (``--seeds 6,7,8,9,10,11,12,13``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix

from bench_args import Parser, replayable

from rlix.sim.simulator import Simulation
from rlix.sim.sweep import SweepError, parse_seeds
from rlix.trace import Trace, TraceError, TraceModel, load_trace

PLACEMENTS = ("lowest_gpu", "longest_held")
MODES = ("continue", "requeue")


def placed(trace: Trace, preempt: str, placement: str) -> Trace:
    """``trace`` with every job preempted and placed so."""
    raw = trace.model.model_dump(exclude_none=True)
    for p in raw["pipelines"]:
        p["preempt"], p["placement"] = preempt, placement
    return Trace(TraceModel.model_validate(raw), trace.source)


def measure(trace: Trace) -> tuple[float, int]:
    """(makespan over the lower bound, trajectories put back) of one replay under ``rlix``."""
    sim = Simulation(trace, "rlix")
    m = sim.run()
    return m.makespan_s / m.makespan_lower_bound_s, sum(p.engine.book.requeued for p in sim.pipelines.values())


def _change(put_back: int, shipped_back: int) -> str:
    """The change in trajectories put back against the shipped placement ("-" where that put none back)."""
    return f"{put_back / shipped_back - 1:+.1%}" if shipped_back else ("-" if not put_back else f"+{put_back}")


def main() -> int:
    ap = Parser(prog="placement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(ROOT / "traces" / "mixed_agentic.json"))
    ap.add_argument("--seeds", default="0,1,2,3,4,5", help="redraws of the trace, comma-separated")
    args = ap.parse_args()
    try:
        base = load_trace(args.trace)
        seeds = parse_seeds(args.seeds)
    except (TraceError, SweepError) as exc:
        print(f"placement: {exc}", file=sys.stderr)
        return 2
    for seed in seeds:
        replayable("placement", base.reseeded(seed), ["rlix"])
    print(f"{Path(args.trace).stem}, seeds {args.seeds}: makespan over the lower bound under rlix")
    print(f"{'preempt':<9} {'placement':<13} {'mean':>7} {'max':>7} {'put back':>9} {'change':>7} {'worse >1%':>9}")
    for mode in MODES:
        runs = {p: [] for p in PLACEMENTS}
        for seed in seeds:
            redraw = base.reseeded(seed)
            for placement in PLACEMENTS:
                runs[placement].append(measure(placed(redraw, mode, placement)))
        shipped = runs["lowest_gpu"]
        shipped_back = sum(n for _, n in shipped)
        for placement in PLACEMENTS:
            ratios = [r for r, _ in runs[placement]]
            worse = sum(r > s * 1.01 for (r, _), (s, _) in zip(runs[placement], shipped))
            put_back = sum(n for _, n in runs[placement])
            change, worse_txt = ("", "") if placement == "lowest_gpu" else (_change(put_back, shipped_back), str(worse))
            print(
                f"{mode:<9} {placement:<13} {statistics.fmean(ratios):>7.4f} {max(ratios):>7.4f} {put_back:>9,} "
                f"{change:>7} {worse_txt:>9}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
