"""Executor layer: one pipeline's coordinator (a light async Ray actor) wiring its parts.

- :class:`~rlix.exec.step_driver.StepDriver`: which steps exist, may start
  (the job model's staleness gate), are complete, and the stages they run;
- :class:`~rlix.exec.rollout_queue.RolloutQueue`: what runs next, what
  continues after an abort, bounded retries;
- :class:`~rlix.exec.pool.WorkerPool` + :class:`~rlix.exec.rollout_control.RolloutControl`:
  the rollout workers' lifecycle and the plan's expand/shrink calls;
- :class:`~rlix.exec.gangs.SchedulerLink`: calls to the scheduler actor, gang
  stages booked through their phases;
- :class:`~rlix.exec.recorder.Recorder`: what happened, for the trace and metrics.

The coordinator itself runs the job's loops: produce steps, train each
(asking the scheduler actor for every gang stage and releasing it after),
and report demand. A multi-LoRA job has one stream per adapter; training
ticks run one at a time, first ready first (the tick lock is FIFO). No torch
here; every remote call has a deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import ray

from rlix.core import ClusterSpec, ReportDemand, Stage, WorkerLost
from rlix.core.types import Gpus
from rlix.exec.config import JobConfig
from rlix.exec.gangs import SchedulerLink
from rlix.exec.messages import Emulation, GenResult
from rlix.exec.placement import actor_options
from rlix.exec.pool import WorkerPool
from rlix.exec.recipe import Recipe
from rlix.exec.recorder import Recorder
from rlix.exec.records import JobProgress, JobResult, JobStatus, StepRecord
from rlix.exec.rewards import RewardError
from rlix.exec.rollout_control import Deadlines, Hooks, RolloutControl
from rlix.exec.rollout_queue import Queued, RolloutQueue
from rlix.exec.step_driver import StepDriver, Stream
from rlix.exec.steplog import StepLog
from rlix.exec.trainer_link import TrainerLink
from rlix.job import demand_report, stage_role
from rlix.metrics import Activity


class FaultInjected(RuntimeError):
    pass


def make_streams(job: JobConfig, model_dir: str, recipe: Recipe | None = None) -> list[Stream]:
    """One stream per adapter, or one for the job (``recipe``: a data job's, built in the driver)."""
    if job.kind == "multi_lora":
        return [
            Stream(name=a.name, recipe=Recipe.for_adapter(job, i, model_dir), steps=a.steps, staleness=job.staleness, stop_reward=a.stop_reward)
            for i, a in enumerate(job.adapters)
        ]
    return [Stream(name="", recipe=recipe or Recipe.for_job(job, model_dir), steps=job.steps, staleness=job.staleness)]


@ray.remote(num_cpus=0, max_concurrency=1000)
class PipelineCoordinator:
    def __init__(
        self, *, pipeline_id: str, job: JobConfig, model_dir: str, cluster: ClusterSpec, nodes: list[str], scheduler, emulation: Emulation, t0: float,
        recipe: Recipe | None = None, steplog: StepLog | None = None,
    ) -> None:
        self.pid, self.job, self.model_dir = pipeline_id, job, model_dir
        self.cluster, self.nodes, self.sched, self.emulation, self.t0 = cluster, nodes, scheduler, emulation, t0
        self.spec = job.pipeline_spec(pipeline_id)
        self.limits = job.limits
        self.driver = StepDriver(make_streams(job, model_dir, recipe), kl=job.algo.kl_coef > 0)
        self.steplog = steplog  # per-step metrics.jsonl (None: not written)
        self.rec = Recorder(pipeline_id, observer=steplog.observe if steplog is not None else None)
        self.link = SchedulerLink(pipeline_id=pipeline_id, spec=self.spec, sched=scheduler, recorder=self.rec, limits=job.limits, now=self.now)
        self.pool = WorkerPool(job.slots_per_worker)
        self.queue = RolloutQueue(max_tries=job.limits.rollout_tries)
        hooks = Hooks(now=self.now, spawn=self._spawn, weights=self._weights, finished=self._finished, fatal=self._fatal, lost=self._lost, changed=self._changed)
        deadlines = Deadlines(wake_s=job.limits.wake_timeout_s, call_s=job.limits.call_timeout_s, rollout_s=job.limits.rollout_timeout_s)
        self.rollout = RolloutControl(pool=self.pool, queue=self.queue, recorder=self.rec, hooks=hooks, deadlines=deadlines, model_dir=model_dir)
        self.trainer: TrainerLink | None = None
        self.status = JobStatus.PENDING
        self.arrival_s = self.init_s = 0.0
        self.tasks: list[asyncio.Task] = []
        self.failure: asyncio.Future | None = None
        self.wake_up: asyncio.Event | None = None  # producers, trainers and the reporter re-check
        self.announced: dict[str, int] = {}  # stream -> trajectories of its next batch, reported before it is produced

    def now(self) -> float:
        return time.time() - self.t0

    # ================================================================ main

    async def run(self) -> JobResult:
        self.arrival_s = self.now()
        loop = asyncio.get_running_loop()
        self.failure, self.wake_up, self.tick_lock = loop.create_future(), asyncio.Event(), asyncio.Lock()
        self.status = JobStatus.RUNNING
        error, bad_input = "", False
        try:
            me = ray.get_runtime_context().current_actor
            await self.link.control(self.sched.register.remote(self.spec, me))
            await self._init()
            background = [self.link.report_loop(self._demand, self._changes)] + [self._produce(s) for s in self.driver.streams]
            trainers = [loop.create_task(self._train_loop(s)) for s in self.driver.streams]
            self.tasks = [loop.create_task(c) for c in background] + trainers  # teardown cancels them all
            for task in self.tasks:
                task.add_done_callback(self._task_done)
            trained = asyncio.gather(*trainers)
            await asyncio.wait([trained, self.failure], return_when=asyncio.FIRST_COMPLETED)
            if self.failure.done():
                raise self.failure.result()
            trained.result()
            self.status = JobStatus.FINISHED
        except RewardError as exc:  # the user's reward function failed: a one-line reason, no traceback
            self.status, error, bad_input = JobStatus.FAILED, f"RewardError: {exc}".splitlines()[0], True
        except Exception as exc:  # one job's failure never reaches the others
            self.status = JobStatus.FAILED
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            await self._teardown()
            if self.steplog is not None:
                self.steplog.close()
        result = self.rec.result(self.status, error=error, arrival_s=self.arrival_s, init_s=self.init_s, finish_s=self.now(), planned=self.driver.produced)
        ranks = self.trainer.handle.world if self.trainer is not None else 0
        return replace(result, bad_input=bad_input, trainer_ranks=ranks)

    async def _init(self) -> None:
        # Warm workers: a sleeping process on every bundle the job may use, started now in the
        # background (no GPU memory, not on the GPU-held clock) while the trainer loads: an
        # expand is then a wake plus a weight sync.
        self.rollout.warm(await self.link.control(self.sched.rollout_bundles.remote(self.pid)))
        gpus = await self.link.acquire(Stage.INIT)
        t0 = self.now()  # model load from the grant on: time queued for it is not load (the simulator queues on its own)
        gpus_train = self.spec.role(stage_role(self.spec, Stage.ACTOR_TRAIN)).gpus
        self.trainer = TrainerLink.start_gang(self.job, self.model_dir, self.emulation, cluster=self.cluster, gpus=gpus_train, nodes=self.nodes, name=f"{self.pid}/trainer")
        await self.trainer.start(self.driver.streams)  # v0 is cached on the CPU
        await self.link.release(Stage.INIT)
        self.init_s = self.now() - t0

    def _spawn(self, gpus: Gpus, first_process: bool):
        from rlix.exec.workers import RolloutWorkerActor

        opts = actor_options(self.cluster, gpus, self.nodes, f"{self.pid}/rollout{gpus[0]}")
        fault = self.job.fault.for_worker(gpus[0], first_process)
        return RolloutWorkerActor.options(**opts).remote(self.emulation, self.job.lora_spec(), self.job.rollout_backend, self.job.vllm.value(), fault)

    async def _teardown(self) -> None:
        for t in self.tasks:
            t.cancel()
        try:
            await asyncio.wait_for(self.sched.unregister.remote(self.pid), self.limits.call_timeout_s)  # shrinks our workers
        except Exception:  # noqa: BLE001 -- the scheduler frees our GPUs on its own if it cannot reach us
            pass
        self.rollout.kill_all()
        if self.trainer is not None:
            self.trainer.handle.kill()
        held = tuple(sorted(set(self.pool.held_gpus()) | set(self.link.gpus_held())))
        if held:
            self.rec.mark(self.now(), held, Activity.FREE, "")

    # ================================================================ steps

    async def _produce(self, s: Stream) -> None:
        """Queue each step's trajectories once the staleness gate opens (until the stream stops)."""
        while not self.driver.exhausted(s):
            if not self.driver.may_produce(s):
                await self._changes()
                continue
            _, trajs = self.driver.produce(s, self.now())
            self.announced.pop(s.name, None)
            self.queue.add(trajs)
            self.rollout.dispatch()

    async def _changes(self) -> None:
        self.wake_up.clear()
        await self.wake_up.wait()

    async def _train_loop(self, s: Stream) -> None:
        """Train every step the stream produces, in order."""
        step = s.start
        while step < s.next_step or not self.driver.exhausted(s):
            if not self.driver.complete((s.name, step)):
                await self._changes()
                continue
            if self.job.fault.crash_at_step == step:
                raise FaultInjected(f"fault.crash_at_step={step}")
            async with self.tick_lock:  # one tick at a time; asyncio.Lock wakes waiters first-ready first
                await self._tick(s, step)
            step += 1

    async def _tick(self, s: Stream, step: int) -> None:
        batch = self.driver.batch((s.name, step))
        scored = s.recipe.score(batch.trajs, batch.results)
        samples = list(scored.samples)
        stages: list[tuple[str, float]] = []
        train_stats = None
        held = None  # each stage takes the GPUs over from the one before; the last is kept until the demand it opens is in
        for stage in self.driver.stages:
            value, secs = await self.link.run(stage, self.trainer.handle, self.trainer.stage_call(stage, samples, s.name), after=held, keep=True)
            held = stage
            stages.append((stage.value, secs))
            if stage is Stage.OLD_LOGPROBS:
                samples = [replace(x, old_logprobs=o) for x, o in zip(samples, value)]
            elif stage is Stage.REF_LOGPROBS:
                samples = [replace(x, ref_logprobs=r) for x, r in zip(samples, value)]
            elif stage is Stage.ACTOR_TRAIN:
                train_stats = value
        await self._hand_back(s, step, scored.mean_reward, held)
        await self.trainer.publish(s, step + 1, last=self.driver.stops(s, scored.mean_reward))  # into the CPU cache, then to live workers (before the gate opens)
        await self.rollout.push(s.name)
        self.driver.trained(s, step, scored.mean_reward)
        self._changed()
        recs = [self.rec.trajs[t.request.traj_id] for t in batch.trajs]
        record = StepRecord(
            stream=s.name,
            step=step,
            started_s=batch.started_s,
            finished_s=self.now(),
            mean_reward=scored.mean_reward,
            mean_tokens=sum(r.tokens for r in recs) / len(recs),
            stages=tuple(stages),
            min_weight_version=min(r.weight_version for r in recs),
        )
        self.rec.step(record)
        if self.steplog is not None:  # eval trajectories are reported, never counted as trained
            self.steplog.write_step(record, [self.rec.trajs[t.request.traj_id] for t in batch.trajs if not t.eval], scored, train_stats)

    async def _hand_back(self, s: Stream, step: int, mean_reward: float, stage: Stage) -> None:
        """Release the step's last stage with a demand report that counts the rollout batch
        training it lets ``s`` queue (announced now, produced once the weights are published):
        one call, planned as one, as one event is in the simulator, so the GPUs are not lent to
        another job for the moment in between."""
        ahead = self.driver.opened_by(s, step, mean_reward)
        if ahead:
            self.announced[s.name] = ahead
        await self.link.release(stage, self._demand() if ahead else None)

    # ================================================================ rollout hooks

    def _weights(self) -> tuple:
        return self.trainer.weights() if self.trainer is not None else (None, 0, ())

    def _finished(self, q: Queued, result: GenResult) -> None:
        self.rec.trajectory(self.queue.finished(q, result))
        self.driver.finish(q.traj.request.adapter, q.traj.step, result)
        self._changed()

    def _task_done(self, task: asyncio.Task) -> None:
        """A loop of the job that raised fails the job (a dead producer or reporter would leave it hanging)."""
        if not task.cancelled() and task.exception() is not None:
            self._fatal(task.exception())

    def _fatal(self, exc: BaseException) -> None:
        if not self.failure.done():
            self.failure.set_result(exc)

    def _lost(self, gpus: Gpus) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(self._report_lost(gpus)))

    async def _report_lost(self, gpus: Gpus) -> None:
        try:
            await self.link.control(self.sched.lost.remote(WorkerLost(pipeline_id=self.pid, first_gpu=gpus[0])))
        except Exception:  # noqa: BLE001 -- the scheduler is gone: nothing holds the GPUs any more
            pass

    def _changed(self) -> None:
        if self.wake_up is not None:
            self.wake_up.set()

    def _demand(self) -> ReportDemand:
        ahead = sum(self.announced.values())  # announced batches count as queued, no longer as backlog
        return demand_report(
            pipeline_id=self.pid,
            pending=len(self.queue) + ahead,
            loads=self.pool.loads(),
            open_trajectories=self.driver.open_trajectories() + ahead,
            backlog=self.driver.backlog() - ahead,
            trajectory_s=self.rec.mean_trajectory_s(),
            switch_s=self.rec.mean_switch_s(),
            path_s=self.driver.path_s(longest_s=self.rec.longest_gen_s, train_s=self.rec.longest_train_s),
        )

    # ================================================================ plan calls, polls

    async def expand(self, gpus: Gpus) -> None:
        if self.status is JobStatus.RUNNING:
            await self.rollout.expand(gpus)

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        await self.rollout.shrink(gpus, reason)

    async def progress(self) -> JobProgress:
        held = len(self.pool.held_gpus()) + len(self.link.gpus_held())
        return self.rec.progress(self.status, steps=self.driver.planned_steps(), gpus_held=held)
