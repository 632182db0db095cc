"""How much of a trace's makespan gap is the order its stragglers start in, and how much prediction wins back.

Replays a trace's redraws under ``rlix`` four times each: with every batch's
trajectories in the order they were drawn (prompt ids dropped: what the
scheduler faces without them), predicted-longest first (:mod:`rlix.lengths`,
from the trace's prompt ids; the row shows the predictor's worst rank
correlation in brackets), longest first, and shortest first. The two sorted
orders are oracles no scheduler has (they know every duration before it runs);
between them they show how far the order alone moves the makespan, against the
same lower bound. Not a test: figures.

    python benchmarks/straggler_order.py [--trace traces/mixed_agentic.json] [--seeds 0,1,2,3,4,5] [KNOB=VALUE ...]

    python benchmarks/straggler_order.py --prompts 0,0 --trace traces/agentic_swe.json   # uncorrelated lengths
    python benchmarks/straggler_order.py small_first=0 path_halving_s=50   # the makespan setting

``--prompts GROUP,EPOCH`` gives every generated stream prompt ids (groups of 8,
two epochs over the trace's steps) with those length correlations, replacing
the trace's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix

from bench_args import Parser, fail, knob_values, replayable

from rlix.sim.simulator import replay
from rlix.sim.sweep import SweepError, parse_seeds
from rlix.trace import Trace, TraceError, load_trace, parse_trace

ORDERS = ("as drawn", "predicted", "longest first", "shortest first")


def reordered(trace: Trace, order: str) -> Trace:
    """``trace`` in ``order`` (in place): prompt ids kept only for ``predicted``; the oracles sort by seconds.

    Agentic trajectories sort by their total seconds, generation and tool alike.
    ``Trace.reseeded`` builds fresh steps, so a change never reaches another replay.
    """
    if order == "predicted":
        return trace
    sign = -1.0 if order == "longest first" else 1.0
    for streams in trace.streams.values():
        for _stream_id, steps in streams:
            for step in steps:
                step.prompts = None
                if order != "as drawn":
                    step.reorder(np.argsort(sign * step.trajectories, kind="stable"))  # ties keep their drawn order
    return trace


def with_prompts(trace: Trace, group: float, epoch: float) -> Trace:
    """``trace`` with every generated stream given prompt ids: groups of 8, two epochs over its steps."""
    raw = trace.model.model_dump(exclude_none=True)
    for p in raw["pipelines"]:
        for block in [p, *p.get("adapters", [])]:
            gen = block.get("generate")
            if gen is not None:
                size = 8 if gen["trajectories_per_step"] % 8 == 0 else 1
                per_step = gen["trajectories_per_step"] // size
                dataset = max(per_step, per_step * gen["steps"] // 2)
                gen["prompts"] = dict(group_size=size, dataset=dataset, group_correlation=group, epoch_correlation=epoch)
    return parse_trace(raw, trace.source)


def main() -> None:
    parser = Parser(prog="straggler_order", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(ROOT / "traces" / "mixed_agentic.json"))
    parser.add_argument("--seeds", default="0,1,2,3,4,5", help="redraws (Trace.reseeded), comma-separated")
    parser.add_argument("--prompts", metavar="GROUP,EPOCH", help="give every generated stream prompt ids, these correlations")
    parser.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="scheduler knobs for every replay")
    args = parser.parse_args()
    knobs = knob_values("straggler_order", args.knobs)
    try:
        seeds = parse_seeds(args.seeds)
        base = load_trace(args.trace)
        base = base.with_scheduler(knobs) if knobs else base  # a bad knob fails here, before any replay
        if args.prompts is not None:
            group, epoch = (float(x) for x in args.prompts.split(","))
            base = with_prompts(base, group, epoch)
    except (SweepError, TraceError) as exc:
        _fail(str(exc))
    except ValueError:
        _fail(f"--prompts: '{args.prompts}' is not GROUP,EPOCH; write e.g. 0.9,0.85")
    for seed in seeds:
        replayable("straggler_order", base.reseeded(seed), ["rlix"])
    print(f"{Path(args.trace).name}, policy rlix, knobs {knobs or 'as shipped'}: makespan / lower bound")
    print(f"{'order':>15} {'max':>6}  " + " ".join(f"{'seed ' + str(s):>7}" for s in seeds))
    for order in ORDERS:
        ratios, ranks = [], []
        for seed in seeds:
            m = replay(reordered(base.reseeded(seed), order), "rlix")
            ratios.append(m.makespan_s / m.makespan_lower_bound_s)
            ranks += [p.length_rank_correlation for p in m.pipelines.values() if p.length_rank_correlation is not None]
        rank = f"  (rank correlation >= {min(ranks):.3f})" if ranks else ""
        print(f"{order:>15} {max(ratios):6.3f}  " + " ".join(f"{x:7.3f}" for x in ratios) + rank, flush=True)


def _fail(message: str) -> NoReturn:
    fail("straggler_order", message)


if __name__ == "__main__":
    main()
