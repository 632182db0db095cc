"""Executor layer: the trainer actor, one process per data-parallel rank of a job's learner.

Created with :func:`rlix.exec.placement.actor_options`, so the process sees only
its planned GPU. It holds the torch state (policy, reference, optimizer); the
step's order and the scheduling calls live in the job's coordinator.
"""

from __future__ import annotations

import time

import ray

from rlix.exec.messages import AdapterSnapshot, LearnerPart, Sample, TrainerJob, TrainStats
from rlix.exec.placement import require_readable, setup_process
from rlix.exec.train.fsdp import Rendezvous, free_rendezvous, join
from rlix.exec.train.grpo import GrpoLearner
from rlix.exec.train.lora import LoraLearner
from rlix.weightsync.types import DeviceHandoff, WeightBuckets, WeightSnapshot


@ray.remote(max_concurrency=1)  # one call at a time, in the order sent: ranks must meet in their collectives alike
class TrainerActor:
    """One data-parallel rank of the job's learner (policy, reference and optimizer) on
    one GPU of its actor_train mapping; :class:`rlix.exec.train.trainer_gang.TrainerGang`
    sends every rank the same calls. A lone rank is the whole learner."""

    def __init__(self, rank: int) -> None:
        self.visible = setup_process()
        self.rank = rank
        self.checkpoint_dir: str | None = None
        self.sync_dtype = "bfloat16"
        self.learner: GrpoLearner | None = None

    def rendezvous(self, world: int) -> Rendezvous:
        """Rank 0: where the ranks meet (this host, a free port)."""
        return free_rendezvous(world)

    def start(self, rdv: Rendezvous, job: TrainerJob) -> int:
        """Join the other ranks, then build the (sharded) learner, offloaded; returns this rank."""
        from rlix.exec.placement import device_for_worker

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
        """One update; full finetune on a GPU: the new version also staged on the GPU for the hand-off."""
        if adapter:
            return self.learner.train_adapter(adapter, samples)
        stats = self.learner.train(samples)
        self.learner.stage_handoff(self.sync_dtype)
        return stats

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

    def handoff(self) -> DeviceHandoff | None:
        """The published version's buckets on this trainer's GPU, as CUDA IPC handles, until its next
        stage drops them (None: not staged; adapters, or the hand-off off)."""
        return None if isinstance(self.learner, LoraLearner) else self.learner.handoff_handles(self.sync_dtype)

    def visible_devices(self) -> str:
        return self.visible
