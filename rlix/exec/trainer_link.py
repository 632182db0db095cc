"""Executor layer: the job's trainer actor as its coordinator uses it.

Stage calls (old and reference log-probs, training) and weight snapshots,
each with a deadline, and the versioned CPU cache of the trainer's weights:
the newest full snapshot (or base weights of a LoRA job) and the newest
snapshot of each adapter, as object references rollout workers sync from.
Version ``v`` is the weights after ``v`` trained steps.
"""

from __future__ import annotations

from rlix.core import Stage
from rlix.exec.config import LimitsConfig
from rlix.exec.rollout_control import call
from rlix.exec.step_driver import Stream


class TrainerLink:
    """Calls to one trainer actor, and the cache of its weight versions."""

    def __init__(self, handle, *, limits: LimitsConfig, checkpoint: bool) -> None:
        self.handle = handle  # the trainer actor
        self.limits = limits
        self.checkpoint = checkpoint  # write adapter checkpoints after each update
        self.full: tuple[object, int] = (handle.snapshot.remote(), 0)  # newest full snapshot ref, its version
        self.adapters: dict[str, tuple[object, int]] = {}  # adapter -> newest snapshot ref, its version

    async def call(self, ref, what: str):
        return await call(ref, self.limits.call_timeout_s, what)

    async def start(self, streams: list[Stream]) -> None:
        """Wait for the trainer; resumed adapters continue from their checkpoints; v0 is cached."""
        versions = await self.call(self.handle.adapter_versions.remote(), "trainer start-up")
        for s in streams:
            if s.name:
                s.start = s.next_step = s.version = versions[s.name]
                self.adapters[s.name] = (self.handle.adapter_snapshot.remote(s.name), s.version)
        await self.call(self.full[0], "first weight snapshot")

    def stage_call(self, stage: Stage, samples, adapter: str):
        """The remote call ``stage`` runs on the trainer (started when the stage holds its GPUs)."""
        if stage is Stage.OLD_LOGPROBS:
            return lambda: self.handle.logprobs.remote(samples, False, adapter)
        if stage is Stage.REF_LOGPROBS:
            return lambda: self.handle.logprobs.remote(samples, True)
        return lambda: self.handle.train.remote(samples, adapter)

    async def publish(self, adapter: str, version: int) -> None:
        """Cache the trained weights (one adapter's, or the full model) as ``version``."""
        if adapter:
            ref = self.handle.adapter_snapshot.remote(adapter)
            await self.call(ref, "adapter snapshot")
            self.adapters[adapter] = (ref, version)
            if self.checkpoint:
                await self.call(self.handle.save_adapter.remote(adapter), "adapter checkpoint")
        else:
            ref = self.handle.snapshot.remote()
            await self.call(ref, "weight snapshot")
            self.full = (ref, version)

    def weights(self) -> tuple:
        """(full snapshot ref, its version, ((adapter, ref, version), ...)) -- what a waking worker syncs."""
        return self.full[0], self.full[1], tuple((n, ref, v) for n, (ref, v) in sorted(self.adapters.items()))
