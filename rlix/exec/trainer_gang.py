"""Executor layer (Ray): a job's trainer as one gang of data-parallel ranks.

A job's ``actor_train`` mapping of N GPUs gets N :class:`TrainerActor`
processes, rank r pinned to the r-th GPU (lowest id first), which form one
torch.distributed group (:mod:`rlix.exec.fsdp`). The core grants a training
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
from rlix.exec.grpo import Sample
from rlix.exec.placement import actor_options
from rlix.exec.workers import TrainerActor, TrainerJob


class TrainerGang:
    """The ranks of one job's trainer; each method returns rank 0's ``ObjectRef`` (awaitable)."""

    def __init__(self, actors: list, started) -> None:
        self.actors = actors
        self.started = started  # rank 0's ``start``: done once every rank joined and built its learner

    @classmethod
    def start(cls, cluster: ClusterSpec, gpus: Gpus, nodes: list[str], name: str, job: TrainerJob) -> TrainerGang:
        """One rank per GPU of ``gpus``; ranks join and build their learners in the background."""
        actors = [TrainerActor.options(**actor_options(cluster, (g,), nodes, f"{name}{r}")).remote(r) for r, g in enumerate(sorted(gpus))]
        rdv = actors[0].rendezvous.remote(len(actors))  # rank 0's host; the other ranks receive it resolved
        return cls(actors, [a.start.remote(rdv, job) for a in actors][0])

    @property
    def world(self) -> int:
        return len(self.actors)

    def _all(self, method: str, *args):
        # Rank 0's ref alone stands for the call: a failed rank > 0 fails rank 0's
        # collective too (peer gone, or COLLECTIVE_TIMEOUT_S), so no error is lost.
        return [getattr(a, method).remote(*args) for a in self.actors][0]

    def reload(self):
        return self._all("reload")

    def offload(self):
        return self._all("offload")

    def logprobs(self, samples: list[Sample], reference: bool, adapter: str = ""):
        return self._all("logprobs", samples, reference, adapter)

    def train(self, samples: list[Sample], adapter: str = ""):
        return self._all("train", samples, adapter)

    def adapter_versions(self):
        return self._all("adapter_versions")

    def adapter_snapshot(self, adapter: str):
        return self._all("adapter_snapshot", adapter)

    def save_adapter(self, adapter: str):
        return self._all("save_adapter", adapter)

    def snapshot(self):
        return self._all("snapshot")

    def visible_devices(self) -> list:
        """Each rank's ``CUDA_VISIBLE_DEVICES`` (refs, rank order)."""
        return [a.visible_devices.remote() for a in self.actors]

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)
