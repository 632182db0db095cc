"""Executor layer: the rollout backend interface (torch and vLLM implement it).

A :class:`RolloutBackend` owns one rollout worker's engine on the GPUs the
plan gave the worker's process. Its life: ``prepare`` (process start-up, no
device memory) -> ``wake`` (engine built if it is not yet, newest CPU weights loaded) ->
``generate``/``update_weights`` while awake -> ``abort`` + ``sleep`` when the
plan shrinks it (weights dropped) -> ``wake`` again on the next expand.
Implementations import this module and :mod:`rlix.exec.messages` only.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from rlix.exec.messages import AdapterSnapshot, GenRequest, GenResult
from rlix.weightsync.types import WeightBuckets

if TYPE_CHECKING:
    from rlix.weightsync.handoff import Route


class RolloutBackend(abc.ABC):
    """One rollout worker's inference engine."""

    route: Route | None = None  # how the newest full weights came, and why that way (None: none loaded yet)
    full_loads: int = 0  # full weights loaded from a trainer's snapshot so far (a wake that kept its weights loads none)

    @abc.abstractmethod
    def prepare(self, model_path: str, device: str) -> None:
        """Process start-up without touching the device: imports, config, tokenizer."""

    def load(self, model_path: str, device: str, weights: WeightBuckets | None) -> None:
        """Cold start: prepare, then build the engine (checkpoint weights or ``weights``)."""
        self.prepare(model_path, device)
        self.wake(weights)

    @abc.abstractmethod
    def generate(self, request: GenRequest) -> GenResult:
        """Generate one trajectory; returns early with ``aborted`` after :meth:`abort`."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Stop every in-flight ``generate`` and wait until they have returned."""

    @abc.abstractmethod
    def sleep(self) -> None:
        """Drop the weights (and caches) so the GPUs can be given away."""

    @abc.abstractmethod
    def wake(self, weights: WeightBuckets | None) -> None:
        """Rebuild the engine, loading ``weights`` (the trainer's published buckets) if newer than what it had."""

    @abc.abstractmethod
    def update_weights(self, weights: WeightBuckets) -> None:
        """Load newer weights into an awake engine."""

    @abc.abstractmethod
    def update_adapter(self, snapshot: AdapterSnapshot) -> None:
        """Multi-LoRA: load a newer version of one adapter into an awake engine."""

    @property
    @abc.abstractmethod
    def adapter_versions(self) -> dict[str, int]:
        """Multi-LoRA: the version of each adapter the awake engine serves."""

    @property
    @abc.abstractmethod
    def weight_version(self) -> int: ...

    @property
    def builds_on_wake(self) -> bool:
        """The next wake builds the engine on the device (a cold start), not only resumes it."""
        return False

    @property
    @abc.abstractmethod
    def awake(self) -> bool: ...


def unchanged_result(req: GenRequest, version: int) -> GenResult:
    """A request handed back untouched (the engine was asleep): continue it elsewhere."""
    return GenResult(
        traj_id=req.traj_id,
        token_ids=req.prefix_ids,
        logprobs=req.prefix_logprobs,
        finished=False,
        aborted=True,
        weight_version=version,
        gen_s=0.0,
    )
