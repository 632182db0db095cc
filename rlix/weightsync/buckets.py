"""Weight sync: the trainer's weights as rollout workers load them, and as checkpoints take them.

Weight sync without pickles: after each step the trainer *publishes* its
weights once, as :class:`~rlix.weightsync.types.WeightBuckets` -- a few flat
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

On a GPU two shortcuts remove copies: a bucket in the object store's shared
memory is page-locked where it lies (:mod:`rlix.weightsync.host_pages`) and
copied straight to the device, skipping (4); and a worker that sees the
trainer's GPU reads the version in place over CUDA IPC
(:mod:`rlix.weightsync.handoff`), skipping all four. :func:`route_to` chooses,
and :func:`load_into` says which path it took.

:func:`snapshot_of` is the whole state dict in the trainer's own dtype (the
master weights), for checkpoints and in-process checks; it never crosses to a
worker.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import wait

from rlix.weightsync.handoff import DeviceBuckets, Route, choose, host_id, open_buckets, visible_gpus
from rlix.weightsync.host_pages import HostPages, process_pages
from rlix.weightsync.types import SyncPath, TensorSlot, WeightBuckets, WeightSnapshot

__all__ = [
    "BUCKET_BYTES",
    "PinnedStaging",
    "WeightSnapshot",
    "close",
    "device_tensors",
    "load_into",
    "publish_of",
    "route_to",
    "snapshot_of",
    "stage_on_device",
    "views",
]

BUCKET_BYTES = 256 << 20  # bytes per bucket: large copies, and a pinned staging buffer of a bounded size
ALIGN_BYTES = 64  # every tensor starts on a 64-byte boundary inside its bucket
COPY_THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
# threads sharing a bucket's copy into pinned memory (an H100 host: one thread's sync reached a quarter of
# a pageable host-to-device copy, 8 threads' all of it; benchmarks/bench_sync.py)
COPY_SPLIT_BYTES = 8 << 20  # a smaller bucket is copied by one thread


def full(tensor):
    """The whole tensor: a DTensor shard (FSDP2) is all-gathered, a collective every rank calls for the
    same tensors in the same order; a plain tensor is returned as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


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


def publish_of(
    model,
    version: int,
    dtype: str = "bfloat16",
    *,
    keep: bool = True,
    bucket_bytes: int = BUCKET_BYTES,
    on_device: DeviceBuckets | None = None,
):
    """``model``'s weights cast to ``dtype`` into flat buckets, each tensor gathered whole and written once
    (a collective under FSDP2: every rank calls it; only the rank with ``keep`` fills buckets, the others
    return None so the object store holds one copy).

    When ``on_device`` holds this version (:func:`stage_on_device` wrote it while the trainer had its
    GPU), the host buckets are copied from those, one whole bucket at a time. Their CUDA IPC handles
    travel apart (:meth:`~rlix.weightsync.handoff.DeviceBuckets.handles`), withdrawn when the trainer
    drops them."""
    import numpy as np
    import torch

    if on_device is not None and on_device.holds(version, dtype):
        flats, slots = on_device.flats, on_device.slots
        buckets = tuple(np.empty(f.numel() * f.element_size(), dtype=np.uint8) for f in flats)
        for b, flat in zip(buckets, flats):
            torch.from_numpy(b).copy_(flat.view(torch.uint8))
        return WeightBuckets(version=version, dtype=dtype, buckets=buckets, slots=slots, nbytes=sum(b.nbytes for b in buckets))
    slots, sizes = _layout_of(model, dtype, bucket_bytes)
    buckets = tuple(np.empty(n, dtype=np.uint8) for n in sizes) if keep else ()
    _write(model, slots, [torch.from_numpy(b).view(_torch_dtype(dtype)) for b in buckets] if keep else None)
    if not keep:
        return None
    return WeightBuckets(version=version, dtype=dtype, buckets=buckets, slots=slots, nbytes=sum(sizes))


def stage_on_device(
    model, version: int, dtype: str, keeper: DeviceBuckets | None, device: str, *, bucket_bytes: int = BUCKET_BYTES
) -> None:
    """Write ``model``'s weights as ``dtype`` buckets on ``device`` into ``keeper`` (a collective under
    FSDP2; ranks without a keeper only take part), for :func:`publish_of` to publish with CUDA IPC
    handles. Called at the end of a training stage, while the trainer still has its GPU."""
    import torch

    slots, sizes = _layout_of(model, dtype, bucket_bytes)
    flats = None
    if keeper is not None:
        keeper.drop()  # the older version's buckets go before the new ones take their room
        flats = [torch.empty(n, dtype=torch.uint8, device=device).view(_torch_dtype(dtype)) for n in sizes]
    _write(model, slots, flats)
    if keeper is not None:
        keeper.hold(flats, slots, version, dtype, device)


def _layout_of(model, dtype: str, bucket_bytes: int) -> tuple[tuple[TensorSlot, ...], list[int]]:
    import torch

    sd = model.state_dict()
    itemsize = torch.empty((), dtype=_torch_dtype(dtype)).element_size()
    slots, sizes = _layout({k: (tuple(v.shape), _storage_key(v)) for k, v in sd.items()}, itemsize, bucket_bytes)
    return tuple(slots), sizes


