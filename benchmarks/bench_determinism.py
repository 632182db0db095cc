"""Benchmark: byte-identical replays across fresh processes.

Replays every shipped trace (or the ones named) ``--runs`` times, each in a
fresh Python process with its own hash seed, ``--jobs`` at a time, and
prints how many distinct result files each trace gave (1 = deterministic)
with the wall time. Not a test; tests/test_sim_determinism.py runs a small
version of it.

    python benchmarks/bench_determinism.py [TRACE ...] [--runs 20] [--jobs 2] [--policy rlix ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def replay_once(trace: Path, out: Path, hash_seed: int, policies: list[str]) -> bytes:
    """Replay ``trace`` in a fresh process and return the bytes of its results JSON."""
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed))
    cmd = [sys.executable, "-m", "rlix.sim.cli", "replay", str(trace), "--quiet", "--json", str(out)]
    for p in policies:
        cmd += ["--policy", p]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    return out.read_bytes()


def distinct_results(trace: Path, runs: int, jobs: int, policies: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs) as pool:
        outs = [Path(tmp) / f"run{i}.json" for i in range(runs)]
        results = list(pool.map(lambda i: replay_once(trace, outs[i], i + 1, policies), range(runs)))
    return len({hashlib.sha256(r).hexdigest() for r in results})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="default: every trace in traces/")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time")
    parser.add_argument("--policy", action="append", default=[], help="default: every policy")
    args = parser.parse_args()
    traces = [Path(t) for t in args.traces] or sorted((ROOT / "traces").glob("*.json"))
    print(f"{'trace':>24} {'runs':>5} {'distinct':>9} {'wall s':>8}")
    for trace in traces:
        t0 = time.perf_counter()
        n = distinct_results(trace.resolve(), args.runs, args.jobs, args.policy)
        print(f"{trace.name:>24} {args.runs:>5} {n:>9} {time.perf_counter() - t0:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
