"""Executor layer: the trainer's weights as rollout workers load them, and as checkpoints take them.

Weight sync without pickles: after each step the trainer *publishes* its
weights once, as :class:`~rlix.exec.messages.WeightBuckets` -- a few flat
buffers in the rollout engine's dtype (bfloat16 by default) and a small index
of names, shapes and offsets (:func:`publish_of`). The trainer actor returns
it, so Ray stores it in its object store once per version; the coordinator
hands the same reference to every worker. Ray keeps numpy buffers out of
band, so a worker on the trainer's node reads the buckets as read-only views
of the store's shared memory: no unpickling of per-parameter tensors and no
host copy before the one into the engine (:func:`device_tensors`). On a CUDA
device each bucket goes through a reused pinned staging buffer (one
host-to-device copy per bucket at pinned bandwidth, not one pageable copy per
tensor), the copy into it split over several threads (a worker runs one torch
thread, and one thread's copy from the store is the slow half:
``benchmarks/bench_sync.py``); on a CPU the engine copies straight from the views.

Host copies on the way, trainer to engine: the trainer casts each gathered
tensor into its bucket (1), Ray copies the returned buckets into the object
store (2); a worker reads them in place and copies them into its engine (3),
through the pinned buffer on a GPU (4). The pickled path before this took a
CPU copy of an already-CPU state dict, pickled it (fp32), put it, and
unpickled it in every worker before the engine's copy.

:func:`snapshot_of` is the whole state dict in the trainer's own dtype (the
master weights), for checkpoints and in-process checks; it never crosses to a
worker.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import wait

from rlix.exec.messages import TensorSlot, WeightBuckets, WeightSnapshot
from rlix.exec.train.fsdp import full

__all__ = ["BUCKET_BYTES", "PinnedStaging", "WeightSnapshot", "device_tensors", "load_into", "publish_of", "snapshot_of", "views"]

BUCKET_BYTES = 256 << 20  # bytes per bucket: large copies, and a pinned staging buffer of a bounded size
ALIGN_BYTES = 64  # every tensor starts on a 64-byte boundary inside its bucket
COPY_THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
# threads sharing a bucket's copy into pinned memory (an H100 host: one thread's sync reached a quarter of
# a pageable host-to-device copy, 8 threads' all of it; benchmarks/bench_sync.py)
COPY_SPLIT_BYTES = 8 << 20  # a smaller bucket is copied by one thread


def snapshot_of(model, version: int) -> WeightSnapshot:
    """A detached CPU copy of ``model``'s weights in their own dtype (gathered whole when FSDP2 shards
    them: a collective, called by every rank)."""
    tensors = {k: full(v).detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return WeightSnapshot(version=version, tensors=tensors, nbytes=nbytes)


def _torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _storage_key(t) -> tuple:
    """Equal for tensors that are the same parameter (tied weights), DTensor shards included."""
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return (local.data_ptr(), tuple(t.shape), tuple(local.stride())) if local.numel() else (id(t),)


def _layout(shapes: Mapping[str, tuple[tuple[int, ...], tuple]], itemsize: int, bucket_bytes: int):
    """Slots for ``shapes`` (name -> (shape, storage key)), and each bucket's bytes; a tensor aliasing an
    earlier one (same storage key) shares its slot's bytes; a tensor larger than a bucket gets its own."""
    align = max(1, ALIGN_BYTES // itemsize)
    slots: list[TensorSlot] = []
    sizes: list[int] = []  # elements per bucket
    seen: dict[tuple, TensorSlot] = {}
    for name, (shape, key) in shapes.items():
        if key in seen:
            first = seen[key]
            slots.append(TensorSlot(name=name, shape=shape, bucket=first.bucket, offset=first.offset, numel=first.numel))
            continue
        numel = 1
        for d in shape:
            numel *= d
        start = -(-sizes[-1] // align) * align if sizes else 0
        if not sizes or (start + numel) * itemsize > bucket_bytes and sizes[-1] > 0:
            sizes.append(0)
            start = 0
        slot = TensorSlot(name=name, shape=tuple(shape), bucket=len(sizes) - 1, offset=start, numel=numel)
        sizes[-1] = start + numel
        seen[key] = slot
        slots.append(slot)
    return slots, [n * itemsize for n in sizes]


def publish_of(model, version: int, dtype: str = "bfloat16", *, keep: bool = True, bucket_bytes: int = BUCKET_BYTES):
    """``model``'s weights cast to ``dtype`` into flat buckets, each tensor gathered whole and written once
    (a collective under FSDP2: every rank calls it; only the rank with ``keep`` fills buckets, the others
    return None so the object store holds one copy)."""
    import numpy as np
    import torch

    sd = model.state_dict()
    tdt = _torch_dtype(dtype)
    itemsize = torch.empty((), dtype=tdt).element_size()
    slots, sizes = _layout({k: (tuple(v.shape), _storage_key(v)) for k, v in sd.items()}, itemsize, bucket_bytes)
    buckets = tuple(np.empty(n, dtype=np.uint8) for n in sizes) if keep else ()
    flats = [torch.from_numpy(b).view(tdt) for b in buckets]
    written: set[tuple[int, int]] = set()
    with torch.no_grad():
        for slot in slots:
            if (slot.bucket, slot.offset) in written:  # a tied weight: its bytes are there already
                continue
            written.add((slot.bucket, slot.offset))
            whole = full(sd[slot.name]).detach()
            if keep:
                flats[slot.bucket][slot.offset : slot.offset + slot.numel].copy_(whole.reshape(-1))
    if not keep:
        return None
    return WeightBuckets(version=version, dtype=dtype, buckets=buckets, slots=tuple(slots), nbytes=sum(sizes))


def _flat(bucket, dtype):
    """A torch view of one bucket (zero copy; the object store's buffers are read-only, and are only read)."""
    import torch

    if bucket.nbytes == 0:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable buffer": nothing writes through these views
        return torch.frombuffer(bucket, dtype=dtype)


def views(w: WeightBuckets) -> dict:
    """Parameter name -> a CPU tensor viewing ``w``'s buckets (no copy)."""
    dt = _torch_dtype(w.dtype)
    flats = [_flat(b, dt) for b in w.buckets]
    return {s.name: flats[s.bucket][s.offset : s.offset + s.numel].view(s.shape) for s in w.slots}


class PinnedStaging:
    """Two page-locked host buffers, reused across syncs, that carry buckets to a CUDA device: a bucket
    is copied into one while the other's host-to-device copy may still run. The host copy (object store
    to pinned memory) is the slow half, so ``copy_threads`` threads share it (a worker process runs one
    torch thread; a copy releases the GIL)."""

    def __init__(self, copy_threads: int = COPY_THREADS) -> None:
        self._bufs: list = []
        self._events: list = []
        self._turn = 0
        self._threads = max(1, copy_threads)
        self._pool = None

    def _host_copy(self, dst, src) -> None:
        """``dst.copy_(src)`` (same shape), split into ``copy_threads`` contiguous parts copied at once."""
        if self._threads == 1 or dst.shape != src.shape or dst.dim() == 0 or src.numel() * src.element_size() < COPY_SPLIT_BYTES:
            dst.copy_(src)
            return
        import torch

        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="rlix-staging")
        inference = torch.is_inference_mode_enabled()  # thread-local: the parts run in the caller's mode

        def part(d, s) -> None:
            with torch.inference_mode(inference):
                d.copy_(s)

        futures = [self._pool.submit(part, d, s) for d, s in zip(dst.chunk(self._threads), src.chunk(self._threads))]
        wait(futures)  # every part done (or failed) before the buffer is used again
        for f in futures:
            f.result()

    def to_device(self, flat, device: str):
        """``flat`` (a CPU tensor) as a new tensor on ``device``, via a pinned buffer."""
        import torch

        n = flat.numel() * flat.element_size()
        if not self._bufs or self._bufs[0].numel() < n:
            torch.cuda.synchronize(device)  # no copy still reads the buffers being replaced
            self._bufs = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._events = [None, None]
        i, self._turn = self._turn, 1 - self._turn
        if self._events[i] is not None:
            self._events[i].synchronize()  # its previous host-to-device copy is done
        stage = self._bufs[i][:n].view(flat.dtype)
        self._host_copy(stage, flat)
        out = torch.empty(flat.numel(), dtype=flat.dtype, device=device)
        out.copy_(stage, non_blocking=True)
        self._events[i] = torch.cuda.Event()
        self._events[i].record(torch.cuda.current_stream(device))  # the stream the copy into ``out`` went on
        return out


def device_tensors(w: WeightBuckets, device: str, staging: PinnedStaging | None = None) -> Iterator[tuple[str, object]]:
    """(name, tensor on ``device``) for every slot of ``w``, bucket by bucket: on a CPU views of the
    buckets themselves; on CUDA views of each bucket's device copy (a fresh tensor per bucket, so a
    consumer may keep them)."""
    dt = _torch_dtype(w.dtype)
    on_cuda = device.startswith("cuda")
    staging = staging or (PinnedStaging() if on_cuda else None)
    by_bucket: dict[int, list[TensorSlot]] = {}
    for s in w.slots:
        by_bucket.setdefault(s.bucket, []).append(s)
    for b, slots in sorted(by_bucket.items()):
        flat = _flat(w.buckets[b], dt)
        if on_cuda:
            flat = staging.to_device(flat, device)
        for s in slots:
            yield s.name, flat[s.offset : s.offset + s.numel].view(s.shape)


def load_into(model, w: WeightBuckets, device: str, staging: PinnedStaging | None = None) -> None:
    """Copy ``w`` into ``model``'s parameters and buffers in place (cast to their dtype); every state-dict
    entry must have a slot and every slot an entry."""
    import torch

    target = model.state_dict(keep_vars=True)
    names = {s.name for s in w.slots}
    if names != set(target):
        missing, unexpected = sorted(set(target) - names), sorted(names - set(target))
        raise ValueError(f"weights v{w.version} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for name, t in device_tensors(w, device, staging):
            target[name].copy_(t)
