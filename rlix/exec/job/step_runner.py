"""Executor layer: the step machine (:mod:`rlix.step`) driven by asyncio over Ray actors.

The machine decides what the job does next; the runner carries its effects
out on the cluster and feeds each outcome back:

- registering: the coordinator registers the job (and warms its home's
  workers), then ``registered``;
- gang stages through the scheduler link (a hand-over releases the previous
  stage in the same call), the stage's load, work and offload on the
  trainer gang, each with its deadline;
- a queued batch: the recipe's trajectories into the rollout queue, dispatched
  to awake workers; a batch whose trajectories all finished is ``rolled``;
- a score: the recipe scores the batch (the user's reward functions);
- a publish: the trained weights into the trainer's CPU cache, then to the
  rollout workers the weight gate moves at once (:func:`rlix.job.weight_gate`:
  idle ones under streaming; the others when a trajectory needs them), then
  ``published``.

Effects that take time run as tasks; the machine is touched only from this
event loop. A task that raises fails the job (through ``fatal``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace

from rlix.core import Stage
from rlix.exec.control.scheduler_link import SchedulerLink
from rlix.exec.data.recipe import Recipe, ScoredStep, Trajectory
from rlix.exec.deadline import on_daemon_thread
from rlix.exec.job.steplog import StepLog
from rlix.exec.messages import GenResult
from rlix.exec.recorder import Recorder
from rlix.exec.records import StepRecord, SwitchKind, TrajRecord
from rlix.exec.rollout.control import RolloutControl
from rlix.exec.rollout.queue import Queued, RolloutQueue
from rlix.exec.train.trainer_link import TrainerLink
from rlix.rollout_book import BatchTally
from rlix.step import (
    Book,
    DemandChanged,
    Driver,
    DropBatch,
    Effect,
    Finished,
    Load,
    Offload,
    Publish,
    QueueBatch,
    RegisterJob,
    ReleaseGang,
    RequestGang,
    Score,
    StepMachine,
    Work,
)


class FaultInjected(RuntimeError):
    pass


@dataclass(kw_only=True)
class OpenBatch:
    """A produced step's trajectories, the results in so far, and its tally (what is left, the oldest weights)."""

    trajs: list[Trajectory]
    started_s: float
    tally: BatchTally  # the rollout book's
    results: dict[int, GenResult] = field(default_factory=dict)


@dataclass(kw_only=True)
class Tick:
    """The training step in progress: its scored samples as the stages fill them in."""

    scored: ScoredStep
    samples: list
    stages: list[tuple[str, float]] = field(default_factory=list)  # (stage, compute seconds)
    train_stats: object = None


def step_record(stream: str, step: int, batch: OpenBatch, tick: Tick, recs: list[TrajRecord], finished_s: float) -> StepRecord:
    """The record of a trained step: its batch's rollout (``recs``, its trajectories' records) and its tick."""
    return StepRecord(
        stream=stream,
        step=step,
        started_s=batch.started_s,
        finished_s=finished_s,
        mean_reward=tick.scored.mean_reward,
        mean_tokens=sum(r.tokens for r in recs) / len(recs),
        stages=tuple(tick.stages),
        min_weight_version=batch.tally.oldest,
    )


@dataclass(frozen=True, kw_only=True)
class Parts:
    """The coordinator's parts the runner drives."""

    link: SchedulerLink
    register: Callable[[], Awaitable[None]]  # register the job with the scheduler, warm its home's workers, start notes
    rollout: RolloutControl
    queue: RolloutQueue
    recorder: Recorder
    start_trainer: Callable[[], TrainerLink]  # the trainer gang on the job's training GPUs, starting
    loaded: Callable[[], None]  # the model load ended: start reporting demand
    steplog: StepLog | None = None
    crash_at_step: int | None = None  # fault drill: the job fails as this step's rollout is scored (step N: the Nth, from 1)
    reward_timeout_s: float = 3600.0  # how long one batch's scoring may take (config limits.reward_timeout_s)


