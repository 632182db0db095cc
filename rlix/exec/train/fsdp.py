"""Executor layer: data-parallel trainer ranks (torch.distributed + FSDP2), independent of Ray.

A job's trainer runs one process per GPU of its ``actor_train`` mapping.
Every rank builds the same model from the same files and seeds; FSDP2
(``fully_shard``) then shards parameters, gradients and optimizer state
across the ranks. The GRPO update (:mod:`rlix.exec.train.grpo`) stays one loop:
each rank takes its share of every minibatch and the few numbers that must
be global are summed here. With one rank (:data:`SINGLE`) nothing here talks
to another process and no module is wrapped.

Gradients are *summed* over ranks (divide factor 1): each rank's loss is
already normalised by the whole minibatch's token count, so the sum is the
one-rank gradient of the same minibatch.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rlix.exec.messages import Rendezvous
from rlix.weightsync.buckets import full

# Seconds a collective may wait for the other ranks before failing (a dead rank
# must not hang the job forever; a stage on a big model can take minutes).
COLLECTIVE_TIMEOUT_S = 600.0


def free_rendezvous(world: int) -> Rendezvous:
    """A rendezvous on this host (called by rank 0): its address and a port the OS says is free."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    return Rendezvous(host=host, port=port, world=world)


@dataclass(frozen=True, kw_only=True)
class Ranks:
    """This process's place among the trainer's data-parallel ranks."""

    rank: int = 0
    world: int = 1
    mesh: Any = field(default=None, compare=False, repr=False)  # torch DeviceMesh over all ranks

    def share(self, items: list) -> list:
        """This rank's part of ``items`` (every ``world``-th one, from ``rank``)."""
        return items[self.rank :: self.world]

    def unshare(self, mine: list, total: int) -> list:
        """Every rank's :meth:`share` put back in the original order (a collective)."""
        if self.world == 1:
            return list(mine)
        import torch.distributed as dist

        parts: list = [None] * self.world
        dist.all_gather_object(parts, list(mine))
        out: list = [None] * total
        for r, part in enumerate(parts):
            out[r :: self.world] = part
        return out

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over ranks, in float64 (a collective)."""
        if self.world == 1:
            return list(values)
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def barrier(self) -> None:
        """Wait until every rank gets here (a collective; nothing on one rank)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def shard(self, model, mp_policy=None):
        """``model`` sharded by FSDP2 (each decoder layer its own unit, then the root), computing as
        ``mp_policy`` says (None: in the weights' dtype); unchanged on one rank."""
        if self.world == 1:
            return model
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mp = mp_policy or MixedPrecisionPolicy()

        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the HF model
        layer_types = set(getattr(base, "_no_split_modules", None) or ())
        for module in list(model.modules()):
            if type(module).__name__ in layer_types:
                fully_shard(module, mesh=self.mesh, mp_policy=mp)
        # The root too reshards after forward (its default keeps embeddings and
        # head whole): between calls every parameter is its shard, the one the
        # optimizer holds, and only shards are offloaded.
        fully_shard(model, mesh=self.mesh, reshard_after_forward=True, mp_policy=mp)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # sum, not mean: see the module docstring
                module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-scaled sum)
        return model


SINGLE = Ranks()


def join(rdv: Rendezvous, rank: int) -> Ranks:
    """Join the process group (gloo for CPU tensors, NCCL for CUDA ones) and build the mesh."""
    if rdv.world == 1:
        return SINGLE
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    cuda = torch.cuda.is_available()
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
        init_method=f"tcp://{rdv.host}:{rdv.port}",
        rank=rank,
        world_size=rdv.world,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    if cuda:
        torch.cuda.set_device(0)  # each rank sees only its own GPU
    mesh = init_device_mesh("cuda" if cuda else "cpu", (rdv.world,))
    return Ranks(rank=rank, world=rdv.world, mesh=mesh)


def leave() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def clip_grad_norm(params: list, max_norm: float) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``; returns the norm before.

    Under FSDP2 the per-shard norms are combined into the global one first
    (a collective); every rank then scales its shard by the same factor."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = float(full(torch.nn.utils.get_total_norm(grads)))
    scale = min(max_norm / (norm + 1e-6), 1.0)
    with torch.no_grad():
        for g in grads:
            g.mul_(scale)
    return norm


def shard_like(whole, like):
    """This rank's shard of ``whole`` laid out as ``like`` (a DTensor); ``whole`` as is otherwise.

    Every rank holds ``whole`` (read from the same file), so each cuts its own
    shard: no communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(like, DTensor):
        return whole
    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
