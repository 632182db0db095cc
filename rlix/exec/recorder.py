"""Executor layer: what one pipeline records while it runs (activity, switches, steps, counters).

Pure (times are passed in). The coordinator notes each GPU activity change,
each switch with its measured seconds, each trained step and finished
trajectory; the driver drains the activity changes through progress polls
and folds the final :class:`~rlix.exec.messages.JobResult` into the trace
and the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlix.core.types import Gpus
from rlix.exec.messages import JobProgress, JobResult
from rlix.exec.records import ActivityChange, JobStatus, StepRecord, SwitchKind, SwitchRecord, TrajRecord, reward_spans
from rlix.metrics import Activity
from rlix.weightsync.types import SyncPath


@dataclass(kw_only=True)
class Counters:
    requeued: int = 0  # trajectories put back in the queue (abort or dead worker)
    orphaned: int = 0  # of those, put back because their worker died
    preemptions: int = 0  # shrinks that interrupted running trajectories (as in the simulator)
    workers_lost: int = 0  # as JobResult.workers_lost (rlix/exec/messages.py)
    control_s: float = 0.0  # blocking control-plane seconds beyond waiting for GPUs
    control_calls: int = 0
    gpu_wait_s: float = 0.0  # seconds gang requests waited in the scheduler for GPUs


class Recorder:
    """One pipeline's record of its run."""

    def __init__(self, pipeline_id: str, observer: Callable[[float, Gpus, Activity], None] | None = None) -> None:
        self.pid = pipeline_id
        self.observer = observer  # told every activity change as it happens (the job's metrics.jsonl)
        self.events: list[ActivityChange] = []
        self.switches: list[SwitchRecord] = []
        self.steps: list[StepRecord] = []
        self.trajs: dict[int, TrajRecord] = {}
        self.counters = Counters()
        self.finished_gen_s = 0.0
        self.longest_gen_s = 0.0  # the slowest finished trajectory's generation seconds
        self.finished = 0  # trajectories finished so far, dropped batches' too (only grows)

    def mark(self, now: float, gpus: Gpus, activity: Activity, stage: str) -> None:
        """From ``now`` on, ``gpus`` do ``activity`` (FREE: nobody's)."""
        owner = self.pid if activity is not Activity.FREE else ""
        self.events.append(
            ActivityChange(t=now, gpus=tuple(gpus), activity=activity, pipeline_id=owner, stage=stage if owner else "")
        )
        if self.observer is not None:
            self.observer(now, tuple(gpus), activity)

    def switch(
        self, kind: SwitchKind, t: float, seconds: float, synced_bytes: int = 0, sync_path: SyncPath | None = None
    ) -> None:
        self.switches.append(SwitchRecord(kind=kind, t=t, seconds=seconds, synced_bytes=synced_bytes, sync_path=sync_path))

    def trajectory(self, record: TrajRecord) -> None:
        self.trajs[record.traj_id] = record
        self.finished += 1
        self.finished_gen_s += record.gen_s
        self.longest_gen_s = max(self.longest_gen_s, record.gen_s)

    def forget(self, traj_ids: set[int]) -> None:
        """These trajectories' batch will never be trained: they are neither finished nor lost."""
        for tid in traj_ids & self.trajs.keys():
            self.finished_gen_s -= self.trajs.pop(tid).gen_s

    def step(self, record: StepRecord) -> None:
        self.steps.append(record)

    # ------------------------------------------------------------ measured means

    def mean_trajectory_s(self) -> float:
        """Mean generation seconds of the finished trajectories (0: none yet)."""
        return round(self.finished_gen_s / len(self.trajs), 2) if self.trajs else 0.0

    def mean_switch_s(self) -> float:
        """Seconds one new rollout worker costs: the mean measured wake (weights synced on wake)."""
        wakes = [s.seconds for s in self.switches if s.kind is SwitchKind.WAKE]
        return round(sum(wakes) / len(wakes), 2) if wakes else 0.0

    # ------------------------------------------------------------ reports

    def drain(self) -> tuple[ActivityChange, ...]:
        events, self.events = self.events, []
        return tuple(events)

    def progress(
        self, status: JobStatus, *, steps: int, gpus_held: int, before: int = 0, phase: str = "", phase_since_s: float = 0.0
    ) -> JobProgress:
        """``before``: steps trained by an earlier run (a job resumed from its checkpoint), counted in."""
        return JobProgress(
            pipeline_id=self.pid,
            status=status,
            step=before + len(self.steps),
            steps=steps,
            rewards=reward_spans(self.steps),
            gpus_held=gpus_held,
            requeued=self.counters.requeued,
            workers_lost=self.counters.workers_lost,
            phase=phase,
            phase_since_s=phase_since_s,
            events=self.drain(),
        )

    def result(
        self,
        status: JobStatus,
        *,
        error: str,
        arrival_s: float,
        init_s: float,
        finish_s: float,
        planned: int,
        steps_before: int = 0,
        steps_planned: int = 0,
    ) -> JobResult:
        c = self.counters
        return JobResult(
            pipeline_id=self.pid,
            status=status,
            error=error,
            arrival_s=arrival_s,
            init_s=init_s,
            finish_s=finish_s,
            steps=tuple(self.steps),
            steps_before=steps_before,
            steps_planned=steps_planned,
            trajectories=tuple(sorted(self.trajs.values(), key=lambda r: r.traj_id)),
            switches=tuple(self.switches),
            requeued=c.requeued,
            orphaned=c.orphaned,
            lost=planned - len(self.trajs) if status is JobStatus.FINISHED else 0,
            preemptions=c.preemptions,
            workers_lost=c.workers_lost,
            control_overhead_s=c.control_s,
            control_calls=c.control_calls,
            gpu_wait_s=c.gpu_wait_s,
            events=self.drain(),
        )
