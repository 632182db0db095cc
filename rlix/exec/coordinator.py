"""Executor layer: one pipeline's coordinator (a light async Ray actor).

It runs the job's steps (rollout -> old/reference log-probs -> training ->
weight update), asking the scheduler actor for each gang stage and
releasing it after, and reports rollout demand so the plan gives it rollout
workers. It carries out the scheduler's ``expand``/``shrink`` calls on its
own workers: a shrunk worker's in-flight trajectories come back aborted and
are continued elsewhere from where they stopped (never lost); a woken worker
loads the newest weights from the trainer's CPU cache. No torch here.

A job is one or more *streams* of steps: a full-finetune job has one; a
multi-LoRA job has one per adapter (own recipe, step count, stop condition
and version), sharing the rollout workers and the trainer. Training ticks
run one at a time, to the adapter whose batch was ready first (the tick lock
is FIFO); after its tick only that adapter is pushed to live workers, and a
woken worker gets the base plus every adapter's newest version.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import time
import traceback
from dataclasses import dataclass, field, replace

import ray

from rlix.core import ClusterSpec, ReportDemand, Role, Stage, WorkerLoad
from rlix.core.types import Gpus
from rlix.exec.config import JobConfig
from rlix.exec.placement import actor_options
from rlix.exec.recipe import Recipe, Trajectory, continuation
from rlix.exec.records import (
    ActivityChange,
    GrantReply,
    JobProgress,
    JobResult,
    JobStatus,
    StepRecord,
    SwitchKind,
    SwitchRecord,
    TrajRecord,
)
from rlix.exec.rollout import Emulation, GenResult
from rlix.metrics import Activity


class SlotState(enum.Enum):
    ASLEEP = "asleep"  # no GPUs (never started, or shrunk)
    STARTING = "starting"  # loading / waking
    AWAKE = "awake"  # running trajectories
    DRAINING = "draining"  # being shrunk


@dataclass(kw_only=True)
class WorkerSlot:
    """A rollout worker of this pipeline on one bundle (its process outlives shrinks)."""

    gpus: Gpus
    actor: object | None = None
    state: SlotState = SlotState.ASLEEP
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    inflight: dict[int, asyncio.Task] = field(default_factory=dict)
    starting: asyncio.Task | None = None  # process start-up (no GPU memory), shared by callers
    prepared: bool = False
    generation: int = 0  # bumped by every expand/shrink: a stale expand stops


@dataclass(kw_only=True)
class Queued:
    """A trajectory waiting for a slot (possibly the rest of an aborted one)."""

    traj: Trajectory
    request: object  # GenRequest to send next
    gen_s: float = 0.0
    segments: int = 0
    min_version: int = 1 << 30


@dataclass(kw_only=True)
class Stream:
    """One stream of steps: the whole job (full finetune, ``name`` "") or one LoRA adapter."""

    name: str
    recipe: Recipe
    steps: int  # steps end before this index
    staleness: int
    stop_reward: float | None = None
    start: int = 0  # first step (a resumed adapter continues from its checkpoint)
    version: int = 0  # newest version the rollout side may generate with (gates batches)
    snapshot_ref: object | None = None  # multi-LoRA: the adapter's newest CPU snapshot
    snapshot_version: int = 0
    stopped: bool = False
    ready: asyncio.Queue = field(default_factory=asyncio.Queue)  # produced steps, then None


class FaultInjected(RuntimeError):
    pass


@ray.remote(num_cpus=0, max_concurrency=1000)
class PipelineCoordinator:
    def __init__(self, *, pipeline_id: str, job: JobConfig, model_dir: str, cluster: ClusterSpec, nodes: list[str], scheduler, emulation: Emulation, t0: float) -> None:
        self.pid = pipeline_id
        self.job = job
        self.model_dir = model_dir
        self.cluster = cluster
        self.nodes = nodes
        self.sched = scheduler
        self.emulation = emulation
        self.t0 = t0
        self.spec = job.pipeline_spec(pipeline_id)
        if job.kind == "multi_lora":
            self.streams = [
                Stream(name=a.name, recipe=Recipe.for_adapter(job, i, model_dir), steps=a.steps, staleness=job.staleness, stop_reward=a.stop_reward)
                for i, a in enumerate(job.adapters)
            ]
        else:
            self.streams = [Stream(name="", recipe=Recipe.for_job(job, model_dir), steps=job.steps, staleness=job.staleness)]
        self.tick_lock: asyncio.Lock | None = None
        self.slots: dict[int, WorkerSlot] = {}
        self.queue: collections.deque[Queued] = collections.deque()
        # per (stream name, step)
        self.results: dict[tuple[str, int], dict[int, GenResult]] = {}
        self.traj_records: dict[int, TrajRecord] = {}
        self.finished_gen_s = 0.0  # generation seconds of the finished trajectories (mean reported as demand)
        self.step_trajs: dict[tuple[str, int], list[Trajectory]] = {}
        self.step_started: dict[tuple[str, int], float] = {}
        self.step_done: dict[tuple[str, int], asyncio.Event] = {}
        self.trainer = None
        self.snapshot_version = 0  # newest full (or base) version in the CPU cache
        self.snapshot_ref = None
        self.version_changed: asyncio.Condition | None = None
        self.demand_dirty: asyncio.Event | None = None
        self.status = JobStatus.PENDING
        self.steps: list[StepRecord] = []
        self.switches: list[SwitchRecord] = []
        self.events: list[ActivityChange] = []
        self.gang_gpus: dict[Stage, Gpus] = {}
        self.requeued = 0
        self.preemptions = 0
        self.overhead_s = 0.0
        self.calls = 0
        self.gpu_wait_s = 0.0
        self.arrival_s = 0.0
        self.init_s = 0.0
        self.tasks: list[asyncio.Task] = []

    def now(self) -> float:
        return time.time() - self.t0

    # ================================================================ main

    async def run(self) -> JobResult:
        self.arrival_s = self.now()
        self.version_changed = asyncio.Condition()
        self.demand_dirty = asyncio.Event()
        self.tick_lock = asyncio.Lock()
        self.status = JobStatus.RUNNING
        error = ""
        try:
            me = ray.get_runtime_context().current_actor
            await self._control(self.sched.register.remote(self.spec, me))
            await self._init()
            loop = asyncio.get_running_loop()
            self.tasks = [loop.create_task(self._report_loop())] + [loop.create_task(self._produce(s)) for s in self.streams]
            trainers = [loop.create_task(self._train_loop(s)) for s in self.streams]
            self.tasks += trainers
            await asyncio.gather(*trainers)
            self.status = JobStatus.FINISHED
        except Exception as exc:  # one job's failure never reaches the others
            self.status = JobStatus.FAILED
            error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            await self._teardown()
        return self._result(error)

    async def _init(self) -> None:
        t0 = self.now()
        gpus = await self._acquire(Stage.INIT)
        self._mark(gpus, Activity.SWITCH, "init")
        from rlix.exec.trainer_gang import TrainerGang
        from rlix.exec.workers import TrainerJob

        bundles = await self._control(self.sched.rollout_bundles.remote(self.pid))
        job = self.job
        adapter_cfgs = tuple((a.name, a.algo.value(a.seed)) for a in job.adapters or ())
        trainer_job = TrainerJob(
            model_path=self.model_dir, cfg=job.algo.value(job.seed), emulation=self.emulation, lora=job.lora_spec(), adapter_cfgs=adapter_cfgs, checkpoint_dir=job.checkpoint_dir
        )
        # One data-parallel rank per GPU of the actor_train mapping (FSDP2 when more than one).
        self.trainer = TrainerGang.start(self.cluster, self.spec.role(Role.ACTOR_TRAIN).gpus, self.nodes, f"{self.pid}/trainer", trainer_job)
        await self.trainer.started  # a rank that failed to start says why here
        self.snapshot_ref = self.trainer.snapshot()
        versions = await self.trainer.adapter_versions()  # a resumed adapter continues from its checkpoint
        for s in self.streams:
            if s.name:
                s.start = s.version = s.snapshot_version = versions[s.name]
                s.snapshot_ref = self.trainer.adapter_snapshot(s.name)
        # Rollout processes on home bundles start now, asleep (imports and config only, no
        # GPU memory); an expand then only builds the engine and loads the newest weights.
        # Bundles borrowed from other jobs' homes are started on their first expand.
        home = set(self.spec.home_gpus)
        prepared = [self._start_worker(tuple(b)) for b in bundles if home.issuperset(b)]
        await asyncio.gather(self.snapshot_ref, *prepared)  # the trainer is up and v0 is cached on the CPU
        await self._release(Stage.INIT, gpus)
        self.init_s = self.now() - t0

    async def _start_worker(self, gpus: Gpus) -> None:
        """Start the bundle's worker process (once); it touches no GPU memory."""
        slot = self.slots.setdefault(gpus[0], WorkerSlot(gpus=gpus))
        if slot.starting is None:
            slot.starting = asyncio.get_running_loop().create_task(self._prepare(slot))
        await asyncio.shield(slot.starting)

    async def _prepare(self, slot: WorkerSlot) -> None:
        from rlix.exec.workers import RolloutWorkerActor

        opts = actor_options(self.cluster, slot.gpus, self.nodes, f"{self.pid}/rollout{slot.gpus[0]}")
        slot.actor = RolloutWorkerActor.options(**opts).remote(self.emulation, self.job.lora_spec(), self.job.rollout_backend, self.job.vllm.value())
        t = self.now()
        await slot.actor.prepare.remote(self.model_dir)
        self.switches.append(SwitchRecord(kind=SwitchKind.COLD_START, t=t, seconds=self.now() - t))
        slot.prepared = True

    async def _teardown(self) -> None:
        for t in self.tasks:
            t.cancel()
        try:
            await self.sched.unregister.remote(self.pid)  # shrinks our workers through the plan
        except Exception:
            pass
        for slot in self.slots.values():
            if slot.actor is not None:
                ray.kill(slot.actor)
        if self.trainer is not None:
            self.trainer.kill()
        held = tuple(sorted({g for s in self.slots.values() if s.state is not SlotState.ASLEEP for g in s.gpus} | {g for gp in self.gang_gpus.values() for g in gp}))
        if held:
            self._mark(held, Activity.FREE, "")

    # ================================================================ steps

    async def _produce(self, stream: Stream) -> None:
        """Queue each step's trajectories once the staleness bound allows (until the stream stops)."""
        for step in range(stream.start, stream.steps):
            async with self.version_changed:
                await self.version_changed.wait_for(lambda: stream.version >= step - stream.staleness or stream.stopped)
            if stream.stopped:
                break
            key = (stream.name, step)
            trajs = stream.recipe.trajectories(step)
            self.step_trajs[key] = trajs
            self.results[key] = {}
            self.step_started[key] = self.now()
            self.step_done.setdefault(key, asyncio.Event())
            self.queue.extend(Queued(traj=t, request=t.request) for t in trajs)
            stream.ready.put_nowait(step)
            self.demand_dirty.set()
            self._dispatch()
        stream.ready.put_nowait(None)

    async def _train_loop(self, stream: Stream) -> None:
        """Train every step the stream produced, in order."""
        while (step := await stream.ready.get()) is not None:
            await self._train_step(stream, step)

    async def _train_step(self, stream: Stream, step: int) -> None:
        if self.job.fault.crash_at_step == step:
            raise FaultInjected(f"fault.crash_at_step={step}")
        key = (stream.name, step)
        await self.step_done.setdefault(key, asyncio.Event()).wait()
        async with self.tick_lock:  # one tick at a time; asyncio.Lock wakes waiters first-ready first
            await self._tick(stream, step)

    async def _tick(self, stream: Stream, step: int) -> None:
        key = (stream.name, step)
        trajs = self.step_trajs[key]
        results = self.results.pop(key)
        scored = stream.recipe.score(trajs, results)
        samples = list(scored.samples)
        stages: list[tuple[str, float]] = []
        adapter = stream.name
        old, secs = await self._gang(Stage.OLD_LOGPROBS, None, lambda: self.trainer.logprobs(samples, False, adapter))
        stages.append((Stage.OLD_LOGPROBS.value, secs))
        samples = [replace(s, old_logprobs=o) for s, o in zip(samples, old)]
        if self.job.algo.kl_coef > 0:
            role = Role.REFERENCE if "reference" in self.job.roles else Role.ACTOR_TRAIN
            ref, secs = await self._gang(Stage.REF_LOGPROBS, role, lambda: self.trainer.logprobs(samples, True))
            stages.append((Stage.REF_LOGPROBS.value, secs))
            samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, ref)]
        _, secs = await self._gang(Stage.ACTOR_TRAIN, None, lambda: self.trainer.train(samples, adapter))
        stages.append((Stage.ACTOR_TRAIN.value, secs))
        if adapter:
            stream.snapshot_ref = self.trainer.adapter_snapshot(adapter)
            await stream.snapshot_ref
            if self.job.checkpoint_dir:
                await self.trainer.save_adapter(adapter)
        else:
            self.snapshot_ref = self.trainer.snapshot()
            await self.snapshot_ref
            self.snapshot_version = step + 1
        stream.snapshot_version = step + 1
        await self._sync_live_workers(stream)  # before the bump: the next batch never meets old weights
        async with self.version_changed:
            stream.version = step + 1
            if stream.stop_reward is not None and scored.mean_reward >= stream.stop_reward:
                stream.stopped = True  # its stop condition holds: produce no further steps
            self.version_changed.notify_all()
        recs = [self.traj_records[t.request.traj_id] for t in trajs]
        self.steps.append(
            StepRecord(
                stream=stream.name,
                step=step,
                started_s=self.step_started[key],
                finished_s=self.now(),
                mean_reward=scored.mean_reward,
                mean_tokens=sum(r.tokens for r in recs) / len(recs),
                stages=tuple(stages),
                min_weight_version=min(r.weight_version for r in recs),
            )
        )

    async def _gang(self, stage: Stage, role: Role | None, work):
        """Run ``work`` on the trainer while ``stage`` holds its GPUs; returns (value, compute s)."""
        gpus = await self._acquire(stage, role)
        self._mark(gpus, Activity.SWITCH, stage.value)
        t = self.now()
        reload_s = await self.trainer.reload()
        self.switches.append(SwitchRecord(kind=SwitchKind.STAGE_LOAD, t=t, seconds=self.now() - t))
        self._mark(gpus, Activity.WORK, stage.value)
        t_work = self.now()
        value = await work()
        secs = self.now() - t_work
        self._mark(gpus, Activity.SWITCH, stage.value)
        t = self.now()
        await self.trainer.offload()
        self.switches.append(SwitchRecord(kind=SwitchKind.STAGE_OFFLOAD, t=t, seconds=self.now() - t))
        await self._release(stage, gpus)
        del reload_s
        return value, secs

    async def _acquire(self, stage: Stage, role: Role | None = None) -> Gpus:
        t = self.now()
        reply: GrantReply = await self.sched.request.remote(self.pid, stage, role)
        waited = self.now() - t
        self.overhead_s += max(0.0, waited - reply.queued_s)
        self.gpu_wait_s += reply.queued_s
        self.calls += 1
        self.gang_gpus[stage] = reply.gpus
        return reply.gpus

    async def _release(self, stage: Stage, gpus: Gpus) -> None:
        self._mark(gpus, Activity.FREE, "")  # before the call: the next holder may start right after
        self.gang_gpus.pop(stage, None)
        await self._control(self.sched.release.remote(self.pid, stage))

    async def _control(self, ref) -> object:
        """A blocking control-plane call; all of its time counts as overhead."""
        t = self.now()
        value = await ref
        self.overhead_s += self.now() - t
        self.calls += 1
        return value

    # ================================================================ rollout

    def _dispatch(self) -> None:
        slots_per = self.job.slots_per_worker
        for first in sorted(self.slots):
            slot = self.slots[first]
            while slot.state is SlotState.AWAKE and self.queue and len(slot.inflight) < slots_per:
                q = self.queue.popleft()
                if not slot.inflight:
                    self._mark(slot.gpus, Activity.WORK, Stage.ROLLOUT.value)
                task = asyncio.get_running_loop().create_task(self._run_traj(slot, q))
                slot.inflight[q.traj.request.traj_id] = task
        self.demand_dirty.set()

    async def _run_traj(self, slot: WorkerSlot, q: Queued) -> None:
        traj_id = q.traj.request.traj_id
        try:
            result: GenResult = await slot.actor.generate.remote(q.request)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            result = None  # worker died: continue the trajectory elsewhere, as it was
        slot.inflight.pop(traj_id, None)
        if not slot.inflight and slot.state is SlotState.AWAKE:
            self._mark(slot.gpus, Activity.HELD, Stage.ROLLOUT.value)
        # Only a segment that produced tokens says which weights the trajectory used
        # (a sleeping worker hands the request back untouched, with no version).
        produced = result is not None and len(result.token_ids) > len(q.request.prefix_ids)
        if result is None or result.aborted or not result.finished:
            if produced:
                q.request = continuation(q.traj.request, result)
                q.gen_s += result.gen_s
                q.segments += 1
                q.min_version = min(q.min_version, result.weight_version)
            self.requeued += 1
            self.queue.appendleft(q)
        else:
            self._finish(q, result, produced)
        self._dispatch()

    def _finish(self, q: Queued, result: GenResult, produced: bool) -> None:
        step = q.traj.step
        key = (q.traj.request.adapter, step)
        traj_id = q.traj.request.traj_id
        self.results[key][traj_id] = result
        record = self.traj_records[traj_id] = TrajRecord(
            traj_id=traj_id,
            stream=key[0],
            step=step,
            gen_s=q.gen_s + result.gen_s,
            segments=q.segments + 1,
            tokens=len(result.token_ids),
            weight_version=min(q.min_version, result.weight_version) if produced else q.min_version,
        )
        self.finished_gen_s += record.gen_s
        if len(self.results[key]) == len(self.step_trajs[key]):
            self.step_done.setdefault(key, asyncio.Event()).set()

    async def _report_loop(self) -> None:
        """Send demand when it changes (coalesced), and a heartbeat every second."""
        last = None
        while True:
            try:
                await asyncio.wait_for(self.demand_dirty.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                last = None  # heartbeat: resend even if unchanged
            self.demand_dirty.clear()
            loads = tuple(WorkerLoad(first_gpu=f, active=len(s.inflight)) for f, s in sorted(self.slots.items()) if s.state is SlotState.AWAKE)
            batch = sum(s.recipe.batch_size for s in self.streams if not s.stopped) or self.streams[0].recipe.batch_size  # sum over adapters
            mean_s = self.finished_gen_s / len(self.traj_records) if self.traj_records else 0.0
            report = ReportDemand(pipeline_id=self.pid, pending=len(self.queue), loads=loads, batch_size=batch, trajectory_s=round(mean_s, 2))
            if report != last:
                await self.sched.report.remote(report)
                last = report
            await asyncio.sleep(0.02)  # coalesce bursts of changes

    # ================================================================ plan calls

    async def expand(self, gpus: Gpus) -> None:
        """The plan gave us a rollout worker on ``gpus``: start (if needed) and wake it."""
        slot = self.slots.setdefault(gpus[0], WorkerSlot(gpus=gpus))
        if self.status is not JobStatus.RUNNING:
            return
        slot.generation += 1
        gen = slot.generation
        slot.state = SlotState.STARTING
        self._mark(gpus, Activity.SWITCH, Stage.ROLLOUT.value)
        if not slot.prepared:
            await self._start_worker(gpus)  # a bundle borrowed for the first time: cold start
        async with slot.lock:
            if slot.generation != gen or slot.state is not SlotState.STARTING:
                return  # shrunk while the process was starting
            t = self.now()
            try:
                timing = await slot.actor.wake.remote(self.snapshot_ref, *self._adapter_refs())
            except ray.exceptions.RayActorError:  # the worker process died: start afresh next time
                slot.actor, slot.prepared, slot.starting = None, False, None
                slot.state = SlotState.ASLEEP
                self._mark(gpus, Activity.FREE, "")
                return
            while timing.version < self.snapshot_version:  # a newer version appeared while waking
                timing = await slot.actor.update_weights.remote(self.snapshot_ref)
            for s in self.streams:
                while s.name and timing.adapter_version(s.name) < s.snapshot_version:
                    timing = await slot.actor.update_adapter.remote(s.snapshot_ref)
            self.switches.append(SwitchRecord(kind=SwitchKind.WAKE, t=t, seconds=self.now() - t, synced_bytes=timing.synced_bytes))
            slot.state = SlotState.AWAKE
            self._mark(gpus, Activity.HELD, Stage.ROLLOUT.value)
            self._dispatch()

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        """The plan takes ``gpus`` back: abort, drop weights, re-queue what was running."""
        slot = self.slots.get(gpus[0])
        if slot is None:
            return
        slot.generation += 1
        if slot.state is SlotState.STARTING and not slot.prepared:
            # Still starting its process: nothing is on the GPUs yet, give them back now.
            slot.state = SlotState.ASLEEP
            self._mark(gpus, Activity.FREE, "")
            return
        async with slot.lock:
            if slot.state is SlotState.ASLEEP:
                return
            slot.state = SlotState.DRAINING
            self._mark(gpus, Activity.SWITCH, Stage.ROLLOUT.value)
            t = self.now()
            if slot.inflight:
                self.preemptions += 1
            try:
                await slot.actor.sleep.remote()  # aborts in-flight generations first
            except ray.exceptions.RayActorError:
                slot.actor, slot.prepared, slot.starting = None, False, None
            if slot.inflight:
                await asyncio.gather(*slot.inflight.values(), return_exceptions=True)
            self.switches.append(SwitchRecord(kind=SwitchKind.SLEEP, t=t, seconds=self.now() - t))
            slot.state = SlotState.ASLEEP
            self._mark(gpus, Activity.FREE, "")
            self.demand_dirty.set()

    def _adapter_refs(self) -> list:
        """Every adapter's newest snapshot (multi-LoRA; empty for full finetune)."""
        return [s.snapshot_ref for s in self.streams if s.name and s.snapshot_ref is not None]

    async def _sync_live_workers(self, stream: Stream) -> None:
        """Push the stream's new version to awake workers only (sleeping ones get it on wake)."""
        live = [s for s in self.slots.values() if s.state is SlotState.AWAKE]
        await asyncio.gather(*(self._sync(s, stream) for s in live), return_exceptions=True)

    async def _sync(self, slot: WorkerSlot, stream: Stream) -> None:
        async with slot.lock:
            if slot.state is not SlotState.AWAKE:
                return
            t = self.now()
            if stream.name:
                timing = await slot.actor.update_adapter.remote(stream.snapshot_ref)
            else:
                timing = await slot.actor.update_weights.remote(self.snapshot_ref)
            if timing.synced_bytes:
                self.switches.append(SwitchRecord(kind=SwitchKind.SYNC, t=t, seconds=self.now() - t, synced_bytes=timing.synced_bytes))

    # ================================================================ reporting

    def _mark(self, gpus: Gpus, activity: Activity, stage: str) -> None:
        self.events.append(ActivityChange(t=self.now(), gpus=tuple(gpus), activity=activity, pipeline_id=self.pid if activity is not Activity.FREE else "", stage=stage))

    async def progress(self) -> JobProgress:
        events, self.events = self.events, []
        held = sum(len(s.gpus) for s in self.slots.values() if s.state is not SlotState.ASLEEP) + sum(len(g) for g in self.gang_gpus.values())
        return JobProgress(
            pipeline_id=self.pid,
            status=self.status,
            step=len(self.steps),
            steps=sum(s.steps - s.start for s in self.streams if not s.stopped) + sum(1 for r in self.steps if self._stream(r.stream).stopped),
            last_reward=self.steps[-1].mean_reward if self.steps else None,
            gpus_held=held,
            requeued=self.requeued,
            events=tuple(events),
        )

    def _stream(self, name: str) -> Stream:
        return next(s for s in self.streams if s.name == name)

    def _result(self, error: str) -> JobResult:
        lost = 0
        if self.status is JobStatus.FINISHED:
            planned = sum(len(v) for v in self.step_trajs.values())
            lost = planned - len(self.traj_records)
        events, self.events = self.events, []
        return JobResult(
            pipeline_id=self.pid,
            status=self.status,
            error=error,
            arrival_s=self.arrival_s,
            init_s=self.init_s,
            finish_s=self.now(),
            steps=tuple(self.steps),
            trajectories=tuple(sorted(self.traj_records.values(), key=lambda r: r.traj_id)),
            switches=tuple(self.switches),
            requeued=self.requeued,
            lost=lost,
            preemptions=self.preemptions,
            control_overhead_s=self.overhead_s,
            control_calls=self.calls,
            gpu_wait_s=self.gpu_wait_s,
            trainer_ranks=self.trainer.world if self.trainer is not None else 0,
            events=tuple(events),
        )
