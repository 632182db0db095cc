"""Executor layer (Ray): a job's trainer as one gang of data-parallel ranks.

A job's ``actor_train`` mapping of N GPUs gets N :class:`TrainerActor`
processes, rank r pinned to the r-th GPU (lowest id first), which form one
torch.distributed group (:mod:`rlix.exec.train.fsdp`). The core grants a training
or log-prob stage the whole mapping at once, so every rank runs every stage:
the gang sends each call to all ranks in the same order (each rank runs its
calls one at a time, in the order sent) and answers with rank 0's result.
Every rank returns the same value (log-probs are gathered, losses summed,
weights gathered whole), so rank 0's stands for the gang.
"""

from __future__ import annotations

import ray

from rlix.core import ClusterSpec
from rlix.core.types import Gpus
from rlix.exec.messages import TrainerJob
from rlix.exec.placement import actor_options
from rlix.exec.train.actor import TrainerActor
from rlix.protocol import GpuMap

# The trainer calls a gang sends to every rank (each a method of TrainerActor).
GANG_CALLS = (
    "reload",
    "offload",
    "logprobs",
    "train",
    "adapter_versions",
    "adapter_snapshot",
    "save_adapter",
    "snapshot",
    "weights",
    "handoff",
    "trained_steps",
    "save_full",
)


class _Broadcast:
    """One trainer method of the gang: ``remote(*args)`` sends it to every rank, returns rank 0's ref."""

    def __init__(self, actors: list, method: str) -> None:
        self.actors, self.method = actors, method

    def remote(self, *args):
        # Rank 0's ref alone stands for the call: a failed rank > 0 fails rank 0's
        # collective too (peer gone, or COLLECTIVE_TIMEOUT_S), so no error is lost.
        return [getattr(a, self.method).remote(*args) for a in self.actors][0]


class TrainerGang:
    """The ranks of one job's trainer, called like one actor handle (``gang.train.remote(samples, adapter)``)."""

    def __init__(self, actors: list, started) -> None:
        self.actors = actors
        self.started = started  # rank 0's ``start``: done once every rank joined and built its learner
        for method in GANG_CALLS:
            setattr(self, method, _Broadcast(actors, method))

    @classmethod
    def start(cls, cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap, name: str, job: TrainerJob) -> TrainerGang:
        """One rank per GPU of ``gpus``; ranks join and build their learners in the background."""
        actors = [
            TrainerActor.options(**actor_options(cluster, (g,), gpu_map, f"{name}{r}")).remote(r)
            for r, g in enumerate(sorted(gpus))
        ]
        rdv = actors[0].rendezvous.remote(len(actors))  # rank 0's host; the other ranks receive it resolved
        return cls(actors, [a.start.remote(rdv, job) for a in actors][0])

    @property
    def world(self) -> int:
        return len(self.actors)

    def visible_devices(self) -> list:
        """Each rank's ``CUDA_VISIBLE_DEVICES`` (refs, rank order)."""
        return [a.visible_devices.remote() for a in self.actors]

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)
