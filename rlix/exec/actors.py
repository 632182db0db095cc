"""Executor layer: the Ray worker actors (rollout workers and trainers).

Both are created with :func:`rlix.exec.control.actor_placement.actor_options`, so each
process sees only its planned GPUs. They hold the torch state; everything
else (queues, versions, scheduling calls) lives in the pipeline coordinator.
"""

from __future__ import annotations

import os
import threading
import time

import ray

from rlix.exec.device_memory import MemoryCheck
from rlix.exec.messages import (
    AdapterSnapshot,
    Emulation,
    EngineRefused,
    EngineStopped,
    GenRequest,
    GenResult,
    LearnerPart,
    LoraSpec,
    Sample,
    SwitchTiming,
    TrainerJob,
    TrainStats,
    VllmOptions,
    WeightBuckets,
    WeightSnapshot,
    WorkerFault,
)
from rlix.exec.rollout.torch_backend import make_backend
from rlix.exec.train.fsdp import Rendezvous, free_rendezvous, join
from rlix.exec.train.grpo import GrpoLearner
from rlix.exec.train.lora import LoraLearner


def require_readable(path: str, what: str) -> None:
    """A path the driver named that this worker's node cannot read: one line naming it and the node."""
    if not os.access(path, os.R_OK):
        import socket

        raise FileNotFoundError(
            f"{what} {path} cannot be read on node {socket.gethostname()}; "
            "put it on storage every node of the Ray cluster reads, under the same path"
        )


def _setup_process() -> str:
    """A worker process's start: one torch thread, and its visible devices checked against its bundle's."""
    import torch

    from rlix.exec.control.actor_placement import check_devices

    torch.set_num_threads(1)
    return check_devices()


CONTROL_THREADS = 8  # threads beyond the slots: wake, sleep, weight and adapter syncs never queue behind generation


def worker_concurrency(slots_per_worker: int) -> int:
    """The worker actor's threads for a job: one per generation slot, plus :data:`CONTROL_THREADS`."""
    return slots_per_worker + CONTROL_THREADS


@ray.remote(max_concurrency=worker_concurrency(64))  # the default; a job's coordinator sets its own (worker_options)
class RolloutWorkerActor:
    """One rollout worker (a TP-sized GPU bundle) of one pipeline."""

    def __init__(
        self,
        emulation: Emulation,
        lora: LoraSpec | None = None,
        backend: str = "torch",
        vllm: VllmOptions = VllmOptions(),
        fault: WorkerFault = WorkerFault(),
    ) -> None:
        self.visible = _setup_process()
        self.fault = fault
        self._dying = False
        # The bundle placement pinned this process to (logical ids on a CPU host): a vLLM engine spans it.
        devices = tuple(int(g) for g in self.visible.split(",") if g.strip()) or (0,)
        self.backend = make_backend(backend, emulation, lora, vllm, devices)
        self.memory: MemoryCheck | None = None  # free memory on the first device, checked before every wake

    def prepare(self, model_path: str) -> float:
        """Start-up that needs no GPU (imports, config): done at the job's init."""
        from rlix.exec.control.actor_placement import device_for_worker

        require_readable(model_path, "model directory")
        t0 = time.perf_counter()
        self.memory = MemoryCheck(device_for_worker())
        self.backend.prepare(model_path, self.memory.device)
        return time.perf_counter() - t0

    def wake(self, snapshot: WeightBuckets | None, *adapters: AdapterSnapshot) -> SwitchTiming:
        """Resume with ``snapshot`` (the trainer's published full weights, or the base) and every current
        adapter; the timing's ``synced_bytes`` are the bytes of the weights it loaded."""
        if self.fault.hang_wake:
            threading.Event().wait()  # injected: a wake that never returns (the caller's deadline kills us)
        t0 = time.perf_counter()
        before = self.backend.weight_version if self.backend.awake else -1
        had = self.backend.adapter_versions if self.backend.awake else {}
        cold = self.backend.builds_on_wake
        self.memory.wait_for("wake")  # what the first wake took must be free (NotEnoughMemoryError: reported lost)
        self.memory.measure("wake", lambda: self.backend.wake(snapshot, adapters))
        synced = snapshot.nbytes if snapshot is not None and snapshot.version != before else 0
        synced += sum(a.nbytes for a in adapters if a.version > had.get(a.name, -1))
        return self._timing(t0, synced, cold)

    def _timing(self, t0: float, synced: int, cold: bool = False) -> SwitchTiming:
        versions = tuple(sorted(self.backend.adapter_versions.items()))
        return SwitchTiming(
            seconds=time.perf_counter() - t0,
            synced_bytes=synced,
            version=self.backend.weight_version,
            adapters=versions,
            cold=cold,
        )

    def update_adapter(self, snapshot: AdapterSnapshot) -> SwitchTiming:
        t0 = time.perf_counter()
        if not self.backend.awake or snapshot.version <= self.backend.adapter_versions.get(snapshot.name, -1):
            return self._timing(t0, 0)
        self.backend.update_adapter(snapshot)
        return self._timing(t0, snapshot.nbytes)

    def sleep(self) -> SwitchTiming:
        t0 = time.perf_counter()
        if self.memory is not None:  # what the sleep frees is what the next wake needs (not the first wake's build)
            self.memory.measure_freed("wake", self.backend.sleep)
        else:
            self.backend.sleep()
        return SwitchTiming(seconds=time.perf_counter() - t0)

    def update_weights(self, snapshot: WeightBuckets) -> SwitchTiming:
        t0 = time.perf_counter()
        if not self.backend.awake or snapshot.version <= self.backend.weight_version:
            return SwitchTiming(seconds=0.0, version=self.backend.weight_version)
        self.backend.update_weights(snapshot)
        return SwitchTiming(seconds=time.perf_counter() - t0, synced_bytes=snapshot.nbytes, version=snapshot.version)

    def generate(self, request: GenRequest) -> GenResult:
        if self.fault.refuse_requests:
            raise EngineRefused(f"engine refused trajectory {request.traj_id} (fault.refuse_requests)")
        if self.fault.die_in_rollout and not self._dying:
            self._dying = True  # injected: the process exits mid-rollout, as a crashed engine would
            threading.Timer(1.0, os._exit, (1,)).start()
        try:
            return self.backend.generate(request)
        except EngineStopped:  # a broken engine serves nothing more: die, so the job continues on other workers
            os._exit(1)

    def visible_devices(self) -> str:
        return self.visible