def _write(model, slots: tuple[TensorSlot, ...], flats: list | None) -> None:
    """Each of ``model``'s tensors gathered whole (a collective under FSDP2) and, with ``flats``, cast
    into its slot (a tied weight once)."""
    import torch

    sd = model.state_dict()
    written: set[tuple[int, int]] = set()
    with torch.no_grad():
        for slot in slots:
            if (slot.bucket, slot.offset) in written:  # a tied weight: its bytes are there already
                continue
            written.add((slot.bucket, slot.offset))
            whole = full(sd[slot.name]).detach()
            if flats is not None:
                flats[slot.bucket][slot.offset : slot.offset + slot.numel].copy_(whole.reshape(-1))


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
    """Carries buckets to a CUDA device at pinned speed, reused across syncs. A bucket in shared memory (Ray's
    object store) is page-locked where it lies (:class:`~rlix.weightsync.host_pages.HostPages`) and copied
    straight to the device; any other goes through two page-locked buffers: a bucket is copied into one
    while the other's host-to-device copy may still run. That host copy is the slow half, so
    ``copy_threads`` threads share it (a worker process runs one torch thread; a copy releases the GIL)."""

    def __init__(self, copy_threads: int = COPY_THREADS, pages: HostPages | None = None) -> None:
        self._bufs: list = []
        self._events: list = []
        self._turn = 0
        self._threads = max(1, copy_threads)
        self._pool = None
        self.pages = pages  # the process's registry unless given (set at the first copy to a device)
        self._direct = False  # a copy straight from the caller's memory may still run
        self.direct_copies = 0  # buckets copied straight from page-locked shared memory, over the process's life

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
        """``flat`` (a CPU tensor) as a new tensor on ``device``: straight from its own pages when they can be
        page-locked in place (call :meth:`wait` before its memory may go), else via a pinned buffer."""
        import torch

        n = flat.numel() * flat.element_size()
        if self.pages is None:
            self.pages = process_pages()
        if n and self.pages.pinned(flat.data_ptr(), n):
            out = torch.empty(flat.numel(), dtype=flat.dtype, device=device)
            out.copy_(flat, non_blocking=True)
            self._direct = True
            self.direct_copies += 1
            return out
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

    def wait(self, device: str) -> None:
        """Every copy straight from a caller's memory done (its buffers may be released after); the sync
        is over (:meth:`HostPages.sync_done`)."""
        try:
            if self._direct:
                import torch

                torch.cuda.current_stream(device).synchronize()
                self._direct = False
        finally:  # a failed sync ends too: the next one reads the mappings afresh
            if self.pages is not None:
                self.pages.sync_done()


def route_to(
    w: WeightBuckets, device: str, *, host: str | None = None, visible: Mapping[str, int] | None = None
) -> tuple[Route, list | None]:
    """How ``w`` reaches ``device`` (:func:`~rlix.weightsync.handoff.choose`, for this machine and the
    GPUs this process sees unless ``host`` and ``visible`` say otherwise), and over CUDA IPC the
    trainer's buckets opened here; a failed open falls back to the host buckets, saying why."""
    if visible is None:
        visible = visible_gpus() if w.handoff is not None and device.startswith("cuda") else {}
    route = choose(w.handoff, device, host or host_id(), visible)
    if route.path is not SyncPath.CUDA_IPC:
        return route, None
    try:
        return route, open_buckets(w.handoff, visible)
    except Exception as exc:  # noqa: BLE001 -- any failure to open leaves the host buckets, which always work
        return Route(SyncPath.HOST, f"CUDA IPC open failed ({type(exc).__name__}: {exc}); through the host"), None


def device_tensors(
    w: WeightBuckets, device: str, staging: PinnedStaging | None = None, opened: list | None = None, *, keep: bool = False
) -> Iterator[tuple[str, object]]:
    """(name, tensor on ``device``) for every slot of ``w``, bucket by bucket: views of the trainer's own
    GPU buckets when ``opened`` (:func:`route_to`; on their device, which may be another GPU of this
    machine); else on a CPU views of the host buckets themselves, and on CUDA views of each bucket's
    device copy (a fresh tensor per bucket, so a consumer may keep them). ``keep``: the consumer may keep
    what it is given (vLLM's loader), so the trainer's buckets are copied first (device to device), never
    lent: they are freed at its next stage."""
    dt = _torch_dtype(w.dtype)
    on_cuda = device.startswith("cuda")
    if opened is None and on_cuda:
        staging = staging or PinnedStaging()
    by_bucket: dict[int, list[TensorSlot]] = {}
    for s in w.slots:
        by_bucket.setdefault(s.bucket, []).append(s)
    try:
        for b, slots in sorted(by_bucket.items()):
            if opened is not None:
                flat = opened[b].clone() if keep else opened[b]
            else:
                flat = _flat(w.buckets[b], dt)
                if on_cuda:
                    flat = staging.to_device(flat, device)
            for s in slots:
                yield s.name, flat[s.offset : s.offset + s.numel].view(s.shape)
    finally:  # consumed, abandoned or failed: no copy still reads the caller's buckets
        if staging is not None and on_cuda:
            staging.wait(device)


def close(opened: list | None, device: str) -> None:
    """Every copy out of the trainer's opened buckets done, then this process's references to them gone
    (the trainer may free them after)."""
    if opened:
        import torch

        torch.cuda.synchronize(device)
        opened.clear()


def load_into(model, w: WeightBuckets, device: str, staging: PinnedStaging | None = None) -> Route:
    """Copy ``w`` into ``model``'s parameters and buffers in place (cast to their dtype); every state-dict
    entry must have a slot and every slot an entry. Returns the route the weights came by."""
    import torch

    target = model.state_dict(keep_vars=True)
    names = {s.name for s in w.slots}
    if names != set(target):
        missing, unexpected = sorted(set(target) - names), sorted(names - set(target))
        raise ValueError(f"weights v{w.version} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    route, opened = route_to(w, device)
    try:
        with torch.no_grad():
            for name, t in device_tensors(w, device, staging, opened):
                target[name].copy_(t)
    finally:
        close(opened, device)
    return route
