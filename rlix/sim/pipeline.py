"""Simulator layer: one RL job as SimPy processes.

A job arrives, loads its model (INIT), then runs each stream's steps: a
rollout batch on whatever workers the plan gives it, then the step's gang
stages in order, then the weight update. With staleness bound ``s``, the
rollout of step ``k`` may start once step ``k - 1 - s`` is trained, so it
overlaps training by at most ``s`` steps. A multi-LoRA job has one stream per
adapter; their training ticks go one at a time, first ready first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from rlix.core import Register, ReleaseStage, RequestStage, Role, Stage, Unregister
from rlix.metrics import Activity, PipelineTally
from rlix.sim.engine import Batch, RolloutEngine
from rlix.sim.trace import STEP_STAGES, PipelineModel, Step

if TYPE_CHECKING:
    from rlix.sim.simulator import Simulation


@dataclass(kw_only=True)
class StepRecord:
    """When one step of one stream rolled out and trained (seconds)."""

    stream: int
    step: int
    version: int  # weight version its rollout used
    rollout_start: float
    rollout_end: float = float("nan")
    train_end: float = float("nan")


class SimPipeline:
    def __init__(self, sim: Simulation, model: PipelineModel, streams: list[tuple[str, list[Step]]]) -> None:
        self.sim = sim
        self.env = sim.env
        self.model = model
        self.pid = model.id
        self.spec = sim.trace.spec(model)
        self.streams = streams
        self.lora = model.kind == "multi_lora"
        self.trained = [0] * len(streams)  # steps trained per stream = its weight version
        self.backlog = sum(len(step.trajectories) for _, steps in streams for step in steps)  # not yet started
        self.grants: dict[Stage, simpy.Event] = {}
        self.train_turn = simpy.Resource(self.env, capacity=1)  # one training tick at a time
        self.tally = PipelineTally(arrival_s=model.arrival_s)
        self.history: list[StepRecord] = []
        self.done = False
        self.engine = RolloutEngine(
            self.env,
            pipeline_id=self.pid,
            slots=model.slots_per_worker,
            usage=sim.usage,
            weight_sync_s=model.switch.weight_sync_s,
            adapter_sync_s=model.switch.adapter_sync_s,
            requeue=model.preempt == "requeue",
            resume_s=model.switch.resume_s,
            on_change=self._demand_changed,
            on_pending=sim.pending_changed,
        )
        self.proc = self.env.process(self._run())

    # ------------------------------------------------------------ lifecycle

    def _run(self):
        env = self.env
        yield env.timeout(self.model.arrival_s)
        self.sim.submit(Register(spec=self.spec))
        yield from self._gang(Stage.INIT, self.model.init_s, switching=True)
        yield env.all_of([env.process(self._stream(i)) for i in range(len(self.streams))])
        self.done = True
        self.tally.finish_s = env.now
        self.tally.trajectories = self.engine.completed
        self.sim.submit(Unregister(pipeline_id=self.pid))
        self.sim.request_plan()
        self.sim.pipeline_finished(self)

    def _stream(self, i: int):
        env = self.env
        _, steps = self.streams[i]
        stale = self.model.staleness
        rolled = [env.event() for _ in steps]
        trained = [env.event() for _ in steps]
        records: list[StepRecord] = []
        trainer = env.process(self._trainer(i, steps, rolled, trained, records))
        for k, step in enumerate(steps):
            gate = k - 1 - stale  # this step's rollout waits for that step's training
            if gate >= 0:
                yield trained[gate]
            records.append(StepRecord(stream=i, step=k, version=self.trained[i], rollout_start=env.now))
            self.history.append(records[-1])
            self.backlog -= len(step.trajectories)
            batch = Batch(env, i, k, self.trained[i], len(step.trajectories), self.lora)
            self.engine.add_batch(batch, step.trajectories)
            self.sim.request_plan()  # demand went up: plan now, not at the next tick
            yield batch.done
            records[k].rollout_end = env.now
            rolled[k].succeed()
        yield trainer

    def _trainer(self, i: int, steps: list[Step], rolled, trained, records: list[StepRecord]):
        env = self.env
        for k, step in enumerate(steps):
            yield rolled[k]
            if not self.engine.pending and not self.engine.running:
                self.sim.request_plan()  # rollout GPUs are free now: lend them at once
            with self.train_turn.request() as turn:
                yield turn
                for stage in STEP_STAGES:
                    if stage in step.stages:
                        yield from self._gang(stage, step.stages[stage])
            self.trained[i] = k + 1
            records[k].train_end = env.now
            trained[k].succeed()
            self.tally.step_latencies.append(env.now - records[k].rollout_start)

    # ------------------------------------------------------------ gang stages

    def _gang(self, stage: Stage, seconds: float, *, switching: bool = False):
        """Request ``stage``, wait for the grant, load, work, offload, release."""
        env = self.env
        usage = self.sim.usage
        granted = self.grants[stage] = env.event()
        role = Role.ACTOR_TRAIN if stage is Stage.REF_LOGPROBS and not self.spec.has_role(Role.REFERENCE) else None
        self.sim.submit(RequestStage(pipeline_id=self.pid, stage=stage, role=role))
        self.sim.request_plan()
        gpus, gpus_ready = yield granted
        sw = self.model.switch
        usage.set(gpus, env.now, Activity.SWITCH, self.pid, stage.value)
        if switching:  # model load: the whole stage is switching
            yield env.timeout(max(gpus_ready - env.now, 0.0) + seconds)
        else:
            yield env.timeout(max(gpus_ready - env.now, 0.0) + sw.load_s)
            usage.set(gpus, env.now, Activity.WORK, self.pid, stage.value)
            yield env.timeout(seconds)
            usage.set(gpus, env.now, Activity.SWITCH, self.pid, stage.value)
            yield env.timeout(sw.offload_s)
        usage.set(gpus, env.now, Activity.FREE)
        del self.grants[stage]
        self.sim.submit(ReleaseStage(pipeline_id=self.pid, stage=stage))
        self.sim.request_plan()

    def grant(self, stage: Stage, gpus: tuple[int, ...], gpus_ready: float) -> None:
        self.grants[stage].succeed((gpus, gpus_ready))

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

    def batch_size(self) -> int:
        return self.engine.open_n

    def _demand_changed(self) -> None:
        self.sim.demand_dirty.add(self.pid)