@ray.remote(max_concurrency=1)  # one call at a time, in the order sent: ranks must meet in their collectives alike
class TrainerActor:
    """One data-parallel rank of the job's learner (policy, reference and optimizer) on
    one GPU of its actor_train mapping; :class:`rlix.exec.train.trainer_gang.TrainerGang`
    sends every rank the same calls. A lone rank is the whole learner."""

    def __init__(self, rank: int) -> None:
        self.visible = _setup_process()
        self.rank = rank
        self.checkpoint_dir: str | None = None
        self.sync_dtype = "bfloat16"
        self.learner: GrpoLearner | None = None

    def rendezvous(self, world: int) -> Rendezvous:
        """Rank 0: where the ranks meet (this host, a free port)."""
        return free_rendezvous(world)

    def start(self, rdv: Rendezvous, job: TrainerJob) -> int:
        """Join the other ranks, then build the (sharded) learner, offloaded; returns this rank."""
        from rlix.exec.control.actor_placement import device_for_worker

        require_readable(job.model_path, "model directory")
        ranks = join(rdv, self.rank)
        self.checkpoint_dir = job.checkpoint_dir
        self.sync_dtype = job.sync_dtype
        self.model_path = job.model_path
        if job.lora is None:
            self.learner = GrpoLearner(job.model_path, device_for_worker(), job.cfg, job.emulation, ranks, job.dtype, job.train)
            if job.checkpoint_dir:
                from rlix.exec.train import checkpoint

                checkpoint.restore(self.learner, job.checkpoint_dir)  # a rerun continues from the newest checkpoint
        else:
            self.learner = LoraLearner(
                job.model_path, device_for_worker(), job.lora, dict(job.adapter_cfgs), job.emulation, ranks, job.dtype, job.train
            )
            if job.checkpoint_dir:
                self.learner.restore(job.checkpoint_dir)
        self.learner.offload()  # GPUs are only ours while a stage is granted
        return self.rank

    def reload(self, parts: tuple[LearnerPart, ...] = tuple(LearnerPart)) -> float:
        """``parts`` of the learner onto the GPU (a stage moves only what it uses); seconds taken."""
        t0 = time.perf_counter()
        self.learner.reload(parts)
        return time.perf_counter() - t0

    def offload(self) -> float:
        t0 = time.perf_counter()
        self.learner.offload()
        return time.perf_counter() - t0

    def logprobs(self, samples: list[Sample], reference: bool, adapter: str = "") -> list[tuple[float, ...]]:
        if adapter:
            return self.learner.adapter_logprobs(adapter, samples)
        return self.learner.logprobs(samples, reference=reference)

    def train(self, samples: list[Sample], adapter: str = "") -> TrainStats:
        return self.learner.train_adapter(adapter, samples) if adapter else self.learner.train(samples)

    def adapter_versions(self) -> dict[str, int]:
        """Multi-LoRA: ticks each adapter has trained (restored from a checkpoint or 0)."""
        return self.learner.versions() if isinstance(self.learner, LoraLearner) else {}

    def trained_steps(self) -> int:
        """Full finetune: steps the policy has trained (restored from a checkpoint, or 0)."""
        return self.learner.version

    def save_full(self) -> str:
        """Full finetune: checkpoint weights, optimizer state and step under the job's checkpoint_dir."""
        from rlix.exec.train import checkpoint

        return str(checkpoint.save(self.learner, self.checkpoint_dir, self.model_path))

    def adapter_snapshot(self, adapter: str) -> AdapterSnapshot:
        return self.learner.adapter_snapshot(adapter)

    def save_adapter(self, adapter: str) -> str:
        """Checkpoint ``adapter`` (weights, optimizer, step) under the job's checkpoint_dir."""
        return str(self.learner.save(adapter, self.checkpoint_dir))  # every rank gathers, rank 0 writes

    def snapshot(self) -> WeightSnapshot:
        """The whole newest weights in the trainer's dtype (a collective; in-process checks only)."""
        return self.learner.snapshot()

    def weights(self) -> WeightBuckets | None:
        """The newest weights as rollout workers load them: rank 0 returns the buckets, which Ray's
        object store then holds once for every worker; other ranks return None."""
        return self.learner.publish(self.sync_dtype)

    def visible_devices(self) -> str:
        return self.visible
