"""Weight sync's values: a published version's buckets, their index, the hand-off's handles, the path taken.

Plain dataclasses (numpy buffers, no torch object), so the processes that only
pass a publish on never import torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceHandoff", "SyncPath", "TensorSlot", "WeightBuckets", "WeightSnapshot"]


class SyncPath(enum.Enum):
    """How a rollout worker received the trainer's weights (:mod:`rlix.weightsync.handoff` chooses)."""

    HOST = "host"  # the published host buckets (the object store), through pinned staging on a GPU
    CUDA_IPC = "cuda_ipc"  # read in place from the trainer's own GPU buckets (same machine, same GPU visible)


@dataclass(frozen=True, kw_only=True)
class WeightSnapshot:
    """Policy weights at ``version`` (0 = initial), tensors on the CPU, in the trainer's own dtype.

    In-process only (checkpoints, tests): what crosses to rollout workers is
    :class:`WeightBuckets`."""

    version: int
    tensors: Any  # mapping parameter name -> CPU torch.Tensor (a state dict)
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class TensorSlot:
    """Where one parameter lies in a :class:`WeightBuckets`: bucket, offset and length in elements."""

    name: str
    shape: tuple[int, ...]
    bucket: int
    offset: int  # elements from the bucket's start (64-byte aligned)
    numel: int


@dataclass(frozen=True, kw_only=True)
class WeightBuckets:
    """Policy weights at ``version`` as a few flat buffers and an index: what a trainer publishes once
    per version and every rollout worker loads.

    ``buckets`` are numpy ``uint8`` arrays holding ``dtype`` elements (numpy has no
    bfloat16): Ray stores them out of band, so a worker on the same node reads them
    as read-only views of the object store's shared memory, without unpickling
    per-parameter tensors. Tied parameters share one slot's bytes. ``nbytes`` is
    the bytes of the buckets (what one sync moves)."""

    version: int
    dtype: str  # "bfloat16" | "float16" | "float32": the elements' dtype (torch name)
    buckets: tuple[Any, ...]  # numpy uint8 arrays
    slots: tuple[TensorSlot, ...]
    nbytes: int
    handoff: DeviceHandoff | None = None  # the same buckets on the trainer's GPU (CUDA only), for workers beside it


@dataclass(frozen=True, kw_only=True)
class DeviceHandoff:
    """Where a trainer also keeps a published version's buckets on its GPU, for a rollout worker that
    sees the same GPU to read them in place over CUDA IPC (:mod:`rlix.weightsync.handoff`).

    ``host`` names the machine (host name and boot id) and ``device_uuid`` the GPU, so a worker
    maps the GPU to its own device index whatever devices its process sees. ``buckets`` holds one
    CUDA IPC handle per bucket (the arguments torch rebuilds a shared CUDA tensor from, in plain
    values: :func:`rlix.weightsync.handoff.plain_handle`), in the order of :attr:`WeightBuckets.buckets`."""

    host: str
    device_uuid: str
    buckets: tuple[tuple[Any, ...], ...]