class StepRunner:
    """Carries out one job's step-machine effects with asyncio."""

    def __init__(self, machine: StepMachine, recipes: list[Recipe], parts: Parts, *, now: Callable[[], float], fatal) -> None:
        if parts.queue.book is not machine.book:
            raise ValueError("the rollout queue must wrap the machine's book: its demand reports read that book")
        self.machine = machine
        self.driver = Driver(self)
        self.recipes = recipes
        self.names = [s.name for s in machine.plan.streams]
        self.p = parts
        self.rec = parts.recorder
        self.now = now
        self.fatal = fatal  # the job must fail: (exception) -> None
        self.trainer: TrainerLink | None = None
        self.batches: dict[tuple[int, int], OpenBatch] = {}
        self.tick: Tick | None = None
        self.init_s = 0.0
        self.loading_since: float | None = None  # the model load began (None: not yet)
        self.loaded = False
        self.ended = asyncio.get_running_loop().create_future()  # done once the machine says Finished
        self.tasks: set[asyncio.Task] = set()  # kept until done (teardown cancels them)
        self.releasing: asyncio.Task | None = None  # the last release: a publish waits for it

    def start(self) -> None:
        self.do(lambda: self.machine.start(self.now()))

    def do(self, event: Callable[[], list[Effect]]) -> None:
        """Tell the machine ``event`` (a call of one of its event methods) and carry out its effects, after
        those being carried out (:class:`rlix.step.Driver`); anything raised on the way (a protocol error,
        a bad batch or reward) fails this job alone."""
        try:
            self.driver.feed(event)
        except Exception as exc:  # noqa: BLE001 -- a bad batch or reward fails this job alone
            self.fatal(exc)

    def _spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fatal(task.exception())

    def _then(self, work: Awaitable, event: Callable[[float], list[Effect]]) -> None:
        """Run ``work``, then feed ``event(now)`` back to the machine."""

        async def run() -> None:
            await work
            self.do(lambda: event(self.now()))

        self._spawn(run())

    # ------------------------------------------------------------ gang stages

    def register_job(self, e: RegisterJob) -> None:
        self._then(self.p.register(), self.machine.registered)

    def request_gang(self, e: RequestGang) -> None:
        async def acquire() -> None:
            gpus = await self.p.link.acquire(e.stage, e.role, after=e.after)
            self.do(lambda: self.machine.granted(e.stage, gpus, self.now()))

        self._spawn(acquire())

    def release_gang(self, e: ReleaseGang) -> None:
        # The batch the release opens rides on it, planned as one with the release.
        report = self.demand() if e.announce else None
        self.releasing = self._spawn(self.p.link.release(e.stage, report))

    def book(self, e: Book) -> None:
        self.rec.mark(self.now(), e.gpus, e.activity, e.stage)

    def load(self, e: Load) -> None:
        self._then(
            self._load_init() if e.stage is Stage.INIT else self._timed(SwitchKind.STAGE_LOAD, self.trainer.load(e.stage)),
            lambda now: self.machine.loaded(e.stage, now),
        )

    async def _load_init(self) -> None:
        """Model load: the trainer gang starts; resumed streams continue from their checkpoints."""
        t0 = self.loading_since = self.now()  # from the grant on: time queued for it is not load
        self.trainer = self.p.start_trainer()
        resumed = await self.trainer.start(self.names)  # v0 is cached on the CPU
        for i, name in enumerate(self.names):
            if name in resumed:
                self.machine.resume(i, resumed[name])
        self.init_s = self.now() - t0
        self.loaded = True
        self.p.loaded()  # demand reports start once the model is loaded (the simulator reports none before)

    async def _timed(self, kind: SwitchKind, work: Awaitable) -> None:
        t = self.now()
        await work
        self.rec.switch(kind, t, self.now() - t)

    def work(self, e: Work) -> None:
        async def work() -> None:
            tick, t = self.tick, self.now()
            value = await self.trainer.work(e.stage, tick.samples, self.names[e.stream])
            seconds = self.now() - t
            tick.stages.append((e.stage.value, seconds))
            if e.stage is Stage.OLD_LOGPROBS:
                tick.samples = [replace(x, old_logprobs=o) for x, o in zip(tick.samples, value)]
            elif e.stage is Stage.REF_LOGPROBS:
                tick.samples = [replace(x, ref_logprobs=r) for x, r in zip(tick.samples, value)]
            elif e.stage is Stage.ACTOR_TRAIN:
                tick.train_stats = value
            self.do(lambda: self.machine.worked(e.stage, seconds, self.now()))

        self._spawn(work())

    def offload(self, e: Offload) -> None:
        self._then(
            self._timed(SwitchKind.STAGE_OFFLOAD, self.trainer.offload()), lambda now: self.machine.offloaded(e.stage, now)
        )

    # ------------------------------------------------------------ batches and weights

    def queue_batch(self, e: QueueBatch) -> None:
        trajs = self.recipes[e.stream].trajectories(e.step)
        self.batches[(e.stream, e.step)] = OpenBatch(trajs=trajs, started_s=self.now(), tally=self.p.queue.add(trajs, e.version))
        self.p.rollout.dispatch()

    def drop_batch(self, e: DropBatch) -> None:
        """Never trained: its trajectories leave the queue, and those already finished leave the record."""
        batch = self.batches.pop((e.stream, e.step))
        ids = {t.request.traj_id for t in batch.trajs}
        self.p.queue.drop(ids)
        self.rec.forget(ids)

    def trajectory_done(self, q: Queued, result: GenResult) -> None:
        """The rollout control's hook: one trajectory finished (anything raised here fails the job)."""
        self.do(lambda: self._finished_trajectory(q, result))

    def _finished_trajectory(self, q: Queued, result: GenResult) -> list[Effect]:
        stream, step = self.names.index(q.traj.request.adapter), q.traj.step
        batch = self.batches.get((stream, step))
        if batch is None or result.traj_id in batch.results:
            return []  # its batch was dropped (the stream stopped), or a repeat: nothing new
        record, rolled = self.p.queue.finished(q, result)
        self.rec.trajectory(record)
        batch.results[result.traj_id] = result
        self.p.rollout.hooks.changed()
        if not rolled:
            return []
        return self.machine.rolled(stream, step, self.now(), oldest_version=batch.tally.oldest)

    def score(self, e: Score) -> None:
        if self.p.crash_at_step == e.step + 1:  # step N is the Nth trained step (the machine counts from 0)
            raise FaultInjected(f"fault.crash_at_step={e.step + 1}")
        batch, recipe = self.batches[(e.stream, e.step)], self.recipes[e.stream]

        async def score() -> None:
            # The user's reward functions run off the event loop: a slow one holds none of the job's calls
            # (shrinks, keep-alives, liveness), and one past its deadline fails this job, naming it.
            scoring = on_daemon_thread(lambda: recipe.score(batch.trajs, batch.results), f"rlix-score-{e.step}")
            try:
                scored = await asyncio.wait_for(asyncio.wrap_future(scoring), self.p.reward_timeout_s)
            except asyncio.TimeoutError:
                raise recipe.unfinished(self.p.reward_timeout_s) from None
            self.tick = Tick(scored=scored, samples=list(scored.samples))
            self.do(lambda: self.machine.scored(e.stream, e.step, scored.mean_reward, self.now()))

        self._spawn(score())

    def publish(self, e: Publish) -> None:
        async def publish() -> None:
            if self.releasing is not None:
                await self.releasing  # the release (with the batch it opens) goes first
            name, step = self.names[e.stream], e.version - 1
            # Into the CPU cache, then to the workers the weight gate moves now, before the machine hears of it.
            await self.trainer.publish(name, e.version, last=e.last)
            await self.p.rollout.push(name)
            self._record(e.stream, step)
            self.do(lambda: self.machine.published(e.stream, self.now()))

        self._spawn(publish())

    def _record(self, stream: int, step: int) -> None:
        batch, tick = self.batches.pop((stream, step)), self.tick
        recs = [self.rec.trajs[t.request.traj_id] for t in batch.trajs]
        record = step_record(self.names[stream], step, batch, tick, recs, self.now())
        self.rec.step(record)
        if self.p.steplog is not None:  # eval trajectories are reported, never counted as trained
            trained = [self.rec.trajs[t.request.traj_id] for t in batch.trajs if not t.eval]
            self.p.steplog.write_step(record, trained, tick.scored, tick.train_stats)

    def demand_changed(self, e: DemandChanged) -> None:
        self.p.rollout.hooks.changed()

    def finished(self, e: Finished) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    # ------------------------------------------------------------ demand

    def demand(self):
        return self.machine.demand(
            leaving=self.p.rollout.pool.leaving_trajectories(),
            loads=self.p.rollout.pool.loads(),
            trajectory_s=self.rec.mean_trajectory_s(),
            switch_s=self.rec.mean_switch_s(),
            longest_s=self.rec.longest_gen_s,
            finished=self.rec.finished,
            starting=self.p.rollout.pool.starting(),
        )
