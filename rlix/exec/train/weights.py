"""Executor layer: the trainer's CPU copy of its weights, taken after each step.

:func:`snapshot_of` runs inside a trainer rank: it gathers the model's
weights whole (FSDP2 shards them) into a :class:`WeightSnapshot` on the CPU,
tagged with the policy version. It keeps nothing: the versioned cache of
these snapshots (the newest full snapshot and the newest of each adapter, as
object references rollout workers sync from) is the coordinator's
:class:`~rlix.exec.train.trainer_link.TrainerLink`.
"""

from __future__ import annotations

from rlix.exec.messages import WeightSnapshot
from rlix.exec.train.fsdp import full

__all__ = ["WeightSnapshot", "snapshot_of"]


def snapshot_of(model, version: int) -> WeightSnapshot:
    """A detached CPU copy of ``model``'s weights (gathered whole when FSDP2 shards
    them: a collective, called by every rank)."""
    tensors = {k: full(v).detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return WeightSnapshot(version=version, tensors=tensors, nbytes=nbytes)
