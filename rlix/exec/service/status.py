"""Executor layer: the answer to ``rlix status``, a projection of the service's books and the core's ledger.

Each job's state is its record's phase (:mod:`rlix.exec.service.jobs`); its
place in the queue is its model load's place among the pending requests,
then registered jobs holding nothing, then jobs submitted but not yet
registered, in submission order. GPU-seconds are booked by job id, so two
runs of one name are counted apart.
"""

from __future__ import annotations

from rlix.core import Stage
from rlix.core.types import GangHolder
from rlix.exec.service.jobs import JobRecord, Phase
from rlix.metrics import utilization
from rlix.protocol import ClusterStatus, JobRow


def held_gpus(ledger) -> dict[str, list[tuple[int, str]]]:
    """(GPU, stage or "rollout") each job holds now."""
    out: dict[str, list[tuple[int, str]]] = {}
    for g, holder in enumerate(ledger.owner):
        if holder is not None:
            label = holder.stage.value if isinstance(holder, GangHolder) else Stage.ROLLOUT.value
            out.setdefault(holder.pipeline_id, []).append((g, label))
    return out


def queue_order(books, core, held: dict) -> list[str]:
    """Jobs waiting to be admitted, next first: registered ones waiting for their load's GPUs (in the
    core's order), then the others registered and holding nothing, then those submitted, not yet registered."""
    jobs = books.jobs
    queued = [pid for pid, stage in core.pending_requests() if stage is Stage.INIT and pid not in held]
    for record in sorted(jobs.records.values(), key=lambda r: r.seq):
        if record.phase is Phase.QUEUED and record.name not in held and record.name not in queued:
            queued.append(record.name)
    queued += [r.name for r in sorted(jobs.records.values(), key=lambda r: r.seq) if r.phase is Phase.SUBMITTED]
    return queued


def waits_for(record: JobRecord, books, core, held: dict) -> str:
    """Why a job not yet loading waits, in a line ("" for one past that)."""
    if record.phase is Phase.SUBMITTED:
        return "its submitter prepares it (models, data) before it registers"
    if record.phase is not Phase.QUEUED:
        return ""
    refusal = core.admission_refusal(record.name)
    if refusal:
        return refusal
    spec = books.specs.get(record.name)
    if spec is None:
        return ""
    gpus = spec.init_gpus
    holders = sorted({books.jobs.id_of(p) for p, on in held.items() for g, _ in on if g in gpus and p != record.name})
    taken = f" (held by {', '.join(holders)})" if holders else ""
    return f"its model load waits for GPUs {','.join(map(str, gpus))}{taken}"


def job_row(record: JobRecord, books, core, held: dict, queue: list[str]) -> JobRow:
    """A job's row: its record, what it holds now, and its GPU-seconds (booked under its id)."""
    usage, live = books.usage, not record.ended
    spec = books.specs.get(record.name) if live else None
    note = record.note
    return JobRow(
        id=record.id,
        name=record.name,
        submitter=record.submitter or "client",
        user=record.user,
        state=record.phase.value,
        phases=tuple(record.phases),
        priority=spec.priority if spec is not None else record.priority,
        tenant=spec.tenant if spec is not None else "",
        gpus=tuple(held.get(record.name, ())) if live else (),
        steps_done=note.steps_done if note is not None else 0,
        steps_total=record.steps_total,
        gpu_s=usage.used.get(record.id, 0.0),
        lent_s=usage.lent.get(record.id, 0.0),
        borrowed_s=usage.borrowed.get(record.id, 0.0),
        fair_s=usage.fair.get(record.id, 0.0),
        queue_position=queue.index(record.name) + 1 if live and record.name in queue else None,
        error=record.error,
        reason=waits_for(record, books, core, held),
        log=record.log,
    )


def cluster_status(books, core, now: float) -> ClusterStatus:
    """The status snapshot at ``now`` (the scheduler's clock) of the service's books
    (:class:`rlix.exec.service.books.Books`) and what the core's ledger holds."""
    held = held_gpus(core.ledger)
    queue = queue_order(books, core, held)
    usage = books.usage
    busy = usage.busy_gpu_s(now)  # integrated to now: the rows below read the same figures
    rows = [job_row(r, books, core, held, queue) for r in sorted(books.jobs.records.values(), key=lambda r: r.seq)]
    c = core.cluster
    util = utilization(busy, c.num_gpus, now - usage.start)  # since the service started (its figures go on across restarts)
    return ClusterStatus(
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        policy=core.policy.name,
        uptime_s=now,
        busy_gpu_s=busy,
        utilization=util,
        idle_fraction=1.0 - util,
        queue_length=len(queue),
        jobs=tuple(rows),
        restarts=books.restarts,
        started_at=books.t0,
        forgotten_jobs=usage.forgotten_jobs,
        forgotten_gpu_s=usage.forgotten_s,
    )
