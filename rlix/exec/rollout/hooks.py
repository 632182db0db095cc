"""Executor layer: what a pipeline's rollout parts ask of the world around them.

The coordinator's hooks, the deadlines of worker calls, and the process
runtime (Ray by default; tests pass fakes at this boundary), so that
:mod:`rlix.exec.rollout.control` and :mod:`rlix.exec.rollout.dispatch` run
without Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlix.core.types import Gpus
from rlix.exec.rollout.queue import Queued


@dataclass(frozen=True, kw_only=True)
class Deadlines:
    wake_s: float  # engine build + weight load
    call_s: float  # start, sleep, weight sync
    rollout_s: float  # one trajectory segment


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """What the control asks of its coordinator (all non-blocking)."""

    now: Callable[[], float]
    spawn: Callable[[Gpus, bool, bool], object]  # (bundle, first process on it, a spare's) -> worker handle
    weights: Callable[[], tuple]  # -> (full snapshot ref, its version, ((adapter, ref, version), ...))
    finished: Callable[[Queued, object], None]  # (queued trajectory, its GenResult)
    fatal: Callable[[BaseException], None]  # the job must fail
    lost: Callable[[Gpus, bool], None]  # tell the scheduler the worker is gone (failed: it died or did not wake)
    changed: Callable[[], None]  # demand changed
    # -> the CUDA IPC handles of that full version's buckets on the trainer's GPU, while they last (else None)
    handoff: Callable[[int], object] = lambda version: None


@dataclass(frozen=True, kw_only=True)
class WeightRule:
    """How new full weights reach a pipeline's workers, by the job's rollout mode (:func:`rlix.job.weight_gate`)."""

    full: bool = True  # False: a LoRA job, whose base never changes (adapters load beside running trajectories)
    streaming: bool = False
    partial: bool = False


@dataclass(frozen=True, kw_only=True)
class Processes:
    """What the control needs of the process runtime beside the handles' calls."""

    kill: Callable[[object], None]  # end a worker process now (its handle)
    died: tuple[type[BaseException], ...]  # a call failed because the process is gone
    refused: tuple[type[BaseException], ...]  # a call raised inside a live process (an application error)


def ray_processes() -> Processes:
    import ray  # only here: the control itself runs (and is tested) without Ray

    return Processes(kill=ray.kill, died=(ray.exceptions.RayActorError,), refused=(ray.exceptions.RayTaskError,))
