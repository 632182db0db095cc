"""Simulator layer: one RL job, the step machine (:mod:`rlix.step`) driven by SimPy.

The machine decides what the job does next; this interpreter carries its
effects out in simulated time: a gang stage's load, work and offload are
timeouts of the trace's seconds, a queued batch goes to the pipeline's
:class:`~rlix.sim.engine.RolloutEngine`, and scores and weight publishes
answer at once (the trace has no rewards; syncs are charged by the engine).
The pipeline talks to the simulation only through :class:`Host` (a few
callbacks), never the simulation object itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import simpy

from rlix.core import Event, PipelineSpec, Register, ReleaseStage, ReportDemand, RequestStage, Role, Stage, Unregister
from rlix.job import step_sequence, warm_order
from rlix.metrics import PipelineTally, UsageRecorder
from rlix.sim.engine import Batch, EngineOptions, RolloutEngine
from rlix.step import (
    Book,
    DemandChanged,
    Driver,
    DropBatch,
    Effect,
    Finished,
    JobPlan,
    Load,
    Offload,
    Publish,
    QueueBatch,
    RegisterJob,
    ReleaseGang,
    RequestGang,
    Score,
    StepMachine,
    StepTimes,
    StreamSpec,
    Work,
    job_plan,
)
from rlix.trace import PipelineModel, Step, speed_curve


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


def plan_of(model: PipelineModel, streams: list[tuple[str, list[Step]]]) -> JobPlan:
    """The trace's streams as the step machine sees them; lengths are predicted where the job's order asks
    for it and every step lists its prompt ids (a replay's order as drawn needs no predictor)."""
    return job_plan(
        model,
        [StreamSpec(name=name, steps=len(steps)) for name, steps in streams],
        stages=lambda i, k: step_sequence(streams[i][1][k].stages),
        size=lambda i, k: len(streams[i][1][k].trajectories),
        share_load=model.stage_cost.share_load,
        prompts=model.dispatch == "predicted" and all(step.prompts is not None for _, steps in streams for step in steps),
    )


class SimPipeline:
    """Carries out one job's step-machine effects in simulated time."""

    def __init__(self, host: Host, model: PipelineModel, spec: PipelineSpec, streams: list[tuple[str, list[Step]]]) -> None:
        self.host = host
        self.env = host.env
        self.model = model
        self.pid = model.id
        self.streams = streams
        self.lora = model.kind == "multi_lora"
        self.machine = StepMachine(spec, plan_of(model, streams))
        self.driver = Driver(self)
        self.spec = self.machine.spec  # as registered: with its open_limit
        self.tally = PipelineTally(arrival_s=model.arrival_s, step_latencies=self.machine.latencies, tenant=spec.tenant)
        self.gpus_ready: dict[Stage, float] = {}  # granted stage -> when its GPUs' last offload ends (seconds)
        self.loaded_at: float | None = None  # when the model load ended (None: not yet)
        self.warm_first = set(warm_order(spec.role(Role.ACTOR_INFER).bundles, spec.home_gpus)[0])
        self.starting: dict[int, float] = {}  # first GPU of a bundle -> when its worker process is up (once loaded)
        self.engine = RolloutEngine(
            self.env,
            pipeline_id=self.pid,
            options=self._engine_options(),
            usage=host.usage,
            book=self.machine.book,
            on_change=partial(host.demand_changed, self.pid),  # once per trajectory: no lambda frame
            on_pending=partial(host.waiting_changed, self.pid),
        )
        self.env.process(self._arrive())

    def _engine_options(self) -> EngineOptions:
        model = self.model
        return EngineOptions(
            slots=model.slots_per_worker,
            weight_sync_s=model.switch.weight_sync_s,
            adapter_sync_s=model.switch.adapter_sync_s,
            requeue=model.preempt == "requeue",
            resume_s=model.switch.resume_s,
            lora=self.lora,
            streaming=model.rollout_mode == "streaming",
            partial=model.partial_rollout,
            speed=speed_curve(model.decode_speed),
        )

    @property
    def done(self) -> bool:
        return self.machine.done

    @property
    def history(self) -> list[StepTimes]:
        return self.machine.history

    def _arrive(self):
        yield self.env.timeout(self.model.arrival_s)
        self._do(lambda: self.machine.start(self.env.now))

    def _do(self, event: Callable[[], list[Effect]]) -> None:
        """Tell the machine ``event`` now (or once the effects being carried out are done) and carry out its effects."""
        self.driver.feed(event)

    def _after(self, seconds: float, then: Callable[[float], list[Effect]]) -> None:
        """Feed ``then(now)`` back to the machine ``seconds`` from now."""
        self.env.timeout(seconds).callbacks.append(lambda _: self._do(lambda: then(self.env.now)))

    # ------------------------------------------------------------ from the simulation

    def grant(self, stage: Stage, gpus: tuple[int, ...], gpus_ready: float, warm: bool = False) -> None:
        """The plan granted ``stage``; the machine hears of it once the events before it at this instant are done."""
        self.gpus_ready[stage] = gpus_ready
        granted = self.env.event()
        granted.callbacks.append(lambda _: self._do(lambda: self.machine.granted(stage, gpus, self.env.now, warm=warm)))
        granted.succeed()

    def new_worker_versions(self) -> tuple[dict[int, int], float]:
        """Versions a worker loads when it (re)starts, and the extra sync seconds."""
        sw = self.model.switch
        versions = self.machine.rollouts.versions()
        trained = [v for v in versions.values() if v > 0]
        if self.lora:
            extra = sw.adapter_sync_s * len(trained)
        else:
            extra = sw.weight_sync_s if trained else 0.0
        return versions, extra

    def demand_report(self) -> ReportDemand:
        return self.machine.demand(
            loads=self.engine.loads(),
            trajectory_s=self.engine.mean_trajectory_s,
            switch_s=self.model.switch.load_s + self.model.switch.weight_sync_s,  # wake + weight sync of one worker
            longest_s=self.engine.longest_s,
            finished=self.machine.book.completed,
            starting=self.starting,
        )

    # ------------------------------------------------------------ effects

    def request_gang(self, e: RequestGang) -> None:
        if e.after is not None:  # a hand-over: the release and the request are planned at one instant
            self.release_gang(ReleaseGang(stage=e.after))
        self.host.submit(RequestStage(pipeline_id=self.pid, stage=e.stage, role=e.role))
        self.host.request_plan()

    def release_gang(self, e: ReleaseGang) -> None:
        # ``announce`` needs nothing here: the batch is queued before the plan at this instant runs.
        self.host.submit(ReleaseStage(pipeline_id=self.pid, stage=e.stage))
        self.host.request_plan()

    def book(self, e: Book) -> None:
        self.host.usage.set(e.gpus, self.env.now, e.activity, self.pid if e.stage else "", e.stage)

    def load(self, e: Load) -> None:
        seconds = self.model.init_s if e.stage is Stage.INIT else self.model.switch.stage_load()
        wait = max(self.gpus_ready[e.stage] - self.env.now, 0.0)  # a stranger's offload still running there
        self._after(wait + seconds, lambda now: self._loaded(e.stage, now))

    def _loaded(self, stage: Stage, now: float) -> list[Effect]:
        if stage is Stage.INIT:
            self.loaded_at = now
            self._watch_processes(now)
        return self.machine.loaded(stage, now)

    def _watch_processes(self, now: float) -> None:
        """Report the bundles whose worker process is not up yet as starting, and report
        again as each comes up (so the scheduler places no worker there before)."""
        for gpus in self.spec.role(Role.ACTOR_INFER).bundles:
            up = self.process_up(gpus)
            if up > now:
                self.starting[gpus[0]] = up
        for up in sorted(set(self.starting.values())):
            self.env.timeout(up - now).callbacks.append(lambda _, up=up: self._processes_up(up))

    def _processes_up(self, up: float) -> None:
        for g in [g for g, t in self.starting.items() if t <= up]:
            del self.starting[g]
        self.host.demand_changed(self.pid)
        self.host.request_plan()

    def process_up(self, gpus: tuple[int, ...]) -> float:
        """When this job's worker process on ``gpus`` is up: started in the background on arrival
        (home bundles) or once the model is loaded (the others), :func:`rlix.job.warm_order`."""
        sw = self.model.switch
        if gpus in self.warm_first:
            since, start = self.model.arrival_s, sw.start_s
        else:
            since, start = self.loaded_at, sw.start_later()
        if start <= 0:
            return 0.0  # always up
        return (self.env.now if since is None else since) + start

    def work(self, e: Work) -> None:
        seconds = self.streams[e.stream][1][e.step].stages[e.stage]
        self._after(seconds, lambda now: self.machine.worked(e.stage, seconds, now))

    def offload(self, e: Offload) -> None:
        offload_s = self.model.switch.stage_offload()
        if e.keep:  # the next stage of this step runs here: the model stays, its offload is owed to a stranger
            self.host.park(self.pid, e.gpus, offload_s)
            self._do(lambda: self.machine.offloaded(e.stage, self.env.now))
        else:
            self._after(offload_s, lambda now: self.machine.offloaded(e.stage, now))

    def score(self, e: Score) -> None:
        self._do(lambda: self.machine.scored(e.stream, e.step, 0.0, self.env.now))

    def drop_batch(self, e: DropBatch) -> None:
        raise RuntimeError(f"{self.pid}: a trace's streams have no stop reward, so no batch is ever dropped")

    def queue_batch(self, e: QueueBatch) -> None:
        batch = Batch(self.env, e.stream, e.step, e.version, e.size, self.lora)
        step = self.streams[e.stream][1][e.step]
        self.engine.add_batch(batch, step.rollout(), step.prompts)
        self.host.request_plan()  # demand went up: plan now, not at the next tick
        batch.done.callbacks.append(
            lambda _: self._do(lambda: self.machine.rolled(e.stream, e.step, self.env.now, oldest_version=batch.tally.oldest))
        )

    def publish(self, e: Publish) -> None:
        self.engine.set_version(e.stream, e.version)  # workers sync on demand; the engine charges it
        self._do(lambda: self.machine.published(e.stream, self.env.now))

    def demand_changed(self, e: DemandChanged) -> None:
        # Finer changes are reported on the scheduler's tick; a rollout with nothing left running lends its GPUs now.
        if e.urgent and not self.machine.book and not self.engine.running:
            self.host.request_plan()

    def register_job(self, e: RegisterJob) -> None:
        self.host.usage.homes.set_home(self.env.now, self.pid, self.spec.home_gpus)
        self.host.submit(Register(spec=self.spec))
        self._do(lambda: self.machine.registered(self.env.now))

    def finished(self, e: Finished) -> None:
        self.tally.admitted_s = self.machine.admitted_s  # the model load's grant: queued until then
        self.tally.finish_s = self.env.now
        self.tally.trajectories = self.machine.book.completed
        if self.machine.book.predictor is not None:
            self.tally.length_rank_correlation = self.machine.book.predictor.rank_correlation()
        self.host.usage.homes.set_home(self.env.now, self.pid, ())
        self.host.submit(Unregister(pipeline_id=self.pid))
        self.host.request_plan()
        self.host.finished(self.pid)
