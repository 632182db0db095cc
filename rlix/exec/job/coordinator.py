"""Executor layer: one pipeline's coordinator (a light async Ray actor) wiring its parts.

- :class:`~rlix.step.StepMachine`: the step process of the job (shared with
  the simulator), driven here by :class:`~rlix.exec.job.step_runner.StepRunner`;
- :class:`~rlix.exec.rollout.queue.RolloutQueue`: what runs next, what
  continues after an abort, bounded retries;
- :class:`~rlix.exec.rollout.pool.WorkerPool` + :class:`~rlix.exec.rollout.control.RolloutControl`:
  the rollout workers' lifecycle and the plan's expand/shrink calls;
- :class:`~rlix.exec.control.scheduler_link.SchedulerLink`: calls to the scheduler actor;
- :class:`~rlix.exec.recorder.Recorder`: what happened, for the trace and metrics.

The coordinator starts the runner (whose machine asks it to register the job,
warm its home's workers and start its notes), starts the demand reports,
answers the scheduler's expand and shrink calls, and tears everything down
when the job ends or fails. No torch here. Every remote call has a deadline
except a gang request, which waits for GPUs as long as the plan needs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import ray

from rlix.core import ClusterSpec, Stage
from rlix.core.types import Gpus
from rlix.exec.config import JobConfig
from rlix.exec.control.scheduler_link import SchedulerLink
from rlix.exec.data.recipe import Recipe
from rlix.exec.data.rewards import RewardError
from rlix.exec.error_text import describe
from rlix.exec.host_priority import background_start
from rlix.exec.job.step_runner import Parts, StepRunner
from rlix.exec.job.steplog import StepLog
from rlix.exec.messages import LOAD_WAIT, Emulation, JobProgress, JobResult
from rlix.exec.placement import actor_options
from rlix.exec.recorder import Recorder
from rlix.exec.records import JobStatus
from rlix.exec.rollout.control import RolloutControl
from rlix.exec.rollout.hooks import Deadlines, Hooks, Processes, WeightRule, ray_processes
from rlix.exec.rollout.pool import WorkerPool
from rlix.exec.rollout.queue import RolloutQueue
from rlix.exec.train.trainer_link import TrainerLink
from rlix.job import executor_stages, stage_role, warm_order
from rlix.metrics import Activity
from rlix.protocol import GpuMap, JobNote, Outcome, Stopped
from rlix.step import JobPlan, StepMachine, StreamSpec, job_plan


def job_streams(job: JobConfig, model_dir: str, recipe: Recipe | None = None) -> tuple[list[StreamSpec], list[Recipe]]:
    """One stream per adapter, or one for the job (``recipe``: a data job's, built in the driver)."""
    if job.kind == "multi_lora":
        specs = [StreamSpec(name=a.name, steps=a.steps, stop_reward=a.stop_reward) for a in job.adapters]
        return specs, [Recipe.for_adapter(job, i, model_dir) for i in range(len(job.adapters))]
    return [StreamSpec(name="", steps=job.steps)], [recipe or Recipe.for_job(job, model_dir)]


def plan_of(job: JobConfig, streams: list[StreamSpec], recipes: list[Recipe]) -> JobPlan:
    """The job as the step machine sees it: every step runs the GRPO stages, on the batches its recipes draw
    (each trajectory's prompt is a dataset row, so its length is predicted)."""
    stages = executor_stages(kl=job.algo.kl_coef > 0)
    size = lambda i, k: recipes[i].step_size(k)  # noqa: E731
    return job_plan(job, streams, stages=lambda i, k: stages, size=size, prompts=True, tries=job.limits.rollout_tries)


def job_phase(runner: StepRunner | None, link: SchedulerLink, arrival_s: float) -> tuple[str, float]:
    """What a running job waits for, and since when (seconds since the run started); "" while it works."""
    waiting = link.waiting_since()
    if waiting is not None:
        stage, since = waiting
        return (LOAD_WAIT if stage is Stage.INIT else f"waiting for GPUs ({stage.value})"), since
    if runner is None or runner.loading_since is None:
        return "registering", arrival_s
    if not runner.loaded:
        return "loading model", runner.loading_since
    return "", 0.0


def step_counts(runner: StepRunner | None) -> tuple[int, int]:
    """Steps an earlier run trained (a resumed job counts on from its checkpoint), and steps the job
    will have trained at its end; (0, 0) before its step machine exists."""
    if runner is None:
        return 0, 0
    rollouts = runner.machine.rollouts
    return rollouts.resumed_steps(), rollouts.resumed_steps() + rollouts.planned_steps()


def job_result(
    rec: Recorder, runner: StepRunner | None, status: JobStatus, error: str, bad_input: bool, arrival_s: float, now: float
) -> JobResult:
    """What the job's run returns: its records, and what its step machine planned."""
    rollouts = runner.machine.rollouts if runner is not None else None
    before, steps = step_counts(runner)
    result = rec.result(
        status,
        error=error,
        arrival_s=arrival_s,
        init_s=runner.init_s if runner is not None else 0.0,
        finish_s=now,
        planned=rollouts.produced if rollouts is not None else 0,
        steps_before=before,
        steps_planned=steps,
    )
    trainer = runner.trainer if runner is not None else None
    return replace(result, bad_input=bad_input, trainer_ranks=trainer.handle.world if trainer is not None else 0)


def job_note(pipeline_id: str, runner: StepRunner | None, rec: Recorder) -> JobNote:
    """The job's progress for ``rlix status``."""
    before, steps = step_counts(runner)
    loaded = runner is not None and runner.loaded
    return JobNote(pipeline_id=pipeline_id, loaded=loaded, steps_done=before + len(rec.steps), steps_total=steps)


def worker_options(cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap, name: str, slots_per_worker: int) -> dict:
    """Ray options of a rollout worker on ``gpus``: its placement, and a thread per generation slot plus
    room for control calls (so a sleep or a sync never waits for a slot)."""
    from rlix.exec.rollout.actor import worker_concurrency

    return {**actor_options(cluster, gpus, gpu_map, name), "max_concurrency": worker_concurrency(slots_per_worker)}


PROCESS_EXIT_S = 30.0  # seconds a killed process may take to be reported dead before its GPUs are given back anyway


async def end_processes(handles: list, timeout_s: float, procs: Processes) -> int:
    """Kill every process of ``handles`` and wait until the runtime reports each dead (a call to it fails
    with one of ``procs.died``), at most ``timeout_s`` seconds in all; returns how many were not
    confirmed dead in time."""
    for h in handles:
        procs.kill(h)

    async def gone(h) -> None:
        while True:
            try:
                await h.visible_devices.remote()
            except procs.died:
                return
            await asyncio.sleep(0.05)  # still answering: the kill has not landed yet

    if not handles:
        return 0
    done, pending = await asyncio.wait([asyncio.ensure_future(gone(h)) for h in handles], timeout=timeout_s)
    for task in pending:
        task.cancel()
    return len(pending)


def failure_line(exc: Exception, where: str | None) -> tuple[str, bool]:
    """The one line a failed job reports (its traceback kept in ``where``), and whether bad input caused
    it: the user's reward function failing is the user's to fix."""
    if isinstance(exc, RewardError):
        return f"RewardError: {exc.kept_in(where)}", True
    return describe(exc, where), False


def deadlines_of(limits) -> Deadlines:
    """The deadlines of a job's worker calls, from its config's ``limits``."""
    return Deadlines(wake_s=limits.wake_timeout_s, call_s=limits.call_timeout_s, rollout_s=limits.rollout_timeout_s)


class JobStopped(Exception):
    """The job was asked to stop (its run ends cancelled, keeping what it did); ``why``: who asked
    through the scheduler (None: its own run's driver, on Ctrl-C)."""

    def __init__(self, why: Stopped | None = None) -> None:
        super().__init__(why.line() if why is not None else "stopped")
        self.why = why


@ray.remote(num_cpus=0, max_concurrency=1000)
class PipelineCoordinator:
    def __init__(
        self,
        *,
        pipeline_id: str,
        job: JobConfig,
        model_dir: str,
        cluster: ClusterSpec,
        gpu_map: GpuMap,
        scheduler,
        emulation: Emulation,
        t0: float,
        recipe: Recipe | None = None,
        steplog: StepLog | None = None,
        heartbeat_s: float = 1.0,
        submitter: str = "",
    ) -> None:
        self.pid, self.job, self.model_dir = pipeline_id, job, model_dir
        self.cluster, self.gpu_map, self.emulation, self.t0 = cluster, gpu_map, emulation, t0
        self.streams, self.recipes = job_streams(job, model_dir, recipe)
        for stream, r in zip(self.streams, self.recipes):  # from this long-lived thread: they die with the coordinator
            r.rewards.start(steplog.reward_log(stream.name) if steplog is not None else None)
        self.machine = StepMachine(job.pipeline_spec(pipeline_id), plan_of(job, self.streams, self.recipes))
        self.spec = self.machine.spec  # as registered: with its open_limit
        self.steplog = steplog  # per-step metrics.jsonl (None: not written)
        self.heartbeat_s = heartbeat_s  # seconds between re-sent demand reports
        self.rec = Recorder(pipeline_id, observer=steplog.observe if steplog is not None else None)
        self.pool = WorkerPool(job.slots_per_worker)
        calls = {"recorder": self.rec, "limits": job.limits, "now": self.now, "submitter": submitter}
        self.link = SchedulerLink(
            pipeline_id=pipeline_id, sched=scheduler, workers=self.pool.rejoin_bundles, on_gone=self._fatal, **calls
        )
        self.queue = RolloutQueue(self.machine.book)  # the machine's book, in executor terms
        self.runner: StepRunner | None = None
        self.rollout: RolloutControl | None = None
        self.warm_later: tuple = ()  # bundles outside the home: warmed once the model is loaded
        self.status = JobStatus.PENDING
        self.arrival_s = 0.0
        self.failure: asyncio.Future | None = None
        self.wake_up: asyncio.Event | None = None  # the demand reporter re-checks
        self.tasks: list[asyncio.Task] = []
        self.registering: asyncio.Future | None = None  # the registration call, once made
        self.procs = ray_processes()  # how worker and trainer processes are killed, and told dead

    def now(self) -> float:
        return time.time() - self.t0

    # ================================================================ main

    async def run(self) -> JobResult:
        self.arrival_s = self.now()
        loop = asyncio.get_running_loop()
        self.failure, self.wake_up = loop.create_future(), asyncio.Event()
        self.status = JobStatus.RUNNING
        error, bad_input, stopped = "", False, None
        try:
            self.runner = self._runner()
            self.runner.start()  # registers the job (_register), then asks for its model load
            await asyncio.wait([self.runner.ended, self.failure], return_when=asyncio.FIRST_COMPLETED)
            if self.failure.done():
                raise self.failure.result()
            self.status = JobStatus.FINISHED
        except JobStopped as exc:  # stopped on request: what was done is kept and reported
            self.status, stopped = JobStatus.CANCELLED, exc.why
            error = stopped.line() if stopped is not None else ""
        except Exception as exc:  # one job's failure never reaches the others
            self.status = JobStatus.FAILED
            error, bad_input = failure_line(exc, self.steplog.dir if self.steplog is not None else None)
        finally:
            await self._teardown(error)
            if self.steplog is not None:
                self.steplog.close()
        result = job_result(self.rec, self.runner, self.status, error, bad_input, self.arrival_s, self.now())
        unlogged = (self.steplog.problem,) if self.steplog is not None and self.steplog.problem else ()
        return replace(result, stopped=stopped, warnings=unlogged)

    def _runner(self) -> StepRunner:
        hooks = Hooks(
            now=self.now,
            spawn=self._spawn,
            weights=self._weights,
            finished=lambda q, r: self.runner.trajectory_done(q, r),
            fatal=self._fatal,
            lost=self._lost,
            changed=self._changed,
            handoff=self._handoff,
        )
        rollout = {"pool": self.pool, "queue": self.queue, "recorder": self.rec, "model_dir": self.model_dir, "procs": self.procs}
        rule = WeightRule(
            full=self.job.lora_spec() is None, streaming=self.job.rollout_mode == "streaming", partial=self.job.partial_rollout
        )
        self.rollout = RolloutControl(hooks=hooks, deadlines=deadlines_of(self.job.limits), rule=rule, **rollout)
        parts = Parts(
            link=self.link,
            register=self._register,
            rollout=self.rollout,
            queue=self.queue,
            recorder=self.rec,
            start_trainer=self._start_trainer,
            loaded=self._on_loaded,
            steplog=self.steplog,
            crash_at_step=self.job.fault.crash_at_step,
            reward_timeout_s=self.job.limits.reward_timeout_s,
        )
        return StepRunner(self.machine, self.recipes, parts, now=self.now, fatal=self._fatal)

    async def _register(self) -> None:
        """Register with the scheduler (the machine's RegisterJob); then warm workers: a sleeping process (no GPU
        memory) on every bundle the job may use, so an expand is a wake plus a weight sync. Those in the home start
        now, while the trainer loads; the rest once it has. Then the job's notes start."""
        register = self.link.control(self.link.client.register(self.spec, ray.get_runtime_context().current_actor))
        self.registering = asyncio.ensure_future(register)
        await asyncio.shield(self.registering)  # teardown cancels this task, never the call: it waits for the answer
        bundles = await self.link.control(self.link.client.rollout_bundles())
        first, self.warm_later = warm_order(bundles, self.spec.home_gpus)
        self.rollout.warm(first)
        self._keep(self.link.note_loop(lambda: job_note(self.pid, self.runner, self.rec), self.heartbeat_s))

    def _on_loaded(self) -> None:
        """The model is loaded: report demand from now on (on change, and a heartbeat); warm the bundles outside the home."""
        self.rollout.warm(self.warm_later, spare=True)
        self._keep(self.link.report_loop(self.runner.demand, self._changes, self.heartbeat_s))

    def _keep(self, coro) -> None:
        """Run one of the job's loops until teardown (one that raises fails the job)."""
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._task_done)
        self.tasks.append(task)

    def _start_trainer(self) -> TrainerLink:
        gpus = self.spec.role(stage_role(self.spec, Stage.ACTOR_TRAIN)).gpus
        return TrainerLink.start_gang(
            self.job,
            self.model_dir,
            self.emulation,
            cluster=self.cluster,
            gpus=gpus,
            gpu_map=self.gpu_map,
            name=f"{self.pid}/trainer",
        )

    def _spawn(self, gpus: Gpus, first_process: bool, background: bool):
        from rlix.exec.rollout.actor import RolloutWorkerActor

        opts = worker_options(self.cluster, gpus, self.gpu_map, f"{self.pid}/rollout{gpus[0]}", self.job.slots_per_worker)
        fault = self.job.fault.for_worker(gpus[0], first_process)
        return RolloutWorkerActor.options(**(background_start(opts) if background else opts)).remote(
            self.emulation, self.job.lora_spec(), self.job.rollout_backend, self.job.vllm.value(), fault
        )

    async def _teardown(self, error: str) -> None:
        starts = self.rollout.starts() if self.rollout is not None else []
        for t in [*self.tasks, *(self.runner.tasks if self.runner is not None else ()), *starts]:
            t.cancel()
        ended = Outcome(self.status.value) if self.status in (JobStatus.FINISHED, JobStatus.CANCELLED) else Outcome.FAILED
        if self.registering is not None:  # stopped while registering: the scheduler answers before we leave
            await asyncio.wait([self.registering], timeout=self.job.limits.call_timeout_s)
        await self.link.last_note(job_note(self.pid, self.runner, self.rec))
        # Our processes go first, and are gone, before unregister lets the scheduler give our GPUs
        # to anyone else: a new holder never races a dying engine or trainer for device memory.
        await end_processes(self._ended_processes(), PROCESS_EXIT_S, self.procs)
        for r in self.recipes:
            r.rewards.close()
        try:
            await self.link.client.unregister(ended, error)
        except Exception:  # noqa: BLE001 -- the scheduler frees our GPUs on its own if it cannot reach us
            pass
        held = tuple(sorted(set(self.pool.held_gpus()) | set(self.link.gpus_held())))
        if held:
            self.rec.mark(self.now(), held, Activity.FREE, "")

    def _ended_processes(self) -> list:
        """Handles of every process the job started, for teardown to kill; the rollout control is told first (no worker lost)."""
        workers = self.rollout.end() if self.rollout is not None else []
        trainer = self.runner.trainer if self.runner is not None else None
        return [*workers, *(trainer.handle.actors if trainer is not None else ())]

    # ================================================================ hooks

    async def _changes(self) -> None:
        self.wake_up.clear()
        await self.wake_up.wait()

    def _changed(self) -> None:
        if self.wake_up is not None:
            self.wake_up.set()

    def _weights(self) -> tuple:
        trainer = self.runner.trainer if self.runner is not None else None
        return trainer.weights() if trainer is not None else (None, 0, ())

    def _handoff(self, version: int):
        trainer = self.runner.trainer if self.runner is not None else None
        return trainer.handoff_of(version) if trainer is not None else None

    def _task_done(self, task: asyncio.Task) -> None:
        """A loop of the job that raised fails the job (a dead reporter would leave it hanging)."""
        if not task.cancelled() and task.exception() is not None:
            self._fatal(task.exception())

    def _fatal(self, exc: BaseException) -> None:
        if self.failure is not None and not self.failure.done():
            self.failure.set_result(exc)

    def _lost(self, gpus: Gpus, failed: bool) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(self.link.lost(gpus[0], failed)))

    # ================================================================ plan calls, polls

    async def expand(self, gpus: Gpus) -> None:
        if self.status is JobStatus.RUNNING:
            await self.rollout.expand(gpus)

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        await self.rollout.shrink(gpus, reason)

    async def stop(self, why: Stopped | None = None) -> None:
        """Stop the job now (Ctrl-C, or ``why``: a cancel through the scheduler): its run returns what
        was done, status cancelled."""
        self._fatal(JobStopped(why))

    async def progress(self) -> JobProgress:
        held = len(self.pool.held_gpus()) + len(self.link.gpus_held())
        before, steps = step_counts(self.runner)
        phase, since = job_phase(self.runner, self.link, self.arrival_s)
        return self.rec.progress(self.status, steps=steps, gpus_held=held, before=before, phase=phase, phase_since_s=since)
