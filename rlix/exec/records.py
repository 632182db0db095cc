"""Executor layer: what a run records, as plain values.

Coordinators and the scheduler actor append these while they run; the
driver folds them into the console, the timeline, the rlix-trace and the
metrics. Times are seconds since the run started (one wall clock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rlix.core.types import Gpus
from rlix.metrics import Activity


@dataclass(frozen=True, kw_only=True)
class ActivityChange:
    """From ``t`` on, ``gpus`` do ``activity`` for ``pipeline_id``/``stage``."""

    t: float
    gpus: Gpus
    activity: Activity
    pipeline_id: str
    stage: str


@dataclass(frozen=True, kw_only=True)
class TrajRecord:
    traj_id: int
    stream: str = ""  # multi-LoRA: the adapter ("" = full finetune)
    step: int
    gen_s: float  # seconds of generation, summed over segments
    segments: int  # > 1 when it was aborted and continued
    tokens: int
    weight_version: int  # oldest policy version that produced a token


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    stream: str = ""  # multi-LoRA: the adapter this tick trained ("" = full finetune)
    step: int
    started_s: float  # rollout of the step began
    finished_s: float  # weights of the new version published
    mean_reward: float
    mean_tokens: float
    stages: tuple[tuple[str, float], ...]  # (stage name, compute seconds)
    min_weight_version: int


class SwitchKind(enum.Enum):
    COLD_START = "cold_start"  # new worker process + model load
    WAKE = "wake"  # resume a slept worker (weights synced from the CPU cache)
    SLEEP = "sleep"  # shrink: abort + drop weights
    SYNC = "sync"  # push new weights to a live worker
    STAGE_LOAD = "stage_load"  # trainer back onto its GPUs
    STAGE_OFFLOAD = "stage_offload"  # trainer off its GPUs


@dataclass(frozen=True, kw_only=True)
class SwitchRecord:
    kind: SwitchKind
    t: float
    seconds: float  # as seen by the coordinator (includes the Ray call)
    synced_bytes: int = 0


class JobStatus(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"


@dataclass(frozen=True, kw_only=True)
class JobProgress:
    pipeline_id: str
    status: JobStatus
    step: int  # steps completed
    steps: int
    last_reward: float | None
    gpus_held: int
    requeued: int
    events: tuple[ActivityChange, ...] = ()  # drained since the previous poll


@dataclass(frozen=True, kw_only=True)
class JobResult:
    pipeline_id: str
    status: JobStatus
    error: str = ""
    arrival_s: float = 0.0
    init_s: float = 0.0
    finish_s: float = 0.0
    steps: tuple[StepRecord, ...] = ()
    trajectories: tuple[TrajRecord, ...] = ()
    switches: tuple[SwitchRecord, ...] = ()
    requeued: int = 0
    lost: int = 0
    preemptions: int = 0  # shrinks that interrupted running trajectories (as in the simulator)
    workers_lost: int = 0  # rollout worker processes that died or were killed (missed a deadline)
    control_overhead_s: float = 0.0  # blocking control-plane time beyond waiting for GPUs
    control_calls: int = 0
    gpu_wait_s: float = 0.0  # time gang requests waited for GPUs in the scheduler
    trainer_ranks: int = 0  # data-parallel trainer processes (one per actor_train GPU); 0 = never started
    events: tuple[ActivityChange, ...] = ()  # not yet drained by a progress poll
    bad_input: bool = False  # failed on the user's input (a reward function), not on rlix: exit status 2


@dataclass(frozen=True, kw_only=True)
class GrantReply:
    gpus: Gpus
    queued_s: float  # seconds the request waited inside the scheduler for GPUs


@dataclass(frozen=True, kw_only=True)
class SchedulerStats:
    plans: int
    plan_s: float  # seconds spent inside core planning
    unmet: tuple[tuple[float, bool], ...] = ()  # (t, some pipeline has queued trajectories)
    shrinks: int = 0
    expands: int = 0
    grants: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)
