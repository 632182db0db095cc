"""Core layer: checks what a pipeline rejoining a restarted scheduler says it holds.

A restarted scheduler starts with an empty ledger while the cluster's GPUs are
still in use; each pipeline tells it what it holds with a :class:`Rejoin`. The
new scheduler takes a pipeline's word only if every holding is one the old
scheduler could have given it (a gang stage over one of its mappings, a
rollout worker on one of the policy's bundles for it) and no GPU is claimed
twice. :func:`check_holdings` decides that and changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlix.core.errors import SchedulingError
from rlix.core.ledger import Ledger
from rlix.core.lifecycle import REQUEST_TRANSITIONS, RequestState, check_transition
from rlix.core.state import GangRequest
from rlix.core.topology import requested_gpus
from rlix.core.types import Gpus, PipelineSpec, Rejoin, ReportDemand, RequestStage, Role, RolloutWorker, Stage


@dataclass(frozen=True, kw_only=True)
class Holdings:
    """A rejoin's checked holdings: its gang stages as granted requests, and its rollout workers."""

    requests: tuple[GangRequest, ...]
    workers: tuple[RolloutWorker, ...]


def check_demand(report: ReportDemand, spec: PipelineSpec) -> None:
    """Refuse a demand report with negative counts, a worker's load listed twice, a figure that is not a
    finite number >= 0, or a ``starting`` GPU that begins none of the job's rollout bundles."""
    if report.pending < 0 or report.backlog < 0 or any(load.active < 0 for load in report.loads):
        raise SchedulingError(f"pipeline '{report.pipeline_id}': demand counts must be >= 0")
    firsts = [load.first_gpu for load in report.loads]
    if len(set(firsts)) != len(firsts):
        raise SchedulingError(f"pipeline '{report.pipeline_id}': a worker's load is reported twice; report each worker once")
    if not isinstance(report.finished, int) or report.finished < 0:
        raise SchedulingError(f"pipeline '{report.pipeline_id}': finished must be a whole number >= 0 (0 if unknown)")
    for name in ("trajectory_s", "switch_s", "path_s"):
        value = getattr(report, name)
        if not (math.isfinite(value) and value >= 0):
            raise SchedulingError(f"pipeline '{report.pipeline_id}': {name} must be a finite number >= 0")
    firsts = {b[0] for b in spec.role(Role.ACTOR_INFER).bundles}
    if unknown := [g for g in report.starting if g not in firsts]:
        raise SchedulingError(
            f"pipeline '{report.pipeline_id}' reports GPU {unknown[0]} starting, which begins none of its rollout bundles; "
            "report the first GPU of a bundle of its actor_infer mapping"
        )


def stage_gpus(spec: PipelineSpec, stage: Stage) -> set[Gpus]:
    """Every GPU set a request for ``stage`` could have been granted: one role's mapping, or the init GPUs."""
    options = {requested_gpus(spec, RequestStage(pipeline_id=spec.pipeline_id, stage=stage, role=r.role)) for r in spec.roles}
    if stage is Stage.INIT:
        options.add(spec.init_gpus)
    return options


def check_holdings(event: Rejoin, bundles: tuple[Gpus, ...], ledger: Ledger, seq: int) -> Holdings:
    """The holdings of ``event`` once checked against its spec, the policy's ``bundles`` for it and
    ``ledger``; raises :class:`SchedulingError` at the first problem. The gang requests get the
    arrival numbers after ``seq``, in the order listed."""
    pid = event.spec.pipeline_id
    where = f"pipeline '{pid}' rejoin"
    claims = _Claims(where, ledger)
    requests: list[GangRequest] = []
    for stage, gpus in event.gangs:
        gpus = tuple(gpus)
        if stage is Stage.ROLLOUT:
            raise SchedulingError(f"{where}: stage rollout is not a gang stage; list its rollout workers in workers")
        if any(r.stage is stage for r in requests):
            raise SchedulingError(f"{where}: stage {stage.value} is listed twice in gangs; list each held stage once")
        if gpus not in stage_gpus(event.spec, stage):
            raise SchedulingError(
                f"{where}: stage {stage.value} on GPUs {list(gpus)} matches none of its role mappings; "
                "list the GPUs the stage was granted"
            )
        claims.take(gpus, f"stage {stage.value}")
        requests.append(_granted(event, stage, gpus, seq + len(requests) + 1))
    allowed = set(bundles)
    workers: list[RolloutWorker] = []
    for gpus in event.workers:
        gpus = tuple(gpus)
        if gpus not in allowed:
            raise SchedulingError(
                f"{where}: rollout worker on GPUs {list(gpus)} is not one of its rollout bundles under this policy; "
                "list only workers the scheduler placed"
            )
        claims.take(gpus, f"rollout worker {list(gpus)}")
        workers.append(RolloutWorker(pipeline_id=pid, gpus=gpus))
    if event.demand is not None:
        if event.demand.pipeline_id != pid:
            raise SchedulingError(f"{where}: demand report is for pipeline '{event.demand.pipeline_id}'; send its own report")
        check_demand(event.demand, event.spec)
    return Holdings(requests=tuple(requests), workers=tuple(workers))


def _granted(event: Rejoin, stage: Stage, gpus: Gpus, seq: int) -> GangRequest:
    """A request restored as granted: it was asked for (pending) and then granted, before the restart."""
    what = f"pipeline '{event.spec.pipeline_id}' stage {stage.value}"
    check_transition(REQUEST_TRANSITIONS, None, RequestState.PENDING, what)
    check_transition(REQUEST_TRANSITIONS, RequestState.PENDING, RequestState.GRANTED, what)
    return GangRequest(
        pipeline_id=event.spec.pipeline_id,
        stage=stage,
        gpus=gpus,
        seq=seq,
        job_priority=event.spec.priority,
        state=RequestState.GRANTED,
    )


class _Claims:
    """GPUs claimed so far by one rejoin: each at most once, and none the ledger already gives to anyone."""

    def __init__(self, where: str, ledger: Ledger) -> None:
        self.where = where
        self.ledger = ledger
        self.by: dict[int, str] = {}

    def take(self, gpus: Gpus, what: str) -> None:
        for g in gpus:
            if g in self.by:
                raise SchedulingError(f"{self.where}: GPU {g} is claimed by both {self.by[g]} and {what}; list each GPU once")
            holder = self.ledger.owner[g]
            if holder is not None:
                raise SchedulingError(
                    f"{self.where}: GPU {g} ({what}) is already held by pipeline '{holder.pipeline_id}'; each GPU has one holder"
                )
            self.by[g] = what
