"""Executor layer: the job's trainer actor as its coordinator uses it.

Stage calls (old and reference log-probs, training) and weight snapshots,
each with a deadline, and the versioned CPU cache of the trainer's weights:
the newest full snapshot (or base weights of a LoRA job) and the newest
snapshot of each adapter, as object references rollout workers sync from.
Version ``v`` is the weights after ``v`` trained steps.
"""

from __future__ import annotations

from rlix.core import ClusterSpec, Stage
from rlix.core.types import Gpus
from rlix.exec.config import JobConfig, LimitsConfig
from rlix.exec.deadline import call
from rlix.exec.messages import Emulation, TrainerJob
from rlix.exec.step_driver import Stream


class TrainerLink:
    """Calls to one trainer actor, and the cache of its weight versions."""

    def __init__(self, handle, *, limits: LimitsConfig, checkpoint_dir: str | None = None, save_every: int = 1, started=None) -> None:
        self.handle = handle  # the trainer actor (or gang of ranks)
        self.started = started  # done once every rank built its learner (None: nothing to wait for)
        self.limits = limits
        self.checkpoint_dir = checkpoint_dir  # None: no checkpoints
        self.save_every = save_every  # checkpoint every this many steps (and after a stream's last)
        self.full: tuple[object, int] = (handle.snapshot.remote(), 0)  # newest full snapshot ref, its version
        self.adapters: dict[str, tuple[object, int]] = {}  # adapter -> newest snapshot ref, its version

    @classmethod
    def start_gang(cls, job: JobConfig, model_dir: str, emulation: Emulation, *, cluster: ClusterSpec, gpus: Gpus, nodes: list[str], name: str) -> TrainerLink:
        """The job's trainer: one data-parallel rank per GPU of ``gpus`` (FSDP2 when more than one), starting in the background."""
        from rlix.exec.trainer_gang import TrainerGang

        trainer_job = TrainerJob(
            model_path=model_dir, cfg=job.algo.value(job.seed), emulation=emulation, lora=job.lora_spec(),
            adapter_cfgs=tuple((a.name, a.algo.value(a.seed)) for a in job.adapters or ()), checkpoint_dir=job.checkpoint_dir,
        )
        gang = TrainerGang.start(cluster, gpus, nodes, name, trainer_job)
        return cls(gang, limits=job.limits, checkpoint_dir=job.checkpoint_dir, save_every=job.save_every, started=gang.started)

    async def call(self, ref, what: str):
        return await call(ref, self.limits.call_timeout_s, what)

    async def start(self, streams: list[Stream]) -> None:
        """Wait for the trainer; resumed streams continue from their checkpoints; the first weights are cached."""
        if self.started is not None:
            await self.call(self.started, "trainer start-up")  # a rank that failed to start says why here
        versions = await self.call(self.handle.adapter_versions.remote(), "trainer start-up")
        for s in streams:
            if s.name:
                s.start = s.next_step = s.version = versions[s.name]
                self.adapters[s.name] = (self.handle.adapter_snapshot.remote(s.name), s.version)
            elif self.checkpoint_dir:  # a resumed full finetune continues from its newest checkpoint
                s.start = s.next_step = s.version = await self.call(self.handle.trained_steps.remote(), "trainer start-up")
                self.full = (self.full[0], s.version)
        await self.call(self.full[0], "first weight snapshot")

    def stage_call(self, stage: Stage, samples, adapter: str):
        """The remote call ``stage`` runs on the trainer (started when the stage holds its GPUs)."""
        if stage is Stage.OLD_LOGPROBS:
            return lambda: self.handle.logprobs.remote(samples, False, adapter)
        if stage is Stage.REF_LOGPROBS:
            return lambda: self.handle.logprobs.remote(samples, True)
        return lambda: self.handle.train.remote(samples, adapter)

    async def publish(self, stream: Stream, version: int, *, last: bool = False) -> None:
        """Cache the stream's trained weights (one adapter's, or the full model) as ``version``; checkpoint when due.

        ``last``: the stream stops after this step (its stop condition holds), so it is checkpointed too.
        """
        adapter = stream.name
        if adapter:
            ref = self.handle.adapter_snapshot.remote(adapter)
            await self.call(ref, "adapter snapshot")
            self.adapters[adapter] = (ref, version)
            if last or self._save_due(stream, version):
                await self.call(self.handle.save_adapter.remote(adapter), "adapter checkpoint")
        else:
            ref = self.handle.snapshot.remote()
            await self.call(ref, "weight snapshot")
            self.full = (ref, version)
            if last or self._save_due(stream, version):
                await self.call(self.handle.save_full.remote(), "checkpoint")

    def _save_due(self, stream: Stream, version: int) -> bool:
        """Checkpoint every ``save_every`` trained steps, and after the stream's last step."""
        return bool(self.checkpoint_dir) and (version % self.save_every == 0 or version >= stream.steps)

    def weights(self) -> tuple:
        """(full snapshot ref, its version, ((adapter, ref, version), ...)) -- what a waking worker syncs."""
        return self.full[0], self.full[1], tuple((n, ref, v) for n, (ref, v) in sorted(self.adapters.items()))
