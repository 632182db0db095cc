"""Weight sync: weights handed to a rollout worker in place on one machine (CUDA IPC), and the choice of path.

On a GPU a trainer publishes each version twice: as host buckets, which Ray's
object store carries to every worker (:mod:`rlix.weightsync.buckets`), and as
the same buckets on its own GPU, kept by a :class:`DeviceBuckets` until its
next stage needs the memory. Their :class:`~rlix.weightsync.types.DeviceHandoff`
(one CUDA IPC handle per bucket, in plain values; the machine and the GPU's
UUID) travels apart from the host buckets: the job's coordinator asks the
trainer for it with each publish and gives it to a waking or syncing worker
with that version's buckets (:class:`~rlix.exec.train.trainer_link.TrainerLink`). A worker on the same machine whose
process sees that GPU opens the handles and copies device to device into its
engine (:func:`open_buckets`); any other worker, and any worker whose open fails,
reads the host buckets. :func:`choose` is that choice, a pure function, and its
:class:`Route` names the path and why, which the run's switch records keep per
sync (:class:`~rlix.weightsync.types.SyncPath`).

Lifetime: a worker copies what it opened before its wake or sync returns and
then closes it (a consumer that may keep tensors, vLLM's loader, gets copies).
The trainer drops its GPU buckets when it reloads for a stage or stages the
next version; the coordinator withdraws their handles before it sends that
reload, so a worker woken from then until the next publish reads the host
buckets. A worker that sees the trainer's GPU runs on it, and the stage starts
only once the scheduler has shrunk that worker, whose shrink waits for its wake
or sync to return: no worker is reading when the buckets go. Off by default
(``TrainOptions.gpu_handoff``): measured on one GPU, not yet under Ray on one.

Cost: the trainer holds one version's bytes (its weights in the rollout dtype)
on its first GPU between stages, beside the rollout worker that may run there.
"""

from __future__ import annotations

import functools
import inspect
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlix.weightsync.types import DeviceHandoff, SyncPath

__all__ = ["DeviceBuckets", "Route", "choose", "host_id", "open_buckets", "visible_gpus"]


@dataclass(frozen=True)
class Route:
    """How one version reaches a worker, and why that way."""

    path: SyncPath
    reason: str


@functools.cache
def host_id() -> str:
    """This machine: its host name and boot id (two machines may share a host name, never a boot)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.exists() else ''}"


def visible_gpus() -> dict[str, int]:
    """UUID -> device index of every CUDA device this process sees (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}


def choose(handoff: DeviceHandoff | None, device: str, host: str, visible: Mapping[str, int]) -> Route:
    """The path onto ``device`` for weights published with ``handoff``, for a worker on ``host`` that
    sees the GPUs ``visible`` (UUID -> index): in place over CUDA IPC when the trainer's GPU is one
    of them, else through the host buckets."""
    if handoff is None:
        return Route(SyncPath.HOST, "published without GPU buckets (a CPU trainer, or adapters only)")
    if not device.startswith("cuda"):
        return Route(SyncPath.HOST, "the worker is not on a CUDA device")
    if handoff.host != host:
        return Route(SyncPath.HOST, "the trainer is on another machine")
    if handoff.device_uuid not in visible:
        return Route(SyncPath.HOST, "the trainer's GPU is not visible to this worker")
    return Route(SyncPath.CUDA_IPC, f"the trainer's GPU is visible here as cuda:{visible[handoff.device_uuid]}")


