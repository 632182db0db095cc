"""Executor layer: the answer to ``rlix status``, read from the scheduler service's state.

A job is *queued* until it holds GPUs (its place in the queue is its model
load's place among the pending requests, then jobs claimed but not yet
registered, in claim order), *loading* from its first grant until it says
its model is loaded, then *running*, until it ends finished, failed or
cancelled.
"""

from __future__ import annotations

from rlix.core import Stage
from rlix.core.types import GangHolder
from rlix.protocol import ClusterStatus, JobRow


def held_gpus(ledger) -> dict[str, list[tuple[int, str]]]:
    """(GPU, stage or "rollout") each job holds now."""
    out: dict[str, list[tuple[int, str]]] = {}
    for g, holder in enumerate(ledger.owner):
        if holder is not None:
            label = holder.stage.value if isinstance(holder, GangHolder) else Stage.ROLLOUT.value
            out.setdefault(holder.pipeline_id, []).append((g, label))
    return out


def queue_order(service, held: dict) -> list[str]:
    """Jobs waiting to be admitted, next first: registered ones waiting for their load's GPUs, then claimed ones."""
    registered = set(service.core.pipelines())
    waiting = [pid for pid, stage in service.core.pending_requests() if stage is Stage.INIT and pid not in held]
    waiting += [pid for pid in registered if pid not in held and pid not in waiting and pid not in service.book.notes]
    waiting += [n for n in service.book.open_jobs() if n not in registered and n not in waiting]
    return waiting


def job_state(service, name: str, held: dict, queue: list[str]) -> str:
    book = service.book
    if name in book.ended:
        return book.ended[name][0]
    if name in queue:
        return "queued"
    note = book.notes.get(name)
    if note is not None and note.loaded:
        return "running"
    if name in held or note is not None:
        return "loading"
    return "queued"


def cluster_status(service, now: float) -> ClusterStatus:
    """The status snapshot of a scheduler actor (``service``) at ``now`` (its clock)."""
    held = held_gpus(service.core.ledger)
    queue = queue_order(service, held)
    usage, book = service.usage, service.book
    busy = usage.busy_gpu_s(now)  # integrated to now: the rows below read the same figures
    specs = service.specs
    names = list(dict.fromkeys([*book.claims, *specs]))
    rows = []
    for name in names:
        claim, note, spec = book.claims.get(name), book.notes.get(name), specs.get(name)
        rows.append(
            JobRow(
                name=name,
                submitter=claim.submitter if claim is not None else "client",
                state=job_state(service, name, held, queue),
                priority=spec.priority if spec is not None else claim.priority,
                tenant=spec.tenant if spec is not None else "",
                gpus=tuple(held.get(name, ())),
                steps_done=note.steps_done if note is not None else 0,
                steps_total=note.steps_total if note is not None else (claim.steps_total if claim is not None else 0),
                gpu_s=usage.used.get(name, 0.0),
                lent_s=usage.lent.get(name, 0.0),
                borrowed_s=usage.borrowed.get(name, 0.0),
                fair_s=usage.fair.get(name, 0.0),
                queue_position=queue.index(name) + 1 if name in queue else None,
                error=book.ended.get(name, ("", ""))[1],
            )
        )
    c = service.core.cluster
    span = now - usage.start  # since the service (re)started: what its figures cover
    util = busy / (c.num_gpus * span) if span > 0 else 0.0
    return ClusterStatus(
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        policy=service.core.policy.name,
        uptime_s=now,
        busy_gpu_s=busy,
        utilization=util,
        idle_fraction=1.0 - util,
        queue_length=len(queue),
        jobs=tuple(rows),
        restarts=service.restarts,
    )
