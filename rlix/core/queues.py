"""Core layer: admission limits (queues) on sets of GPUs.

Jobs whose mappings overlap are co-tenants and run at once. A job waits for
admission (its model load) only where a queue says so: the jobs touching a
queue's GPUs may hold at most ``max_jobs`` admitted jobs, and at most
``max_resident_gb`` of resident model memory, at once (Kueue's quota).
Within a queue admission is first come, first served: a job refused keeps
every later job of that queue waiting too.
"""

from __future__ import annotations

from rlix.core.ledger import Draft
from rlix.core.state import View
from rlix.core.types import PipelineSpec, QueueSpec, Stage


def queues_of(view: View, spec: PipelineSpec) -> tuple[QueueSpec, ...]:
    """The queues whose GPUs the job's gang mappings (or its home) touch, in declared order."""
    mine = set(spec.init_gpus) | set(spec.home)
    return tuple(q for q in view.config.queues if mine.intersection(q.gpus))


def refusal(view: View, draft: Draft, spec: PipelineSpec) -> str | None:
    """Why the job may not be admitted now (the first full queue, in words), or None: it may."""
    queues = queues_of(view, spec)
    if not queues:
        return None
    admitted = {e.spec.pipeline_id for e in view.active() if e.admitted}
    admitted |= {g.pipeline_id for g in draft.grants if g.stage is Stage.INIT}
    admitted.discard(spec.pipeline_id)
    for q in queues:
        members = [view.pipelines[pid].spec for pid in sorted(admitted) if q in queues_of(view, view.pipelines[pid].spec)]
        if q.max_jobs and len(members) >= q.max_jobs:
            return f"queue '{q.name}' holds {len(members)} of its {q.max_jobs} jobs"
        held = sum(m.resident_gb for m in members)
        if q.max_resident_gb and held + spec.resident_gb > q.max_resident_gb:
            return (
                f"queue '{q.name}' has {q.max_resident_gb - held:.1f} GB of resident model memory free, "
                f"the job needs {spec.resident_gb:.1f} GB"
            )
    return None
