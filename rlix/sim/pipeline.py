"""Simulator layer: one RL job as SimPy processes.

A job arrives, loads its model (INIT), then runs each stream's steps: a
rollout batch on whatever workers the plan gives it, then the step's gang
stages in order (:func:`rlix.job.step_sequence`), then the weight update.
The staleness gate is the job model's (:func:`rlix.job.rollout_gate`).

Rollout modes:

- ``batch``: one rollout batch at a time; the next batch starts once this one
  is complete and the gate allows, so free slots wait for the slowest
  trajectory;
- ``streaming``: a batch is queued as soon as the gate allows, so a free slot
  starts a trajectory of the next batch at once; the trainer takes a batch
  as soon as its trajectories are complete.

A multi-LoRA job has one stream per adapter; their training ticks go one at
a time, first ready first. The pipeline talks to the simulation only through
:class:`Host` (a few callbacks), never the simulation object itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from rlix.core import Event, PipelineSpec, Register, ReleaseStage, ReportDemand, RequestStage, Stage, Unregister
from rlix.job import GangPhase, demand_report, gang_activity, remaining_path_s, rollout_gate, stage_gpus, stage_role, step_sequence
from rlix.metrics import PipelineTally, UsageRecorder
from rlix.sim.engine import Batch, EngineOptions, RolloutEngine
from rlix.sim.trace import PipelineModel, Step, speed_curve


@dataclass(frozen=True, kw_only=True)
class Host:
    """What a simulated pipeline may ask of the simulation."""

    env: simpy.Environment
    usage: UsageRecorder
    submit: Callable[[Event], None]  # hand a core event to the scheduler
    request_plan: Callable[[], None]  # plan at this instant (once)
    demand_changed: Callable[[str], None]  # report this pipeline's demand at the next tick
    waiting_changed: Callable[[str, bool], None]  # trajectories started / stopped waiting for a slot
    finished: Callable[[str], None]  # the pipeline is done
    park: Callable[[str, tuple[int, ...], float], None]  # a released gang's model stays on these GPUs (offload seconds owed)


@dataclass(kw_only=True)
class StepRecord:
    """When one step of one stream rolled out and trained (seconds)."""

    stream: int
    step: int
    version: int  # oldest weight version its rollout used (first segment of its oldest trajectory)
    rollout_start: float
    rollout_end: float = float("nan")
    train_end: float = float("nan")


class SimPipeline:
    def __init__(self, host: Host, model: PipelineModel, spec: PipelineSpec, streams: list[tuple[str, list[Step]]]) -> None:
        self.host = host
        self.env = host.env
        self.model = model
        self.pid = model.id
        self.spec = spec
        self.streams = streams
        self.lora = model.kind == "multi_lora"
        self.streaming = model.rollout_mode == "streaming"
        self.trained = [0] * len(streams)  # steps trained per stream = its weight version
        self.backlog = sum(len(step.trajectories) for _, steps in streams for step in steps)  # not yet produced
        self.grants: dict[Stage, simpy.Event] = {}
        self.train_turn = simpy.Resource(self.env, capacity=1)  # one training tick at a time
        self.tally = PipelineTally(arrival_s=model.arrival_s)
        self.history: list[StepRecord] = []
        self.done = False
        self.train_s = 0.0  # the longest step's stage seconds trained so far (log-probs and training), as the executor measures it
        options = EngineOptions(
            slots=model.slots_per_worker,
            weight_sync_s=model.switch.weight_sync_s,
            adapter_sync_s=model.switch.adapter_sync_s,
            requeue=model.preempt == "requeue",
            resume_s=model.switch.resume_s,
            lora=self.lora,
            streaming=self.streaming,
            partial=model.partial_rollout,
            speed=speed_curve(model.decode_speed),
        )
        self.engine = RolloutEngine(
            self.env,
            pipeline_id=self.pid,
            options=options,
            usage=host.usage,
            on_change=lambda: host.demand_changed(self.pid),
            on_pending=lambda waiting: host.waiting_changed(self.pid, waiting),
        )
        self.proc = self.env.process(self._run())

    # ------------------------------------------------------------ lifecycle

    def _run(self):
        env = self.env
        yield env.timeout(self.model.arrival_s)
        self.host.submit(Register(spec=self.spec))
        yield from self._gang(Stage.INIT, self.model.init_s)
        yield env.all_of([env.process(self._stream(i)) for i in range(len(self.streams))])
        self.done = True
        self.tally.finish_s = env.now
        self.tally.trajectories = self.engine.completed
        self.host.submit(Unregister(pipeline_id=self.pid))
        self.host.request_plan()
        self.host.finished(self.pid)

    def _stream(self, i: int):
        """Produce stream ``i``'s rollout batches as the staleness gate (and the mode) allows."""
        env = self.env
        _, steps = self.streams[i]
        rolled = [env.event() for _ in steps]
        trained = [env.event() for _ in steps]
        records: list[StepRecord] = []
        trainer = env.process(self._trainer(i, steps, rolled, trained, records))
        for k, step in enumerate(steps):
            gate = rollout_gate(k, self.model.staleness)
            if gate is not None:
                yield trained[gate]
            records.append(StepRecord(stream=i, step=k, version=self.trained[i], rollout_start=env.now))
            self.history.append(records[-1])
            self.backlog -= len(step.trajectories)
            batch = Batch(env, i, k, self.trained[i], len(step.trajectories), self.lora)
            self.engine.add_batch(batch, step.rollout())
            self.host.request_plan()  # demand went up: plan now, not at the next tick
            if self.streaming:  # the next batch may start at once; the trainer hears of this one when it completes
                batch.done.callbacks.append(lambda _, batch=batch: self._rolled_out(batch, records, rolled))
            else:  # one rollout batch at a time
                yield batch.done
                self._rolled_out(batch, records, rolled)
        yield trainer

    def _rolled_out(self, batch: Batch, records: list[StepRecord], rolled: list[simpy.Event]) -> None:
        rec = records[batch.step]
        rec.rollout_end = self.env.now
        rec.version = int(min(batch.oldest, rec.version))
        rolled[batch.step].succeed()

    def _trainer(self, i: int, steps: list[Step], rolled, trained, records: list[StepRecord]):
        env = self.env
        for k, step in enumerate(steps):
            yield rolled[k]
            if not self.engine.pending and not self.engine.running:
                self.host.request_plan()  # rollout GPUs are free now: lend them at once
            with self.train_turn.request() as turn:
                yield turn
                sequence = step_sequence(step.stages)
                for j, stage in enumerate(sequence):
                    keep = self.model.stage_cost.share_load and j + 1 < len(sequence) and self._same_gpus(stage, sequence[j + 1])
                    yield from self._gang(stage, step.stages[stage], keep_loaded=keep)
            self.trained[i] = k + 1
            self.engine.set_version(i, k + 1)
            records[k].train_end = env.now
            self.train_s = max(self.train_s, sum(step.stages.values()))
            trained[k].succeed()
            self.tally.step_latencies.append(env.now - records[k].rollout_start)

    # ------------------------------------------------------------ gang stages

    def _same_gpus(self, a: Stage, b: Stage) -> bool:
        return stage_gpus(self.spec, a) == stage_gpus(self.spec, b)

    def _gang(self, stage: Stage, seconds: float, *, keep_loaded: bool = False):
        """Request ``stage``, wait for the grant, load, work, offload, release.

        A grant on GPUs where this job's previous stage left its model
        (``warm``) skips the load; with ``keep_loaded`` the offload is left
        to whoever takes the GPUs next (the next stage of this step skips it).
        """
        env = self.env
        usage = self.host.usage
        granted = self.grants[stage] = env.event()
        role = None if stage is Stage.INIT else stage_role(self.spec, stage)  # INIT: the job's init GPUs
        self.host.submit(RequestStage(pipeline_id=self.pid, stage=stage, role=role))
        self.host.request_plan()
        gpus, gpus_ready, warm = yield granted
        if stage is Stage.INIT:
            self.tally.admitted_s = env.now  # admitted: the job holds GPUs from now on
        sw = self.model.switch
        if stage is Stage.INIT:  # model load: the whole stage is switching
            usage.set(gpus, env.now, gang_activity(stage, GangPhase.LOAD), self.pid, stage.value)
            yield env.timeout(max(gpus_ready - env.now, 0.0) + seconds)
        else:
            if not warm:
                usage.set(gpus, env.now, gang_activity(stage, GangPhase.LOAD), self.pid, stage.value)
                yield env.timeout(max(gpus_ready - env.now, 0.0) + sw.load_s)
            usage.set(gpus, env.now, gang_activity(stage, GangPhase.WORK), self.pid, stage.value)
            yield env.timeout(seconds)
            if not keep_loaded:
                usage.set(gpus, env.now, gang_activity(stage, GangPhase.OFFLOAD), self.pid, stage.value)
                yield env.timeout(sw.offload_s)
        usage.set(gpus, env.now, gang_activity(stage, GangPhase.RELEASED))
        if keep_loaded:
            self.host.park(self.pid, gpus, sw.offload_s)
        del self.grants[stage]
        self.host.submit(ReleaseStage(pipeline_id=self.pid, stage=stage))
        self.host.request_plan()

    def grant(self, stage: Stage, gpus: tuple[int, ...], gpus_ready: float, warm: bool = False) -> None:
        self.grants[stage].succeed((gpus, gpus_ready, warm))

    # ------------------------------------------------------------ rollout

    def new_worker_versions(self) -> tuple[dict[int, int], float]:
        """Versions a worker loads when it (re)starts, and the extra sync seconds."""
        sw = self.model.switch
        trained = [v for v in self.trained if v > 0]
        if self.lora:
            extra = sw.adapter_sync_s * len(trained)
        else:
            extra = sw.weight_sync_s if trained else 0.0
        return {i: v for i, v in enumerate(self.trained)}, extra

    def demand_report(self) -> ReportDemand:
        pending, loads = self.engine.demand()
        return demand_report(
            pipeline_id=self.pid,
            pending=pending,
            loads=loads,
            open_trajectories=self.engine.open_n,
            backlog=self.backlog,
            trajectory_s=self.engine.mean_trajectory_s,
            switch_s=self.model.switch.load_s + self.model.switch.weight_sync_s,  # wake + weight sync of one worker
            path_s=self.path_s(),
        )

    def path_s(self) -> float:
        """The longest chain still ahead among this job's streams, from the figures measured so far."""
        longest, staleness = self.engine.longest_s, self.model.staleness
        return max(
            remaining_path_s(len(steps) - done, staleness, longest_s=longest, train_s=self.train_s, streaming=self.streaming)
            for (_, steps), done in zip(self.streams, self.trained)
        )
