"""Worst per-job slowdown of ``rlix`` against ``static`` on every shipped trace.

For each trace in ``traces/``, replays both policies (default knobs of the
trace) and prints, per trace, the job whose completion time grew the most
under ``rlix`` relative to its own dedicated partition, and the mean JCT of
both. Not a test: figures.

    python benchmarks/slowdown.py [traces/x.json ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix

from bench_args import fail, replayable

from rlix.sim.simulator import replay
from rlix.trace import TraceError, load_trace


def main() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print("python benchmarks/slowdown.py [traces/x.json ...]")
        return
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "traces").glob("*.json"))
    try:
        traces = {path: load_trace(path) for path in paths}  # every one read before any replay
    except TraceError as exc:
        fail("slowdown", str(exc))
    for trace in traces.values():
        replayable("slowdown", trace, ["rlix", "static"])
    print(f"{'trace':<16} {'worst job':<16} {'slowdown':>8} {'rlix jct':>9} {'static jct':>10} {'mean jct rlix/static':>21}")
    for path in paths:
        trace = traces[path]
        rlix, static = replay(trace, "rlix"), replay(trace, "static")
        ratios = {pid: rlix.pipelines[pid].jct_s / static.pipelines[pid].jct_s for pid in rlix.pipelines}
        worst = max(sorted(ratios), key=lambda pid: ratios[pid])
        print(
            f"{path.stem:<16} {worst:<16} {ratios[worst]:>7.2f}x {rlix.pipelines[worst].jct_s:>9,.0f} "
            f"{static.pipelines[worst].jct_s:>10,.0f} {_mean_jct(rlix):>10,.0f} / {_mean_jct(static):<9,.0f}",
            flush=True,
        )


def _mean_jct(run) -> float:
    """Mean job completion time of one replay, seconds."""
    return sum(p.jct_s for p in run.pipelines.values()) / len(run.pipelines)


if __name__ == "__main__":
    main()
