"""Benchmark: the executor's CPU example under each policy, in one invocation.

Runs a ``rlix-run`` config (default: ``examples/cpu_two_jobs.yaml``; also
``examples/cpu_mixed.yaml``, full finetune + multi-LoRA) under
``rlix`` and ``static`` back to back, ``--repeats`` times, and prints each
run's makespan, per-job completion time and reward (per adapter for multi-LoRA), and the control-plane
overhead and GPU utilization, then the makespan ratio (``examples/gpu_mixed.yaml``
on a GPU machine gives the GPU figures). Wall-clock figures on a shared 2-core
machine are noisy: read several repeats, not one.

    python benchmarks/bench_exec_policies.py [CONFIG] [--repeats 2] [--policy rlix --policy static]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rlix.exec import api

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "examples" / "cpu_two_jobs.yaml"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--policy", action="append", help="default: rlix and static")
    args = parser.parse_args()
    policies = args.policy or ["rlix", "static"]
    makespans: dict[str, list[float]] = {p: [] for p in policies}
    print(f"{'run':>4} {'policy':>16} {'makespan s':>11} {'gpu util':>8} {'overhead %':>10}  jobs (jct s, reward first->last)")
    for r in range(args.repeats):
        for policy in policies:
            with tempfile.TemporaryDirectory() as out:
                res = api.run(args.config, policy=policy, out_dir=out)
            m = res.metrics
            makespans[policy].append(m.makespan_s)
            jobs = []
            for pid, job in sorted(res.results.items()):
                streams = sorted({s.stream for s in job.steps})  # one per LoRA adapter; "" = full finetune
                parts = []
                for name in streams:
                    rewards = [s.mean_reward for s in job.steps if s.stream == name]
                    parts.append(f"{name + ' ' if name else ''}{rewards[0]:.2f}->{rewards[-1]:.2f}")
                jobs.append(f"{pid} {m.pipelines[pid].jct_s:.1f} ({', '.join(parts)})" if parts else pid)
            print(f"{r:>4} {policy:>16} {m.makespan_s:>11.1f} {m.gpu_utilization:>8.3f} {100 * res.control_overhead_fraction:>10.2f}  " + "; ".join(jobs), flush=True)
    if "rlix" in makespans and "static" in makespans:
        for a, b in zip(makespans["rlix"], makespans["static"]):
            print(f"static / rlix makespan: {b / a:.3f}")
        print(f"median static / rlix: {statistics.median(b / a for a, b in zip(makespans['rlix'], makespans['static'])):.3f}")


if __name__ == "__main__":
    main()
