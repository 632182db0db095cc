"""Sharing incentive and makespan over whole families of traces, one line per family.

Tune on families, never one file. Not a test: figures. For each family: the worst per-job JCT
``rlix``/``static`` (and how many traces exceed 1.02x), makespan against the lower bound (mean,
max) and against ``static`` (mean, max).

    python benchmarks/sharing_families.py [KNOB=VALUE ...]      e.g. home_guarantee=false

Families: redraws 0-9 of ``two_jobs``, 0-5 of ``queued_cluster`` and ``mixed_agentic``
(``Trace.reseeded``), and 40 random traces (seeds 0-39) of the family that
``tests/test_sim_fairness.py`` draws (2-4 jobs, each on a home of its own; the test checks
seeds 0-11). Every trace runs with the knobs given over its own (``home_guarantee`` on
unless they say otherwise). Run from a checkout: it imports the family from ``tests/``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's rlix, whatever is installed

from bench_args import fail, knob_values  # noqa: E402
from test_sim_fairness import random_trace  # noqa: E402  (the family the property test draws)

from rlix.sim.simulator import replay  # noqa: E402
from rlix.trace import Trace, TraceError, load_trace  # noqa: E402


def families() -> dict[str, list[Trace]]:
    shipped = {name: load_trace(ROOT / "traces" / f"{name}.json") for name in ("two_jobs", "queued_cluster", "mixed_agentic")}
    return {
        "two_jobs 0-9": [shipped["two_jobs"].reseeded(i) for i in range(10)],
        "queued_cluster 0-5": [shipped["queued_cluster"].reseeded(i) for i in range(6)],
        "mixed_agentic 0-5": [shipped["mixed_agentic"].reseeded(i) for i in range(6)],
        "random homes 0-39": [random_trace(i) for i in range(40)],
    }


def measure(trace: Trace) -> tuple[float, float, float]:
    """(worst job JCT rlix/static, makespan rlix/lower bound, makespan rlix/static)."""
    shared, alone = replay(trace, "rlix"), replay(trace, "static")
    worst = max(run.jct_s / alone.pipelines[pid].jct_s for pid, run in sorted(shared.pipelines.items()))
    return worst, shared.makespan_s / shared.makespan_lower_bound_s, shared.makespan_s / alone.makespan_s


def main(argv: list[str]) -> None:
    knobs = knob_values("sharing_families", argv)
    drawn = families()
    try:  # every trace takes the knobs (a queue's GPUs must be its cluster's), checked before any replay
        drawn = {name: [t.with_scheduler(knobs) if knobs else t for t in traces] for name, traces in drawn.items()}
    except TraceError as exc:
        _fail(str(exc))
    print(f"knobs: {knobs or 'as each trace sets them'}")
    for name, traces in drawn.items():
        t0 = time.perf_counter()
        rows = [measure(t) for t in traces]
        worst, bound, static = ([r[i] for r in rows] for i in range(3))
        over = sum(w > 1.02 for w in worst)
        print(
            f"{name:<19} worst job {max(worst):.3f} (>1.02x on {over}/{len(rows)})  "
            f"makespan/bound mean {statistics.fmean(bound):.3f} max {max(bound):.3f}  "
            f"makespan/static mean {statistics.fmean(static):.3f} max {max(static):.3f}  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


def _fail(message: str) -> NoReturn:
    fail("sharing_families", message)


if __name__ == "__main__":
    main(sys.argv[1:])
