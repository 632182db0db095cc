"""Co-tenancy over families of traces: jobs mapped onto the same GPUs, one line per family.

Not a test: figures. Each family is 2, 4 or 8 jobs of unlike sizes on one or two 8-GPU nodes,
arriving together or staggered, every job mapped onto the same GPUs with no home of its own
(:func:`rlix.sim.scenarios.cotenancy_family`), plus the shipped ``traces/colocated_node.json``
and its redraws. Per family, over its seeds: ``rlix`` makespan against the lower bound and
against ``static`` (mean, max), and fairness: each trace's worst slowdown (JCT over the job's
JCT replayed alone) over the mean slowdown of its jobs (max), the mean slowdown, and how many
traces have a bound set by one job's chain of steps rather than by the work. Targets:
makespan <= 1.15x the bound and <= 0.65x ``static``; worst slowdown <= 1.25x the mean.

``floor`` is the lower bound over ``static``'s makespan (max over the seeds): no policy finishes a
trace sooner than its bound, so no policy beats ``static`` by more than this. Where it is above
0.65, the ``static`` target cannot be met on that trace by any policy: a small job beside a large
one, whose chain of steps is the bound, leaves ``static`` little to lose by running them in turn.

``alone`` is each job replayed under ``rlix`` with the cluster to itself, its makespan over its own
bound, both from its arrival (mean over the jobs, max): what the bound leaves out that a job pays
with nobody to share with (switching, trajectories started in the order drawn). On the one-node
families and ``colocated_node`` (seeds 0-3, 2026-12-06) a job alone under ``static`` has the same
makespan as under ``rlix`` to the microsecond.

    python benchmarks/cotenancy.py [--seeds 0,1,2,3] [KNOB=VALUE ...]

Tune on seeds 0-3; seeds 4-7 are the held-out ones (``--seeds 4-7``).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix, whatever is installed

from bench_args import Parser, fail, knob_values

from rlix.metrics import RunMetrics
from rlix.sim.alone import alone_runs, slowdowns
from rlix.sim.scenarios import cotenancy_family
from rlix.sim.simulator import replay
from rlix.sim.sweep import SweepError, parse_seeds
from rlix.trace import Trace, TraceError, TraceModel, load_trace

STATIC_TARGET = 0.65
SHAPES = [(jobs, nodes, staggered) for jobs in (2, 4, 8) for nodes in (1, 2) for staggered in (False, True)]


def families(seeds: list[int]) -> dict[str, list[Trace]]:
    out = {}
    for jobs, nodes, staggered in SHAPES:
        name = f"{jobs} jobs, {nodes} node{'s' if nodes > 1 else ''}, {'staggered' if staggered else 'together'}"
        out[name] = [
            Trace(TraceModel.model_validate({"format": "rlix-trace", "version": 1, **raw}), raw["name"])
            for raw in (cotenancy_family(jobs=jobs, nodes=nodes, staggered=staggered, seed=s) for s in seeds)
        ]
    shipped = load_trace(ROOT / "traces" / "colocated_node.json")
    out["colocated_node"] = [shipped if s == 0 else shipped.reseeded(s) for s in seeds]
    return out


def measure(trace: Trace) -> tuple[float, float, float, float, bool, float, float, float]:
    """(makespan rlix/lower bound, makespan rlix/static, worst slowdown / mean slowdown, mean slowdown,
    whether the bound is one job's chain of steps rather than the work, lower bound/static, and the
    mean and the largest over its jobs of a job's makespan alone over its own bound, from its arrival)."""
    shared, static = replay(trace, "rlix"), replay(trace, "static")
    runs = alone_runs(trace, "rlix")
    slow = slowdowns(shared, {pid: run.pipelines[pid].jct_s for pid, run in runs.items()})
    mean = statistics.fmean(slow.values())
    path_bound = shared.lower_bound_critical_path_s >= shared.lower_bound_work_s
    slack = [_from_arrival(run, run.pipelines[pid].arrival_s) for pid, run in runs.items()]
    return (
        shared.makespan_s / shared.makespan_lower_bound_s,
        shared.makespan_s / static.makespan_s,
        max(slow.values()) / mean,
        mean,
        path_bound,
        shared.makespan_lower_bound_s / static.makespan_s,
        statistics.fmean(slack),
        max(slack),
    )


def _from_arrival(run: RunMetrics, arrival_s: float) -> float:
    """A lone job's makespan over its bound, both counted from its arrival."""
    return (run.makespan_s - arrival_s) / (run.makespan_lower_bound_s - arrival_s)


def main(argv: list[str]) -> None:
    parser = Parser(prog="cotenancy", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-3", help="seeds of every family, e.g. 0-3 (tuning) or 4-7 (held out)")
    parser.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="scheduler knobs for every replay")
    args = parser.parse_intermixed_args(argv)
    knobs = knob_values("cotenancy", args.knobs)
    try:
        seeds = [int(s) for s in parse_seeds(args.seeds)]
    except SweepError as exc:
        _fail(str(exc))
    drawn = families(seeds)
    try:
        drawn = {name: [t.with_scheduler(knobs) for t in traces] for name, traces in drawn.items()}
    except TraceError as exc:
        _fail(str(exc))
    print(f"seeds {seeds}; knobs: {knobs or 'defaults'}")
    print(
        f"{'family':<30} {'bound mean':>10} {'max':>6} {'static mean':>11} {'max':>6} {'unfair max':>10} "
        f"{'slowdown':>8} {'path':>4} {'floor':>6} {'alone mean':>10} {'max':>6} {'s':>5}"
    )
    worst = [0.0, 0.0, 0.0]
    beyond = []  # rlix's makespan over the bound, on the traces whose floor is above the static target
    for name, traces in drawn.items():
        start = time.perf_counter()
        rows = [measure(t) for t in traces]
        cols = list(zip(*rows))
        worst = [max(w, max(c)) for w, c in zip(worst, cols)]
        beyond += [bound for bound, floor in zip(cols[0], cols[5]) if floor > STATIC_TARGET]
        print(
            f"{name:<30} {statistics.fmean(cols[0]):>9.3f}x {max(cols[0]):>5.3f}x {statistics.fmean(cols[1]):>10.3f}x "
            f"{max(cols[1]):>5.3f}x {max(cols[2]):>9.3f}x {statistics.fmean(cols[3]):>7.2f}x {sum(cols[4]):>4} "
            f"{max(cols[5]):>5.3f}x {statistics.fmean(cols[6]):>9.3f}x {max(cols[7]):>5.3f}x {time.perf_counter() - start:>5.1f}",
            flush=True,
        )
    print(f"{'worst of all':<30} {'':>10} {worst[0]:>5.3f}x {'':>11} {worst[1]:>5.3f}x {worst[2]:>9.3f}x")
    print(f"targets: bound <= 1.15x, static <= {STATIC_TARGET}x, unfair <= 1.25x")
    print("slowdown: the mean job slowdown against running alone; path: traces whose bound is one job's chain of steps")
    print(
        f"floor: the bound over static, the best any policy can do against static (max); {len(beyond)} of "
        f"{sum(len(t) for t in drawn.values())} traces have it above {STATIC_TARGET}x"
        + (
            f" (there rlix is {min(beyond):.3f}-{max(beyond):.3f}x the bound, mean {statistics.fmean(beyond):.3f}x)"
            if beyond
            else ""
        )
    )
    print(
        "alone: each job replayed alone, its makespan over its own bound from its arrival (mean over the jobs, max):\n"
        "what the bound leaves out that a job pays with the cluster to itself (switching, trajectories in the order drawn)"
    )


def _fail(message: str) -> NoReturn:
    fail("cotenancy", message)


if __name__ == "__main__":
    main(sys.argv[1:])
