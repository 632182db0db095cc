"""Core layer: admission limits (queues) on sets of GPUs.

Jobs whose mappings overlap are co-tenants and run at once. A job waits for
admission (its model load) only where a queue says so: the jobs touching a
queue's GPUs may hold at most ``max_jobs`` admitted jobs, and at most
``max_resident_gb`` of resident model memory, at once (Kueue's quota).
Within a queue, among jobs of equal priority, admission is first come, first
served: a job refused keeps every later job of that queue waiting too (a job
of higher priority goes before them). A job's first stage granted is its
admission, whichever it is, and a job not admitted rolls nothing out.
"""

from __future__ import annotations

import math

from rlix.core.errors import SchedulingError
from rlix.core.ledger import Draft
from rlix.core.state import GangRequest, View
from rlix.core.types import ClusterSpec, PipelineSpec, QueueSpec, SchedulerConfig


def _limited_gpus(spec: PipelineSpec) -> set[int]:
    """The GPUs by which a job belongs to a queue: its gang mappings and its named home."""
    return set(spec.init_gpus) | set(spec.home)


def queues_of(view: View, spec: PipelineSpec) -> tuple[QueueSpec, ...]:
    """The queues whose GPUs the job's gang mappings (or its home) touch, in declared order (kept per job)."""
    memo = view.memo.setdefault("queues", {})
    assert isinstance(memo, dict)
    found = memo.get(spec.pipeline_id)
    if found is None or found[0] is not spec:
        mine = _limited_gpus(spec)
        found = memo[spec.pipeline_id] = (spec, tuple(q for q in view.config.queues if mine.intersection(q.gpus)))
    return found[1]


def refusal(view: View, draft: Draft, spec: PipelineSpec) -> str | None:
    """Why the job may not be admitted now (the first full queue, in words), or None: it may."""
    queues = queues_of(view, spec)
    if not queues:
        return None
    admitted = {e.spec.pipeline_id for e in view.active() if e.admitted} | admitted_in(draft)
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


def admitted_in(draft: Draft) -> set[str]:
    """Jobs this draft grants a stage: a job's first stage is its admission (its model load, as a rule)."""
    return {g.pipeline_id for g in draft.grants}


def first_come(view: View, order: list[GangRequest]) -> list[GangRequest]:
    """``order`` with the admissions that queues limit (requests of jobs not admitted yet) put first
    come, first served among themselves, each in a place one of them had: another ordering of the
    gang stages (owners' before guests') must not let a later job take a queue's last place."""
    if not view.config.queues:
        return order
    places = [i for i, r in enumerate(order) if _queued_admission(view, r)]
    if len(places) < 2:
        return order
    arrival = {id(r): i for i, r in enumerate(view.pending)}
    out = list(order)
    for place, req in zip(places, sorted((order[i] for i in places), key=lambda r: arrival[id(r)]), strict=True):
        out[place] = req
    return out


def _queued_admission(view: View, req: GangRequest) -> bool:
    entry = view.pipelines[req.pipeline_id]
    return not entry.admitted and bool(queues_of(view, entry.spec))


def check_queues(cluster: ClusterSpec, config: SchedulerConfig) -> None:
    """Queues with unique names, GPUs of the cluster and at least one finite limit."""
    names = [q.name for q in config.queues]
    if "" in names or len(set(names)) != len(names):
        raise SchedulingError("queues: every queue needs a name of its own")
    for q in config.queues:
        where = f"queue '{q.name}'"
        if not q.gpus or any(not 0 <= g < cluster.num_gpus for g in q.gpus):
            raise SchedulingError(f"{where}: gpus must be GPUs of the cluster (0..{cluster.num_gpus - 1})")
        if q.max_jobs < 0 or not (math.isfinite(q.max_resident_gb) and q.max_resident_gb >= 0):
            raise SchedulingError(f"{where}: max_jobs and max_resident_gb must be >= 0 (0: no limit)")
        if not (q.max_jobs or q.max_resident_gb):
            raise SchedulingError(f"{where}: it sets no limit; give max_jobs or max_resident_gb")


def check_fits(config: SchedulerConfig, spec: PipelineSpec) -> None:
    """A job that no queue of its could ever admit is refused at registration (it would wait for ever,
    and every later job of its queues behind it)."""
    if not (math.isfinite(spec.resident_gb) and spec.resident_gb >= 0):
        raise SchedulingError(f"pipeline '{spec.pipeline_id}': resident_gb={spec.resident_gb} must be a finite number >= 0")
    mine = _limited_gpus(spec)
    for q in config.queues:
        if q.max_resident_gb and mine.intersection(q.gpus) and spec.resident_gb > q.max_resident_gb:
            raise SchedulingError(
                f"pipeline '{spec.pipeline_id}': its model keeps {spec.resident_gb:.2f} GB resident, more than queue "
                f"'{q.name}' ever admits ({q.max_resident_gb:.2f} GB); raise the queue's max_resident_gb or lower resident_gb"
            )
