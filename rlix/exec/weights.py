"""Executor layer: the trainer's versioned CPU weight cache.

After every training step the trainer publishes a :class:`WeightSnapshot` (a
CPU copy of its weights, tagged with the policy version). Rollout workers
that wake up after a shrink, or are awake when a new version appears, load
the newest snapshot; sleeping workers are never synced.
"""

from __future__ import annotations

from rlix.exec.messages import WeightSnapshot

from rlix.exec.fsdp import full
__all__ = ["WeightSnapshot", "snapshot_of"]


def snapshot_of(model, version: int) -> WeightSnapshot:
    """A detached CPU copy of ``model``'s weights (gathered whole when FSDP2 shards
    them: a collective, called by every rank)."""
    tensors = {k: full(v).detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return WeightSnapshot(version=version, tensors=tensors, nbytes=nbytes)
