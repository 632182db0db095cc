"""Figures of the shared scheduler service on a local Ray cluster of 4 logical GPUs.

    python benchmarks/bench_service.py [--delay 20] [--steps 30]

1. Makespan of two jobs submitted by two ``rlix-run --address`` processes,
   the second ``--delay`` seconds after the first (from the first run's start
   to the last job's end), against the same two jobs run from one config, the
   second arriving as late after the run's start as the second run started.
2. ``rlix status``: the scheduler's answer (one actor call from a joined
   driver) and the whole command (a fresh process: Python, Ray connection,
   answer), while both jobs run.
3. How long a SIGKILLed submitter's GPUs take to come back.
4. How long ``rlix-run --detach`` takes to return.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from service_cluster import ServiceCluster, job, jobs_by_name, wait_for, write_config  # noqa: E402

# Every job here trains on two ranks (its whole home), as when the published figures were measured.

PROBE = """
import time, json
from rlix import protocol, transport
service = transport.find()
service.call_sync(protocol.Status())
took = []
for _ in range(40):
    t = time.perf_counter(); service.call_sync(protocol.Status()); took.append(time.perf_counter() - t); time.sleep(0.05)
print(json.dumps(took))
"""


def run_span(config: Path) -> tuple[float, float]:
    """(start, end) of an rlix-run's jobs in Unix seconds: its start and its last job's end (its makespan after it).
    Prints each job's completion time and the GPU-seconds of its model load and stages."""
    m = json.loads((config.parent / f"out_{config.stem}" / "metrics.json").read_text())
    start = m["executor"]["started_at_unix_s"]
    for name, p in sorted(m["pipelines"].items()):
        used = p["gpu_seconds_used"]
        print(f"  {config.stem}: {name} jct {p['jct_s']:.1f} s, arrived {p['arrival_s']:.1f} s, GPU-s used {used:.0f}")
    return start, start + m["makespan_s"]


def shared_run(c: ServiceCluster, tmp: Path, delay: float, steps: int) -> tuple[float, float]:
    """Two submitters ``delay`` s apart: (makespan, the second's arrival after the first's start). Nothing else runs
    meanwhile: on a 2-core machine a status command every second would itself slow the jobs."""
    assert c.rlix("scheduler", "start", "--set", "min_residency_s=2", "--set", "report_ttl_s=10").returncode == 0
    first = write_config(tmp / "first.yaml", [job("a2", "0-1", steps, ranks=2)])
    second = write_config(tmp / "second.yaml", [job("b2", "2-3", steps, ranks=2)])
    a = c.submit(first)
    time.sleep(delay)
    b = c.submit(second)
    assert a.wait() == 0 and b.wait() == 0
    (s1, e1), (s2, e2) = run_span(first), run_span(second)
    return max(e1, e2) - s1, s2 - s1


def one_config(c: ServiceCluster, tmp: Path, arrival_s: float, steps: int) -> float:
    """The same two jobs from one config (a private scheduler), the second arriving ``arrival_s`` after the run starts."""
    jobs = [job("a1", "0-1", steps, ranks=2), job("b1", "2-3", steps, ranks=2, arrival_s=arrival_s)]
    one = write_config(tmp / "one.yaml", jobs)
    res = subprocess.run(
        [sys.executable, "-m", "rlix.exec.front.cli", str(one), "--no-console"], capture_output=True, env=c.env, cwd=tmp
    )
    assert res.returncode == 0, res.stderr[-2000:]
    start, end = run_span(one)
    return end - start


def killed_submitter(c: ServiceCluster, tmp: Path) -> tuple[float, list[float], list[float]]:
    """``rlix status`` while two jobs run (the scheduler's answers, whole commands), then one submitter
    SIGKILLed: (seconds until its GPUs are back, answers, commands)."""
    keep = write_config(tmp / "keep.yaml", [job("k3", "0-1", 30, ranks=2)])
    lose = write_config(tmp / "lose.yaml", [job("l3", "2-3", 60, ranks=2)])
    k, lo = c.submit(keep), c.submit(lose)
    wait_for(lambda s: {jobs_by_name(s).get(n, {}).get("state") for n in ("k3", "l3")} == {"running"}, c, 180)
    probe = c.python(PROBE)
    calls = json.loads(probe.stdout.strip().splitlines()[-1])
    commands = [c.status()[1] for _ in range(11)]
    lo.send_signal(signal.SIGKILL)
    t = time.time()
    wait_for(lambda s: not jobs_by_name(s)["l3"]["gpus"], c, 120, every_s=0.2)
    back = time.time() - t
    assert k.wait() == 0
    return back, calls, commands


def detached(c: ServiceCluster, tmp: Path) -> float:
    """Seconds ``rlix-run --detach`` takes to return (its job submitted, ids printed); the run is then left to end."""
    away = write_config(tmp / "away.yaml", [job("d3", "0-1", 3, ranks=2)])
    cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(away), "--address", c.address, "--detach"]
    t = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, env=c.env, timeout=300, cwd=tmp)
    took = time.time() - t
    assert res.returncode == 0, res.stderr[-2000:]
    wait_for(lambda s: jobs_by_name(s).get("d3", {}).get("state") == "finished", c, 300)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=20.0, help="seconds between the two submissions")
    ap.add_argument("--steps", type=int, default=30, help="steps of each job")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        c = ServiceCluster(tmp)
        try:
            c.start()
            shared, arrival = shared_run(c, tmp, args.delay, args.steps)
            print(f"two submitters (shared service): makespan {shared:.1f} s (second run {arrival:.1f} s after the first)")
            back, calls, commands = killed_submitter(c, tmp)
            q = statistics.quantiles(calls, n=20)
            print(f"rlix status, scheduler answer: median {statistics.median(calls) * 1e3:.1f} ms, p95 {q[18] * 1e3:.1f} ms")
            print(
                f"rlix status, whole command: median {statistics.median(commands):.2f} s, max {max(commands):.2f} s "
                "(target: median < 0.5 s)"
            )
            print(f"rlix-run --detach returned after {detached(c, tmp):.1f} s (target < 10 s)")
            print(f"SIGKILLed submitter: its GPUs back after {back:.1f} s (target <= 30 s)")
        finally:
            c.stop()
        single = one_config(c, tmp, arrival, args.steps)
        print(f"one config (private scheduler, second job arriving at {arrival:.1f} s): makespan {single:.1f} s")
        print(f"  ratio shared / one config: {shared / single:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
