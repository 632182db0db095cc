"""Executor layer: the job's trainer actor as its coordinator uses it.

Stage calls (old and reference log-probs, training) and weight snapshots,
each with a deadline, and the versioned CPU cache of the trainer's weights:
the newest full weights (or base weights of a LoRA job), published once per
version as bf16 buckets in Ray's object store (:mod:`rlix.weightsync.buckets`),
and the newest snapshot of each adapter, as object references rollout workers
sync from.
Version ``v`` is the weights after ``v`` trained steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlix.core import ClusterSpec, Stage
from rlix.core.types import Gpus
from rlix.exec.config import JobConfig, LimitsConfig
from rlix.exec.deadline import call
from rlix.exec.messages import Emulation, TrainerJob
from rlix.exec.train.residency import ALL_PARTS, STAGE_PARTS
from rlix.protocol import GpuMap
from rlix.weightsync.types import DeviceHandoff


class TrainerLink:
    """Calls to one trainer actor, and the cache of its weight versions."""

    def __init__(
        self,
        handle,
        *,
        limits: LimitsConfig,
        checkpoint_dir: str | None = None,
        save_every: int = 1,
        started=None,
        handoff: bool = False,
    ) -> None:
        """``handoff``: the trainer stages each version on its GPU (``train.gpu_handoff``): their handles
        are fetched with each publish and withdrawn at each stage's load."""
        self.handle = handle  # the trainer actor (or gang of ranks)
        self.started = started  # done once every rank built its learner (None: nothing to wait for)
        self.limits = limits
        self.checkpoint_dir = checkpoint_dir  # None: no checkpoints
        self.save_every = save_every  # checkpoint every this many steps (and after a stream's last)
        self.full: tuple[object, int] = (handle.weights.remote(), 0)  # newest full snapshot ref, its version
        self.adapters: dict[str, tuple[object, int]] = {}  # adapter -> newest snapshot ref, its version
        self.handoff = handoff
        # the CUDA IPC handles of a full version's buckets on the trainer's GPU, and that version, while they last
        self.handles: tuple[DeviceHandoff, int] | None = None

    @classmethod
    def start_gang(
        cls,
        job: JobConfig,
        model_dir: str,
        emulation: Emulation,
        *,
        cluster: ClusterSpec,
        gpus: Gpus,
        gpu_map: GpuMap,
        name: str,
    ) -> TrainerLink:
        """The job's trainer: one data-parallel rank per GPU of ``gpus`` (FSDP2 when more than one),
        starting in the background."""
        from rlix.exec.train.trainer_gang import TrainerGang

        trainer_job = TrainerJob(
            model_path=model_dir,
            cfg=job.algo.value(job.seed),
            emulation=emulation,
            lora=job.lora_spec(),
            adapter_cfgs=tuple((a.name, a.algo.value(a.seed)) for a in job.adapters or ()),
            checkpoint_dir=job.checkpoint_dir,
            train=job.train.value(),
            sync_dtype=job.sync_dtype(),
        )
        gang = TrainerGang.start(cluster, gpus, gpu_map, name, trainer_job)
        return cls(
            gang,
            limits=job.limits,
            checkpoint_dir=job.checkpoint_dir,
            save_every=job.save_every,
            started=gang.started,
            handoff=job.train.gpu_handoff,
        )

    async def call(self, ref, what: str):
        return await call(ref, self.limits.call_timeout_s, what)

    async def start(self, streams: Sequence[str]) -> dict[str, int]:
        """Wait for the trainer and cache the first weights; returns the streams that resume from a
        checkpoint, with their trained steps (an adapter by name; the full model as ``""``)."""
        if self.started is not None:
            await self.call(self.started, "trainer start-up")  # a rank that failed to start says why here
        versions = await self.call(self.handle.adapter_versions.remote(), "trainer start-up")
        resumed: dict[str, int] = {}
        for name in streams:
            if name:
                resumed[name] = versions[name]
                self.adapters[name] = (self.handle.adapter_snapshot.remote(name), versions[name])
            elif self.checkpoint_dir:  # a resumed full finetune continues from its newest checkpoint
                resumed[name] = await self.call(self.handle.trained_steps.remote(), "trainer start-up")
                self.full = (self.full[0], resumed[name])
        await self.call(self.full[0], "first weight snapshot")
        return resumed

    async def load(self, stage: Stage | None = None) -> None:
        """What ``stage`` uses (policy, reference, optimizer state) onto its GPUs; everything for ``None``."""
        parts = STAGE_PARTS.get(stage, ALL_PARTS) if stage is not None else ALL_PARTS
        self.handles = None  # the load drops the buckets on the GPU: no worker is sent to them from here on
        await self.call(self.handle.reload.remote(parts), "stage load")

    async def work(self, stage: Stage, samples, adapter: str):
        """Run ``stage`` on the trainer while it holds its GPUs (the stage's own deadline)."""
        if stage is Stage.OLD_LOGPROBS:
            ref = self.handle.logprobs.remote(samples, False, adapter)
        elif stage is Stage.REF_LOGPROBS:
            ref = self.handle.logprobs.remote(samples, True)
        else:
            ref = self.handle.train.remote(samples, adapter)
        return await call(ref, self.limits.stage_timeout_s, f"stage {stage.value}")

    async def offload(self) -> None:
        await self.call(self.handle.offload.remote(), "stage offload")

    async def publish(self, stream: str, version: int, *, last: bool) -> None:
        """Cache ``stream``'s trained weights (one adapter's, or the full model as ``""``) as ``version``;
        checkpoint every ``save_every`` trained steps and after the stream's last (``last``: the step
        machine's :class:`rlix.step.Publish` says the stream produces no further step)."""
        due = bool(self.checkpoint_dir) and (last or version % self.save_every == 0)
        if stream:
            ref = self.handle.adapter_snapshot.remote(stream)
            await self.call(ref, "adapter snapshot")
            self.adapters[stream] = (ref, version)
            if due:
                await self.call(self.handle.save_adapter.remote(stream), "adapter checkpoint")
        else:
            ref = self.handle.weights.remote()
            await self.call(ref, "weight snapshot")
            self.full = (ref, version)
            if self.handoff:
                handles = await self.call(self.handle.handoff.remote(), "hand-off handles")
                self.handles = (handles, version) if handles is not None else None
            if due:
                await self.call(self.handle.save_full.remote(), "checkpoint")

    def weights(self) -> tuple:
        """(full snapshot ref, its version, ((adapter, ref, version), ...)) -- what a waking worker syncs."""
        return self.full[0], self.full[1], tuple((n, ref, v) for n, (ref, v) in sorted(self.adapters.items()))

    def handoff_of(self, version: int) -> DeviceHandoff | None:
        """The handles of ``version``'s buckets on the trainer's GPU, if the trainer still keeps them."""
        return self.handles[0] if self.handles is not None and self.handles[1] == version else None