@functools.cache
def _arg(name: str) -> int:
    """Where ``name`` sits in torch's CUDA IPC rebuild arguments (torch's own names, read once rather
    than assumed)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return list(inspect.signature(rebuild_cuda_tensor).parameters).index(name)


class DeviceBuckets:
    """A trainer's newest weights as buckets on its GPU (written at the end of a training stage), shared
    over CUDA IPC once published, and held until the next stage or version drops them."""

    def __init__(self) -> None:
        self.flats: list = []  # one device tensor per bucket; the handles point into these
        self.slots: tuple = ()  # the buckets' index (TensorSlot), as the host buckets have it
        self.version, self.dtype, self.device = -1, "", ""

    @property
    def nbytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.flats)

    def hold(self, flats: Sequence, slots: tuple, version: int, dtype: str, device: str) -> None:
        self.drop()
        self.flats, self.slots = list(flats), tuple(slots)
        self.version, self.dtype, self.device = version, dtype, device

    def holds(self, version: int, dtype: str) -> bool:
        return bool(self.flats) and (self.version, self.dtype) == (version, dtype)

    def handles(self, version: int, dtype: str) -> DeviceHandoff | None:
        """The CUDA IPC handles of ``version``'s ``dtype`` buckets, if these are held (None otherwise)."""
        return self.share() if self.holds(version, dtype) else None

    def share(self) -> DeviceHandoff:
        """The held buckets' CUDA IPC handles, with this machine and the GPU's UUID."""
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.synchronize(self.device)  # the buckets are written before any other process reads them
        counter, offset = _arg("ref_counter_handle"), _arg("ref_counter_offset")
        handles = []
        for flat in self.flats:
            _, args = reduce_tensor(flat)
            # torch counts one reader per share, and keeps a block whose count is not back to zero out of
            # reuse for good. Any number of workers read these (or none), uncounted (UNCOUNTED), and this
            # keeper decides when they go, so the share's own count is given back at once.
            torch.UntypedStorage._release_ipc_counter_cuda(args[counter], args[offset])
            handles.append(plain_handle(args))
        index = torch.device(self.device).index or 0
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return DeviceHandoff(host=host_id(), device_uuid=uuid, buckets=tuple(handles))

    def drop(self) -> None:
        """Free the held buckets (a stage needs the memory, or a newer version replaces them)."""
        if self.flats:
            import torch

            self.flats, self.slots, self.version = [], (), -1
            if torch.cuda.is_available():
                torch.cuda.ipc_collect()


# A reference-counter file that does not exist: torch's reader then counts nothing when it closes
# (its decrement is best effort), which is right here: the trainer's keeper, not a count of readers,
# decides when the buckets are freed (see the module's "Lifetime").
UNCOUNTED = b"/rlix_handoff_uncounted"


def open_buckets(handoff: DeviceHandoff, visible: Mapping[str, int]) -> list:
    """The trainer's GPU buckets as tensors of this process (no copy), on the index this process
    sees the trainer's GPU at. Close them (drop every reference) once copied."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    at, counter, index = _arg("storage_device"), _arg("ref_counter_handle"), visible[handoff.device_uuid]
    opened = []
    for handle in handoff.buckets:
        args = torch_handle(handle)
        args[at], args[counter] = index, UNCOUNTED
        opened.append(rebuild_cuda_tensor(*args))
    return opened


_CLASSES = ("tensor_cls", "storage_cls")
_SHAPES = ("tensor_size", "tensor_stride")


def plain_handle(args) -> tuple:
    """torch's rebuild arguments of a shared CUDA tensor with no torch object left in them (its classes
    and dtype by name, its shape as tuples), so the processes that only pass a publish on (the job's
    coordinator) unpickle it without importing torch."""
    out = list(args)
    for name in _CLASSES:
        cls = out[_arg(name)]
        out[_arg(name)] = f"{cls.__module__}:{cls.__qualname__}"
    for name in _SHAPES:
        out[_arg(name)] = tuple(out[_arg(name)])
    out[_arg("dtype")] = str(out[_arg("dtype")]).removeprefix("torch.")
    return tuple(out)


def torch_handle(handle: tuple) -> list:
    """:func:`plain_handle`'s arguments as torch's rebuild takes them (its shape as tuples, which it sets)."""
    import importlib

    import torch

    args = list(handle)
    for name in _CLASSES:
        module, _, qualname = args[_arg(name)].partition(":")
        args[_arg(name)] = functools.reduce(getattr, qualname.split("."), importlib.import_module(module))
    args[_arg("dtype")] = getattr(torch, args[_arg("dtype")])
    return args
