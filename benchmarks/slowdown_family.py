"""Worst per-job JCT rlix/static, makespan rlix/static and rlix/lower bound, per trace and redraw.

Tune on families, never one file. Not a test: figures.

    python benchmarks/slowdown_family.py ROOT two_jobs,queued_cluster s,0,1,2,3,4,5 [KNOB=VALUE ...]

``s`` is the shipped trace, a number its ``Trace.reseeded`` redraw.
"""

import sys
import time

root = sys.argv[1]
sys.path.insert(0, root)
from rlix.sim.simulator import replay
from rlix.trace import load_trace

names = sys.argv[2].split(",")
seeds = [None if s == "s" else int(s) for s in sys.argv[3].split(",")]
knobs = dict(kv.split("=") for kv in sys.argv[4:])
for name in names:
    base = load_trace(f"{root}/traces/{name}.json")
    for seed in seeds:
        t0 = time.time()
        t = base if seed is None else base.reseeded(seed)
        t = t.with_scheduler(knobs) if knobs else t
        r, s = replay(t, "rlix"), replay(t, "static")
        ratios = {p: r.pipelines[p].jct_s / s.pipelines[p].jct_s for p in r.pipelines}
        w = max(sorted(ratios), key=ratios.get)
        row = dict(
            trace=name,
            seed=seed,
            worst=w,
            ratio=ratios[w],
            mk_rs=r.makespan_s / s.makespan_s,
            mk_lb=r.makespan_s / r.makespan_lower_bound_s,
            thr=s.makespan_s / r.makespan_s,
            t=time.time() - t0,
        )
        print(
            f"{name:<20} seed={str(seed):<4} worst {w:<16} {ratios[w]:.3f}  mk r/s {row['mk_rs']:.3f}  "
            f"r/LB {row['mk_lb']:.3f}  thr {row['thr']:.2f}x  ({row['t']:.0f}s)",
            flush=True,
        )
