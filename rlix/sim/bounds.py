"""Simulator layer: lower bounds on a trace's makespan.

Two bounds, and the makespan can beat neither:

- work: all unavoidable GPU-seconds (model load, every gang stage over its
  mapping, every trajectory at full slot packing) spread over every GPU,
  tightened by each job's own chain of steps: a piece of work that cannot
  start before ``tau`` (its job's arrival plus the straggler-bound critical
  path before it) and that is followed by at least ``q`` seconds of its
  job's chain (the slowest trajectory of each later rollout, the later
  stages) lies inside ``[tau, makespan - q]``, so
  ``makespan >= tau + q + (work of such pieces) / GPUs`` for every ``tau, q``;
- critical path: the slowest job alone on an infinite cluster, its steps
  chained by their dependencies (longest trajectory of each rollout, stage
  times, the staleness bound), from its arrival.

Switching costs other than the initial model load are left out, so both are
true bounds whatever the policy.
"""

from __future__ import annotations

import numpy as np

from rlix.core import Role, Stage
from rlix.sim.trace import STEP_STAGES, Trace

Piece = tuple[float, float, float]  # (GPU-seconds, earliest start s, seconds of chain after it)


def lower_bounds(trace: Trace) -> tuple[float, float]:
    """(work bound, critical-path bound) in seconds."""
    work = 0.0
    path = 0.0
    pieces: list[Piece] = []
    for p in trace.pipelines:
        spec = trace.spec(p)
        infer = spec.role(Role.ACTOR_INFER)
        per_traj = infer.gpus_per_worker / p.slots_per_worker  # GPU-seconds per trajectory-second
        work += p.init_s * len(spec.init_gpus)
        finish = 0.0
        for _, steps in trace.streams[p.id]:
            for step in steps:
                work += float(step.trajectories.sum()) * per_traj
                for stage, seconds in step.stages.items():
                    work += seconds * len(_stage_gpus(spec, stage))
            finish = max(finish, _stream_path(steps, p.staleness))
            pieces += _stream_pieces(steps, p.staleness, p.arrival_s + p.init_s, per_traj, spec)
        pieces.append((p.init_s * len(spec.init_gpus), p.arrival_s, finish))
        path = max(path, p.arrival_s + p.init_s + finish)
    gpus = trace.cluster.num_gpus
    return max(work / gpus, _window_bound(pieces, gpus)), path


def _window_bound(pieces: list[Piece], gpus: int) -> float:
    """max over (tau, q) of tau + q + GPU-seconds that must fit in [tau, end - q], / GPUs."""
    if not pieces:
        return 0.0
    work, start, tail = (np.array(col, dtype=float) for col in zip(*pieces))
    best = 0.0
    for tau in np.unique(start):
        inside = start >= tau
        order = np.argsort(-tail[inside], kind="stable")
        q = tail[inside][order]
        # pieces with a chain of at least q[i] after them: every piece up to the last tie of q[i]
        best = max(best, float(np.max(tau + q + np.cumsum(work[inside][order]) / gpus)))
    return best


def _stream_pieces(steps, staleness: int, offset: float, per_traj: float, spec) -> list[Piece]:
    """Each rollout and stage of one stream as a piece: work, earliest start, chain after it."""
    k_steps = len(steps)
    longest = [float(step.trajectories.max()) for step in steps]
    train = [sum(step.stages.get(s, 0.0) for s in STEP_STAGES) for step in steps]
    roll_start, train_start = _earliest_starts(longest, train, staleness)
    after_roll = [0.0] * k_steps  # seconds of the stream's chain after rollout k ends
    after_train = [0.0] * k_steps  # ... after training k ends
    for k in reversed(range(k_steps)):
        nxt = k + 1 + staleness  # the rollout this training gates
        after_train[k] = max(
            train[k + 1] + after_train[k + 1] if k + 1 < k_steps else 0.0,
            longest[nxt] + after_roll[nxt] if nxt < k_steps else 0.0,
        )
        after_roll[k] = max(train[k] + after_train[k], longest[k + 1] + after_roll[k + 1] if k + 1 < k_steps else 0.0)
    pieces = []
    for k, step in enumerate(steps):
        pieces.append((float(step.trajectories.sum()) * per_traj, offset + roll_start[k], after_roll[k]))
        begin = train_start[k]
        left = train[k]
        for stage in STEP_STAGES:
            seconds = step.stages.get(stage, 0.0)
            if seconds:
                left -= seconds
                pieces.append((seconds * len(_stage_gpus(spec, stage)), offset + begin, max(left, 0.0) + after_train[k]))
                begin += seconds
    return pieces


def _earliest_starts(longest: list[float], train: list[float], staleness: int) -> tuple[list[float], list[float]]:
    """When each rollout and each training can start at the earliest (unlimited GPUs)."""
    roll_start: list[float] = []
    train_start: list[float] = []
    rolled = trained = 0.0
    trained_at: list[float] = []
    for k in range(len(longest)):
        start = rolled if k else 0.0
        gate = k - 1 - staleness
        if gate >= 0:
            start = max(start, trained_at[gate])
        roll_start.append(start)
        rolled = start + longest[k]
        train_start.append(max(rolled, trained))
        trained = train_start[-1] + train[k]
        trained_at.append(trained)
    return roll_start, train_start


def _stream_path(steps, staleness: int) -> float:
    """End of the last training of one stream with unlimited GPUs."""
    rolled: list[float] = []
    trained: list[float] = []
    for k, step in enumerate(steps):
        start = rolled[-1] if rolled else 0.0
        gate = k - 1 - staleness
        if gate >= 0:
            start = max(start, trained[gate])
        rolled.append(start + float(step.trajectories.max()))
        begin = max(rolled[-1], trained[-1] if trained else 0.0)
        trained.append(begin + sum(step.stages.get(s, 0.0) for s in STEP_STAGES))
    return trained[-1] if trained else 0.0


def _stage_gpus(spec, stage: Stage) -> tuple[int, ...]:
    role = {
        Stage.OLD_LOGPROBS: Role.ACTOR_TRAIN,
        Stage.ACTOR_TRAIN: Role.ACTOR_TRAIN,
        Stage.REF_LOGPROBS: Role.REFERENCE if spec.has_role(Role.REFERENCE) else Role.ACTOR_TRAIN,
        Stage.CRITIC_TRAIN: Role.CRITIC,
        Stage.VALUE_COMPUTE: Role.CRITIC,
    }[stage]
    return spec.role(role).gpus
