"""Core layer: the GPU ledger, who holds which GPU now.

The ledger only records and answers "what fits"; policies choose. A
:class:`Draft` is a scratch copy a policy edits while it builds a plan, so
the ledger itself changes only when a validated plan is applied.
"""

from __future__ import annotations

from rlix.core.errors import InvariantViolation
from rlix.core.types import (
    Expand,
    GangHolder,
    Gpus,
    Grant,
    Holder,
    Plan,
    RolloutWorker,
    Shrink,
    ShrinkReason,
    Stage,
)


class Ledger:
    """Owner of every GPU, plus indexes by pipeline."""

    def __init__(self, num_gpus: int) -> None:
        self.num_gpus = num_gpus
        self.owner: list[Holder | None] = [None] * num_gpus
        # pipeline id -> first GPU of the bundle -> worker
        self.workers: dict[str, dict[int, RolloutWorker]] = {}
        self.placed_at: dict[int, float] = {}  # first GPU of a placed worker -> when it was placed (s)
        self.gangs: dict[tuple[str, Stage], Gpus] = {}
        self.free_count = num_gpus

    def workers_of(self, pipeline_id: str) -> dict[int, RolloutWorker]:
        return self.workers.get(pipeline_id, {})

    def release_gang(self, pipeline_id: str, stage: Stage) -> None:
        gpus = self.gangs.pop((pipeline_id, stage))
        for g in gpus:
            self.owner[g] = None
        self.free_count += len(gpus)

    def drop_worker(self, pipeline_id: str, first_gpu: int) -> bool:
        """Forget a worker that is gone (not shrunk by a plan); False if there was none."""
        w = self.workers.get(pipeline_id, {}).pop(first_gpu, None)
        if w is None:
            return False
        for g in w.gpus:
            self.owner[g] = None
        del self.placed_at[first_gpu]
        self.free_count += len(w.gpus)
        return True

    def restore_gang(self, pipeline_id: str, stage: Stage, gpus: Gpus) -> None:
        """Record a gang stage granted before the scheduler restarted, on GPUs that are free here."""
        self._check_free(gpus, f"stage {stage.value} of pipeline '{pipeline_id}'")
        self._take_gang(pipeline_id, stage, gpus)

    def restore_worker(self, worker: RolloutWorker, now: float) -> None:
        """Record a rollout worker placed before the scheduler restarted, as placed at ``now``."""
        self._check_free(worker.gpus, str(worker))
        self._take_worker(worker, now)

    def apply(self, plan: Plan) -> None:
        for shrink in plan.shrinks:
            w = shrink.worker
            for g in w.gpus:
                self.owner[g] = None
            del self.workers[w.pipeline_id][w.gpus[0]]
            del self.placed_at[w.gpus[0]]
            self.free_count += len(w.gpus)
        for grant in plan.grants:
            self._take_gang(grant.pipeline_id, grant.stage, grant.gpus)
        for expand in plan.expands:
            self._take_worker(expand.worker, plan.now)

    def _check_free(self, gpus: Gpus, what: str) -> None:
        held = [g for g in gpus if self.owner[g] is not None]
        if held:
            raise InvariantViolation("no_gpu_owned_twice", f"{what}: GPU {held[0]} is held by {self.owner[held[0]]}")

    def _take_gang(self, pipeline_id: str, stage: Stage, gpus: Gpus) -> None:
        holder = GangHolder(pipeline_id=pipeline_id, stage=stage)
        for g in gpus:
            self.owner[g] = holder
        self.gangs[(pipeline_id, stage)] = gpus
        self.free_count -= len(gpus)

    def _take_worker(self, w: RolloutWorker, now: float) -> None:
        for g in w.gpus:
            self.owner[g] = w
        self.workers.setdefault(w.pipeline_id, {})[w.gpus[0]] = w
        self.placed_at[w.gpus[0]] = now
        self.free_count -= len(w.gpus)


