"""Executor layer: which steps of a job exist, may start, are complete -- the job model applied.

Pure (no Ray, no asyncio, no clock: times are passed in). A job is one or
more *streams* of steps: a full-finetune job has one; a multi-LoRA job has
one per adapter (own recipe, step count, stop condition and version). The
driver answers the questions the coordinator asks while it runs them, with
the rules of :mod:`rlix.job`:

- may the next step's rollout start (the staleness gate, one batch at a time)?
- which trajectories make up a step, and is its rollout complete?
- which non-rollout stages does a step run, in what order?
- what is outstanding (the demand report's ``batch_size`` and ``backlog``)?
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlix.core import Stage
from rlix.exec.messages import GenResult
from rlix.exec.recipe import Recipe, Trajectory
from rlix.job import executor_stages, remaining_path_s, rollout_may_start

StepKey = tuple[str, int]  # (stream name, step)


@dataclass(kw_only=True)
class Stream:
    """One stream of steps: the whole job (full finetune, ``name`` "") or one LoRA adapter."""

    name: str
    recipe: Recipe
    steps: int  # steps end before this index
    staleness: int
    stop_reward: float | None = None
    start: int = 0  # first step (a resumed adapter continues from its checkpoint)
    next_step: int = -1  # next step to produce (-1: ``start``)
    version: int = 0  # steps trained = the newest weight version (gates rollouts)
    stopped: bool = False

    def __post_init__(self) -> None:
        if self.next_step < 0:
            self.next_step = self.start


@dataclass(kw_only=True)
class _Step:
    trajs: list[Trajectory]
    started_s: float
    results: dict[int, GenResult] = field(default_factory=dict)


class StepDriver:
    """The steps of every stream of one job, from produced to trained."""

    def __init__(self, streams: list[Stream], *, kl: bool) -> None:
        if not streams:
            raise ValueError("a job has at least one stream of steps")
        self.streams = streams
        self.stages: tuple[Stage, ...] = executor_stages(kl=kl)
        self.open: dict[StepKey, _Step] = {}  # produced, not yet trained
        self.produced = 0  # trajectories planned so far

    def stream(self, name: str) -> Stream:
        return next(s for s in self.streams if s.name == name)

    # ------------------------------------------------------------ producing

    def exhausted(self, s: Stream) -> bool:
        """No further step will be produced (all produced, or stopped)."""
        return s.stopped or s.next_step >= s.steps

    def may_produce(self, s: Stream) -> bool:
        """The staleness gate is open, and the stream's previous rollout is complete.

        One rollout batch per stream at a time, as the job model chains a
        stream's rollouts (and as the simulator replays them): staleness lets
        a rollout start before earlier steps are *trained*, not before the
        previous batch is *rolled out*.
        """
        if self.exhausted(s) or not rollout_may_start(s.next_step, s.version, s.staleness):
            return False
        previous = (s.name, s.next_step - 1)
        return previous not in self.open or self.complete(previous)

    def opened_by(self, s: Stream, step: int, mean_reward: float) -> int:
        """Trajectories ``s`` may queue once ``step`` is trained with this mean reward: its next
        batch, where the staleness gate is all that holds it back now (0: none)."""
        if self.may_produce(s) or self.exhausted(s) or self.stops(s, mean_reward):
            return 0
        previous = (s.name, s.next_step - 1)
        if previous in self.open and not self.complete(previous):
            return 0  # its previous rollout is still running (``step`` itself is complete: it is being trained)
        return s.recipe.step_size(s.next_step) if rollout_may_start(s.next_step, step + 1, s.staleness) else 0

    def produce(self, s: Stream, now: float) -> tuple[int, list[Trajectory]]:
        """The next step of ``s`` and its trajectories; call only when :meth:`may_produce`."""
        if not self.may_produce(s):
            raise RuntimeError(f"stream '{s.name}' step {s.next_step} may not start yet")
        step = s.next_step
        trajs = s.recipe.trajectories(step)
        self.open[(s.name, step)] = _Step(trajs=trajs, started_s=now)
        self.produced += len(trajs)
        s.next_step += 1
        return step, trajs

    # ------------------------------------------------------------ rollout

    def finish(self, stream: str, step: int, result: GenResult) -> bool:
        """Record one finished trajectory; True when its step's rollout is complete."""
        st = self.open[(stream, step)]
        st.results[result.traj_id] = result
        return len(st.results) == len(st.trajs)

    def complete(self, key: StepKey) -> bool:
        st = self.open.get(key)
        return st is not None and len(st.results) == len(st.trajs)

    def batch(self, key: StepKey) -> _Step:
        return self.open[key]

    # ------------------------------------------------------------ training

    def trained(self, s: Stream, step: int, mean_reward: float) -> None:
        """Step ``step`` of ``s`` is trained: its weights are version ``step + 1``."""
        self.open.pop((s.name, step))
        s.version = step + 1
        if self.stops(s, mean_reward):
            s.stopped = True  # its stop condition holds: produce no further steps

    @staticmethod
    def stops(s: Stream, mean_reward: float) -> bool:
        """A step with this mean reward is the stream's last (its stop condition holds)."""
        return s.stop_reward is not None and mean_reward >= s.stop_reward

    # ------------------------------------------------------------ demand

    def open_trajectories(self) -> int:
        """Trajectories of the rollout batches produced and not yet complete (finished ones included)."""
        return sum(len(st.trajs) for st in self.open.values() if len(st.results) < len(st.trajs))

    def backlog(self) -> int:
        """Trajectories of steps not produced yet (streams that stopped have none)."""
        return sum((s.steps - s.next_step) * s.recipe.batch_size for s in self.streams if not self.exhausted(s))

    def path_s(self, *, longest_s: float, train_s: float) -> float:
        """The longest chain of steps still ahead among the running streams (see :func:`remaining_path_s`)."""
        return max(
            (remaining_path_s(s.steps - max(s.version, s.start), s.staleness, longest_s=longest_s, train_s=train_s) for s in self.streams if not s.stopped),
            default=0.0,
        )

    def planned_steps(self) -> int:
        """Steps this job will train: all of a running stream's, only those done of a stopped one."""
        return sum(s.steps - s.start if not s.stopped else s.version - s.start for s in self.streams)
