"""Executor layer: the scheduler service's Prometheus metrics, through Ray's metrics API.

Ray exports every ``ray.util.metrics`` metric from each node's metrics agent
in the Prometheus text format, with ``ray_`` before its name (so
``rlix_gpus_held`` is scraped as ``ray_rlix_gpus_held``). The service sets
its gauges from a status snapshot every 2 s (the liveness check's period), observes
each plan's latency, and counts preemptions as plans make them.

=========================== ============ ======================================================
metric (as exported)         tags         meaning
=========================== ============ ======================================================
ray_rlix_gpus_held           job, stage   GPUs a job (by job id) holds now for a stage (or ``rollout``)
ray_rlix_gpus_total          -            GPUs the service manages
ray_rlix_idle_gpus           -            GPUs no job holds now
ray_rlix_utilization         -            busy GPU-seconds over GPUs x seconds since the service started
ray_rlix_queue_length        -            jobs waiting to be admitted
ray_rlix_jobs                state        jobs per state (queued, loading, running, finished, ...)
ray_rlix_job_gpu_seconds     job, kind    a job's GPU-seconds: kind used, lent or borrowed
ray_rlix_preemptions_total   job          rollout workers shrunk while trajectories ran on them
ray_rlix_plan_latency_s...   -            seconds the core took per plan (a histogram)
=========================== ============ ======================================================
"""

from __future__ import annotations

from collections import Counter

from rlix.protocol import ClusterStatus

PLAN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
STATES = ("submitted", "queued", "loading", "running", "finished", "failed", "cancelled")

Sample = tuple[str, tuple[tuple[str, str], ...], float]  # (gauge, sorted tags, value)


def samples(status: ClusterStatus, before: set[tuple[str, tuple]] = frozenset()) -> list[Sample]:
    """The gauges' values in a snapshot; a (gauge, tags) series set ``before`` and absent now reads 0."""
    held: Counter = Counter()
    for row in status.jobs:
        for _, label in row.gpus:
            held[(("job", row.id), ("stage", label))] += 1
    total = status.nodes * status.gpus_per_node
    states = Counter(row.state for row in status.jobs)
    out: list[Sample] = [("rlix_gpus_held", tags, float(n)) for tags, n in sorted(held.items())]
    out += [
        ("rlix_gpus_total", (), float(total)),
        ("rlix_idle_gpus", (), float(total - sum(held.values()))),
        ("rlix_utilization", (), status.utilization),
        ("rlix_queue_length", (), float(status.queue_length)),
    ]
    out += [("rlix_jobs", (("state", s),), float(states.get(s, 0))) for s in STATES]
    for row in status.jobs:
        for kind, value in (("used", row.gpu_s), ("lent", row.lent_s), ("borrowed", row.borrowed_s)):
            out.append(("rlix_job_gpu_seconds", (("job", row.id), ("kind", kind)), value))
    now = {(name, tags) for name, tags, _ in out}
    out += [(name, tags, 0.0) for name, tags in sorted(before - now)]
    return out


class PromExport:
    """The service's metrics objects (made in the actor's process, where Ray's metrics agent collects them)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter as RayCounter
        from ray.util.metrics import Gauge, Histogram

        def gauge(name: str, text: str, *tags: str):
            return Gauge(name, description=text, tag_keys=tags)

        self.gauges = {
            "rlix_gpus_held": gauge("rlix_gpus_held", "GPUs a job holds now, by stage", "job", "stage"),
            "rlix_gpus_total": gauge("rlix_gpus_total", "GPUs the scheduler manages"),
            "rlix_idle_gpus": gauge("rlix_idle_gpus", "GPUs no job holds now"),
            "rlix_utilization": gauge("rlix_utilization", "busy GPU-seconds over GPUs x seconds since start"),
            "rlix_queue_length": gauge("rlix_queue_length", "jobs waiting to be admitted"),
            "rlix_jobs": gauge("rlix_jobs", "jobs per state", "state"),
            "rlix_job_gpu_seconds": gauge("rlix_job_gpu_seconds", "a job's GPU-seconds used, lent, borrowed", "job", "kind"),
        }
        self.preemptions = RayCounter(
            "rlix_preemptions_total", description="rollout shrinks that interrupted work", tag_keys=("job",)
        )
        self.plan_latency = Histogram(
            "rlix_plan_latency_seconds", description="seconds per core plan", boundaries=list(PLAN_BUCKETS)
        )
        self.series: set[tuple[str, tuple]] = set()

    def update(self, status: ClusterStatus) -> None:
        for name, tags, value in samples(status, self.series):
            self.gauges[name].set(value, tags=dict(tags))
            self.series.add((name, tags))

    def observe_plan(self, seconds: float) -> None:
        self.plan_latency.observe(seconds)

    def count_preemptions(self, n: int, job: str) -> None:
        if n:
            self.preemptions.inc(n, tags={"job": job})
