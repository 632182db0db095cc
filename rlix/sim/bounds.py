"""Simulator layer: lower bounds on a trace's makespan.

Two bounds, and the makespan can beat neither:

- work: all unavoidable GPU-seconds (model load, every gang stage over its
  mapping, every trajectory at full slot packing) spread over every GPU;
- critical path: the slowest job alone on an infinite cluster, its steps
  chained by their dependencies (longest trajectory of each rollout, stage
  times, the staleness bound), from its arrival.

Switching costs other than the initial model load are left out, so both are
true bounds whatever the policy.
"""

from __future__ import annotations

from rlix.core import Role, Stage
from rlix.sim.trace import STEP_STAGES, Trace


def lower_bounds(trace: Trace) -> tuple[float, float]:
    """(work bound, critical-path bound) in seconds."""
    work = 0.0
    path = 0.0
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
        path = max(path, p.arrival_s + p.init_s + finish)
    return work / trace.cluster.num_gpus, path


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