class Draft:
    """A policy's working copy of GPU ownership while it builds one plan."""

    def __init__(self, ledger: Ledger, now: float) -> None:
        self.ledger = ledger
        self.now = now
        self.owner = list(ledger.owner)
        self.free_count = ledger.free_count
        self.counts = {pid: len(ws) for pid, ws in ledger.workers.items()}
        self.shrinks: list[Shrink] = []
        self.grants: list[Grant] = []
        self.expands: list[Expand] = []
        self.shrunk: set[RolloutWorker] = set()
        self.expanded: set[RolloutWorker] = set()
        self._free_set: set[int] | None = None  # built on first use, then kept up to date
        self._free: list[int] | None = None
        # GPUs no rollout worker may be placed on or moved to in this plan (free or held by their owner's
        # idle worker): see rlix.core.homes.held_for_owners. Gang stages are not bound by it.
        self.held_back: frozenset[int] = frozenset()
        # A bundle kept for the job starving longest, so its workers can be assembled there: no other job's
        # rollout worker is placed on or moved to it in this plan (rlix.core.rebalance.muster).
        self.mustered: tuple[str, frozenset[int]] | None = None

    def kept_from(self, pipeline_id: str) -> frozenset[int]:
        """GPUs no rollout worker of ``pipeline_id`` may be placed on or moved to in this plan."""
        if self.mustered is None or self.mustered[0] == pipeline_id:
            return self.held_back
        return self.held_back | self.mustered[1]

    def free_gpus(self) -> list[int]:
        """Free GPU ids, ascending (re-sorted only after the draft changed)."""
        if self._free is None:
            if self._free_set is None:
                self._free_set = {g for g, o in enumerate(self.owner) if o is None} if self.free_count else set()
            self._free = sorted(self._free_set)
        return self._free

    def _mark(self, gpus: Gpus, free: bool) -> None:
        self._free = None
        if self._free_set is not None:
            if free:
                self._free_set.update(gpus)
            else:
                self._free_set.difference_update(gpus)

    def worker_count(self, pipeline_id: str) -> int:
        return self.counts.get(pipeline_id, 0)

    def live_workers(self, pipeline_id: str) -> list[RolloutWorker]:
        """Workers the pipeline still holds in this draft, sorted by first GPU."""
        placed = [w for w in self.ledger.workers_of(pipeline_id).values() if w not in self.shrunk]
        placed += [e.worker for e in self.expands if e.worker.pipeline_id == pipeline_id]
        return sorted(placed, key=lambda w: w.gpus[0])

    def shrink(self, worker: RolloutWorker, reason: ShrinkReason) -> None:
        self._mark(worker.gpus, True)
        for g in worker.gpus:
            self.owner[g] = None
        self.free_count += len(worker.gpus)
        self.counts[worker.pipeline_id] -= 1
        self.shrunk.add(worker)
        self.shrinks.append(Shrink(worker=worker, reason=reason))

    def grant(self, pipeline_id: str, stage: Stage, gpus: Gpus) -> None:
        self._mark(gpus, False)
        holder = GangHolder(pipeline_id=pipeline_id, stage=stage)
        for g in gpus:
            self.owner[g] = holder
        self.free_count -= len(gpus)
        self.grants.append(Grant(pipeline_id=pipeline_id, stage=stage, gpus=gpus))

    def expand(self, pipeline_id: str, gpus: Gpus) -> RolloutWorker:
        self._mark(gpus, False)
        worker = RolloutWorker(pipeline_id=pipeline_id, gpus=gpus)
        for g in gpus:
            self.owner[g] = worker
        self.free_count -= len(gpus)
        self.counts[pipeline_id] = self.counts.get(pipeline_id, 0) + 1
        self.expands.append(Expand(worker=worker))
        self.expanded.add(worker)
        return worker

    def to_plan(self) -> Plan:
        return Plan(now=self.now, shrinks=tuple(self.shrinks), grants=tuple(self.grants), expands=tuple(self.expands))
