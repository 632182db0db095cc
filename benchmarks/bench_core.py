"""Benchmark: policy-core decision latency as the cluster grows.

For each size (8 / 64 / 512 / 1,024 / 4,096 GPUs, one pipeline per 16 GPUs,
at least one) it registers pipelines whose rollout mappings overlap their
neighbours', fills the cluster, then times ``Scheduler.plan`` over a stream
of realistic events: demand reports from every pipeline (the control-loop
tick), a gang request that preempts rollout, and its release. Prints the
median and p99 per plan in milliseconds, wall clock and CPU time of this
thread (the CPU figure is steadier on a shared machine), and the growth
exponent of the median from 1,024 to 4,096 GPUs (time ~ GPUs ** exponent).
Not a test: figures, not verdicts.

    python benchmarks/bench_core.py [--rounds 200] [--sizes 1024,4096]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's rlix

from rlix.core import (
    ClusterSpec,
    PipelineSpec,
    Register,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    RoleSpec,
    Scheduler,
    Stage,
    WorkerLoad,
)

SIZES = (8, 64, 512, 1024, 4096)


def build(gpus: int) -> tuple[Scheduler, list[PipelineSpec]]:
    gpn = 8
    nodes = gpus // gpn
    sched = Scheduler(ClusterSpec(nodes=nodes, gpus_per_node=gpn), "rlix")
    count = max(1, gpus // 16)
    home = gpus // count
    specs = []
    for i in range(count):
        lo = i * home
        infer_lo = max(0, lo - 2 * home) // gpn * gpn
        infer_hi = min(gpus, lo + 3 * home)
        specs.append(
            PipelineSpec(
                pipeline_id=f"p{i:04d}",
                roles=(
                    RoleSpec(role=Role.ACTOR_TRAIN, gpus=tuple(range(lo, lo + max(1, home // 2)))),
                    RoleSpec(role=Role.ACTOR_INFER, gpus=tuple(range(infer_lo, infer_hi))),
                ),
                slots_per_worker=16,
                resumable=True,
            )
        )
    sched.step(0.0, [Register(spec=s) for s in specs])
    return sched, specs


def report(sched: Scheduler, spec: PipelineSpec, pending: int, busy: int) -> ReportDemand:
    loads = tuple(WorkerLoad(first_gpu=w.gpus[0], active=busy) for w in sched.workers(spec.pipeline_id))
    return ReportDemand(pipeline_id=spec.pipeline_id, pending=pending, loads=loads, batch_size=4096, backlog=8192)


def bench(gpus: int, rounds: int) -> tuple[float, float, float, float, int]:
    sched, specs = build(gpus)
    now = 1.0
    for s in specs:  # warm: everyone wants rollout
        sched.submit(report(sched, s, 2048, 0), now)
    sched.plan(now)
    samples = []
    cpu = []
    for r in range(rounds):
        now += 5.0
        phase = r % 4
        victim = specs[(r // 4) % len(specs)]  # one pipeline per 4-round cycle
        if phase == 0:  # control-loop tick: every pipeline reports, demands drift
            for i, s in enumerate(specs):
                sched.submit(report(sched, s, (2048 - 37 * r - 11 * i) % 2048, 12), now)
        elif phase == 1:
            sched.submit(RequestStage(pipeline_id=victim.pipeline_id, stage=Stage.ACTOR_TRAIN), now)
        elif phase == 2:
            sched.submit(ReleaseStage(pipeline_id=victim.pipeline_id, stage=Stage.ACTOR_TRAIN), now)
        else:
            sched.submit(report(sched, victim, 0, 1), now)  # one pipeline enters its straggler tail
        t0, c0 = time.perf_counter(), time.thread_time()
        sched.plan(now)
        samples.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    samples.sort()
    cpu.sort()
    return (
        statistics.median(samples) * 1e3,
        samples[int(0.99 * (len(samples) - 1))] * 1e3,
        statistics.median(cpu) * 1e3,
        cpu[int(0.99 * (len(cpu) - 1))] * 1e3,
        len(specs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated GPU counts")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"{'GPUs':>6} {'pipelines':>9} {'median ms':>10} {'p99 ms':>8} {'cpu median':>11} {'cpu p99':>8}")
    medians = {}
    for gpus in sizes:
        median, p99, cpu_median, cpu_p99, pipelines = bench(gpus, args.rounds)
        medians[gpus] = (median, cpu_median)
        print(f"{gpus:>6} {pipelines:>9} {median:>10.3f} {p99:>8.3f} {cpu_median:>11.3f} {cpu_p99:>8.3f}", flush=True)
    if 1024 in medians and 4096 in medians:
        wall = math.log(medians[4096][0] / medians[1024][0]) / math.log(4)
        cpu = math.log(medians[4096][1] / medians[1024][1]) / math.log(4)
        print(f"growth 1,024 -> 4,096 GPUs: median ~ GPUs^{wall:.2f} (wall), GPUs^{cpu:.2f} (cpu)")


if __name__ == "__main__":
    main()
