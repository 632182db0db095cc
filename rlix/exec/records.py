"""Executor layer: what a run records, as plain values.

Coordinators and the scheduler actor append these while they run; the
driver folds them into the console, the timeline, the rlix-trace and the
metrics. Times are seconds since the run started (one wall clock). They reach
the driver inside the messages of :mod:`rlix.exec.messages` (``JobProgress``,
``JobResult``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlix.core.types import Gpus
from rlix.metrics import Activity
from rlix.weightsync.types import SyncPath


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
    prompt: int = -1  # its prompt's row in the job's dataset (-1: not known)
    predicted: float | None = None  # the predicted log-length (tokens) it last started with (rlix.lengths; None: none)


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
    COLD_START = "cold_start"  # GPUs held while a worker process starts, or while its first wake builds the engine
    PROCESS_START = "process_start"  # a warm worker process starting in the background (no GPU held)
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
    sync_path: SyncPath | None = None  # how the weights came, where a switch loaded any


class JobStatus(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"  # its coordinator process was killed
    CANCELLED = "cancelled"  # stopped on request (Ctrl-C): what it had done is kept


@dataclass(frozen=True, kw_only=True)
class RewardSpan:
    """A stream's mean reward at its first and at its last step trained (multi-LoRA: one per adapter)."""

    stream: str  # the adapter ("" = full finetune)
    first: float
    last: float


def reward_spans(steps: tuple[StepRecord, ...] | list[StepRecord]) -> tuple[RewardSpan, ...]:
    """Each stream's first and last mean reward, streams by name."""
    by: dict[str, list[StepRecord]] = {}
    for s in steps:
        by.setdefault(s.stream, []).append(s)
    spans = []
    for stream, done in sorted(by.items()):
        done.sort(key=lambda s: s.step)
        spans.append(RewardSpan(stream=stream, first=done[0].mean_reward, last=done[-1].mean_reward))
    return tuple(spans)
