"""Executor layer: the scheduler service's Prometheus metrics, served by the service itself (with its status).

``rlix scheduler start --metrics-port P`` makes the service answer
``GET http://<head node>:P/metrics`` in the Prometheus text format, with plain
``ray`` (no dashboard, no Ray metrics agent); ``/status`` is ``rlix status --json``
(what the ``rlix`` tool reads without importing Ray). Each scrape reads the service's
state at that moment, the same snapshot ``rlix status`` reads, so a query of
a job's GPU-seconds gives what ``rlix status`` prints. Series are keyed by job
id; one process serves them (a restarted service takes the port over), so a
``sum by (job)`` counts each job once across restarts, and the counters and
GPU-seconds a restarted service kept (:mod:`rlix.exec.service.jobs`) go on
from where they were.

=========================== ============ ======================================================
metric                       labels       meaning
=========================== ============ ======================================================
rlix_gpus_held               job, stage   GPUs a job holds now for a stage (or ``rollout``)
rlix_gpus_total              -            GPUs the service manages
rlix_idle_gpus               -            GPUs no job holds now
rlix_utilization             -            busy GPU-seconds over GPUs x seconds since the service started
rlix_queue_length            -            jobs waiting to be admitted
rlix_jobs                    state        jobs listed per state (submitted, queued, loading, running, ...)
rlix_job_gpu_seconds         job, kind    a job's GPU-seconds: kind used, lent or borrowed
rlix_preemptions_total       job          rollout workers shrunk while trajectories ran on them
rlix_plan_latency_seconds    -            seconds the core took per plan (a histogram)
=========================== ============ ======================================================
"""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter
from collections.abc import Callable

from rlix.protocol import ClusterStatus

PLAN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
STATES = ("submitted", "queued", "loading", "running", "finished", "failed", "cancelled")
HELP = {
    "rlix_gpus_held": ("gauge", "GPUs a job holds now, by stage"),
    "rlix_gpus_total": ("gauge", "GPUs the scheduler manages"),
    "rlix_idle_gpus": ("gauge", "GPUs no job holds now"),
    "rlix_utilization": ("gauge", "busy GPU-seconds over GPUs x seconds since the scheduler started"),
    "rlix_queue_length": ("gauge", "jobs waiting to be admitted"),
    "rlix_jobs": ("gauge", "jobs listed per state (ended ones until they are forgotten)"),
    "rlix_job_gpu_seconds": ("gauge", "a job's GPU-seconds used, lent, borrowed"),
    "rlix_preemptions_total": ("counter", "rollout shrinks that interrupted work, per job"),
    "rlix_plan_latency_seconds": ("histogram", "seconds per core plan"),
}

Sample = tuple[str, tuple[tuple[str, str], ...], float]  # (metric, sorted labels, value)


def samples(status: ClusterStatus) -> list[Sample]:
    """The gauges' values in a status snapshot."""
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
    return out


class PlanLatency:
    """A histogram of the core's seconds per plan, in ``PLAN_BUCKETS``."""

    def __init__(self) -> None:
        self.counts = [0] * (len(PLAN_BUCKETS) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(PLAN_BUCKETS, seconds)] += 1
        self.sum += seconds

    def samples(self) -> list[Sample]:
        out, running = [], 0
        for bound, n in zip((*map(str, PLAN_BUCKETS), "+Inf"), self.counts):
            running += n
            out.append(("rlix_plan_latency_seconds_bucket", (("le", bound),), float(running)))
        out += [("rlix_plan_latency_seconds_sum", (), self.sum), ("rlix_plan_latency_seconds_count", (), float(running))]
        return out


def exposition(groups: list[Sample]) -> str:
    """Samples in the Prometheus text format (0.0.4), each metric under its HELP and TYPE lines."""
    lines, seen = [], set()
    for name, tags, value in groups:
        family = next((f for f in HELP if name == f or name.startswith(f + "_")), name)
        if family not in seen:
            seen.add(family)
            kind, text = HELP[family]
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in tags)
        lines.append(f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """What the service counts for Prometheus beside its status: preemptions per job, plan latency."""

    def __init__(self, preemptions: dict[str, float] | None = None) -> None:
        self.preemptions: Counter = Counter(preemptions or {})  # job id -> rollout shrinks that interrupted work
        self.plan_latency = PlanLatency()

    def text(self, status: ClusterStatus) -> str:
        counted = [("rlix_preemptions_total", (("job", job),), float(n)) for job, n in sorted(self.preemptions.items())]
        return exposition(samples(status) + counted + self.plan_latency.samples())


async def serve(port: int, pages: dict[str, Callable[[], tuple[str, str]]]) -> asyncio.AbstractServer:
    """Answer ``GET <path>`` on ``port`` (every interface; 0: any free one) with ``pages[path]()``, a
    (content type, body) pair; any other path is 404."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
            path = request.split(" ", 2)[1].split("?")[0] if request.count(" ") >= 2 else ""
            if path in pages:
                try:
                    status, (kind, text) = "200 OK", pages[path]()
                except Exception as exc:  # noqa: BLE001 -- said to the reader, as a server error
                    status, kind, text = "500 Internal Server Error", "text/plain", f"{type(exc).__name__}: {exc}\n"
            else:
                status, kind, text = "404 Not Found", "text/plain", f"rlix serves {', '.join(sorted(pages))}\n"
            body = text.encode()
            head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            writer.write(f"{head}Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host="0.0.0.0", port=port, reuse_address=True)
