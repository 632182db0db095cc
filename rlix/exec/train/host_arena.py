"""Executor layer: one learner's host memory for its offloaded parts, allocated once and reused.

Each part (the policy, the reference, an optimizer's state) gets one flat host
buffer, its tensors laid out back to back, the first time it moves to the
host; every later offload copies into the same buffer. On a CUDA device the
buffer is page-locked (exactly its size, registered with CUDA), so copies run
at the bus's speed rather than through pageable memory (about 2 GB/s on an
H100 host, against ~50 GB/s pinned), and they run on a side stream, ordered
after the work already queued on the device. A reload allocates one flat device tensor per part and fills it with
a single copy; the part's tensors become views of it, so the next offload is
a single copy back. On a CPU the same path runs with plain memory, which is
how the round trip is tested.

A part's tensors are its module's parameters and buffers (each once, ties
kept) or its optimizer's state tensors (step counts stay where they are).
A tensor keeps its identity: a parameter's ``.data`` is swapped, so the
optimizer's references stay valid. A layout that changes (an optimizer's state
appears at its first step) gets a new buffer; :attr:`HostArena.allocations`
counts them, and a replaced buffer is unlocked first. A part whose tensors were
replaced while on the host (a state dict loaded into it) is found out at its
reload and moves with ``.to()``. The buffers live as long as the learner, which
lives as long as its trainer process.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

ALIGN = 64  # bytes: every tensor's offset in a buffer, so each view is aligned for any dtype


@dataclass(frozen=True)
class Handle:
    """One tensor of a part: how to read it and how to point its owner at a new one."""

    get: Callable[[], object]
    set: Callable[[object], None]


@dataclass
class _Region:
    """A part's host buffer and its layout ((offset, shape, dtype) per tensor, in handle order)."""

    host: object  # flat uint8 tensor
    layout: tuple[tuple[int, tuple[int, ...], object], ...]
    pinned: bool = False  # page-locked (registered with CUDA), else pageable
    device_flat: object = None  # the flat device tensor of the last reload, whose views the part's tensors are

    def release(self) -> None:
        """Unlock the buffer's pages (before it is freed)."""
        if self.pinned:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr())
            self.pinned = False


def _page_locked(nbytes: int) -> tuple[object, bool]:
    """A host buffer of exactly ``nbytes``, page-locked where CUDA can lock it (else pageable), and whether it is.

    Registered by hand rather than allocated with ``pin_memory=True``: PyTorch's pinned allocator
    rounds a request up to a power of two and keeps freed blocks locked, up to twice a part's size."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes == 0:
        return host, False
    portable = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process
    return host, int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, portable)) == 0


def module_handles(module) -> list[Handle]:
    """Every parameter (``.data`` swapped, so the Parameter object stays) and buffer of ``module``, each
    once: tied weights are one Parameter, and a buffer registered under several names (or owners) moves
    once with every name pointed at the moved tensor."""
    handles: list[Handle] = []
    seen: set[int] = set()
    for p in module.parameters():  # deduplicated: tied weights move once and stay tied
        if id(p) not in seen:
            seen.add(id(p))
            handles.append(Handle(get=lambda p=p: p.data, set=lambda t, p=p: setattr(p, "data", t)))
    names: dict[int, list[tuple[object, str]]] = {}
    for owner in module.modules():
        for name, b in owner._buffers.items():
            if b is not None and id(b) not in seen:
                names.setdefault(id(b), []).append((owner, name))
    for places in names.values():
        owner, name = places[0]

        def put(t, places=places) -> None:
            for o, n in places:
                o._buffers[n] = t

        handles.append(Handle(get=lambda o=owner, n=name: o._buffers[n], set=put))
    return handles


def optimizer_handles(opt) -> list[Handle]:
    """Every state tensor of ``opt`` (its step counts aside: they stay where the optimizer keeps them)."""
    import torch

    handles = []
    for state in opt.state.values():
        for k, v in state.items():
            if torch.is_tensor(v) and k != "step":
                handles.append(Handle(get=lambda s=state, k=k: s[k], set=lambda t, s=state, k=k: s.__setitem__(k, t)))
    return handles


def plain(handles: list[Handle]) -> bool:
    """True if every tensor is a plain one (not a DTensor shard, whose storage FSDP2 manages itself)."""
    from torch.distributed.tensor import DTensor

    return not any(isinstance(h.get(), DTensor) for h in handles)


class HostArena:
    """The host buffers of one learner's parts (by key), and the copies between them and ``device``."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = device
        self.on_cuda = str(device).startswith("cuda") and torch.cuda.is_available()  # its buffers page-locked
        self._regions: dict[Hashable, _Region] = {}
        self._stream = None
        self.allocations = 0  # host buffers allocated: one per part, again only when its layout changes

    def to_host(self, key: Hashable, handles: list[Handle]) -> int:
        """Copy ``handles``' tensors into ``key``'s host buffer and point them at it; bytes copied."""
        tensors = [h.get() for h in handles]
        region = self._region(key, tensors)
        views = self._views(region.host, region.layout)
        with self._side() as side:
            if region.device_flat is not None and _views_of(tensors, region.device_flat, region.layout):
                region.host.copy_(region.device_flat, non_blocking=side is not None)  # one copy for the whole part
            else:
                for view, t in zip(views, tensors, strict=True):
                    view.copy_(t, non_blocking=side is not None)
            if side is not None:
                side.synchronize()  # the host holds every byte before the device memory goes
        for h, view in zip(handles, views, strict=True):
            h.set(view)
        region.device_flat = None
        return int(region.host.numel()) if tensors else 0

    def to_device(self, key: Hashable, handles: list[Handle]) -> int:
        """Copy ``key``'s host buffer onto the device in one copy and point ``handles`` at views of it; bytes.

        A part whose tensors were replaced while on the host (a state dict loaded into it) is no longer
        in its buffer: its tensors move one by one with ``.to()``, and the buffer is let go."""
        import torch

        region = self._regions.get(key)
        if region is None or not handles:  # never offloaded: nothing to bring back
            return 0
        tensors = [h.get() for h in handles]
        if not _views_of(tensors, region.host, region.layout):
            self._regions.pop(key).release()
            for h, t in zip(handles, tensors, strict=True):
                h.set(t.to(self.device))
            return sum(t.numel() * t.element_size() for t in tensors)
        flat = torch.empty(region.host.numel(), dtype=torch.uint8, device=self.device)
        with self._side() as side:
            flat.copy_(region.host, non_blocking=side is not None)
        if side is not None:
            torch.cuda.current_stream(self.device).wait_stream(side)  # the device's work reads it after the copy
        for h, view in zip(handles, self._views(flat, region.layout), strict=True):
            h.set(view)
        region.device_flat = flat
        return int(flat.numel())

    def is_pinned(self, key: Hashable) -> bool:
        """Whether ``key``'s host buffer is page-locked."""
        region = self._regions.get(key)
        return region is not None and region.pinned

    def host_bytes(self) -> int:
        """Bytes of host memory the arena holds."""
        return sum(int(r.host.numel()) for r in self._regions.values())

    def _region(self, key: Hashable, tensors: list) -> _Region:
        """``key``'s buffer, allocated (or reallocated) when its tensors' layout is new."""
        import torch

        layout, offset = [], 0
        for t in tensors:
            layout.append((offset, tuple(t.shape), t.dtype))
            offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        layout = tuple(layout)
        region = self._regions.get(key)
        if region is None or region.layout != layout:
            if region is not None:
                region.release()
            host, pinned = _page_locked(offset) if self.on_cuda else (torch.empty(offset, dtype=torch.uint8), False)
            region = self._regions[key] = _Region(host=host, layout=layout, pinned=pinned)
            self.allocations += offset > 0  # an empty part (no optimizer state yet) holds nothing
        return region

    @staticmethod
    def _views(flat, layout) -> list:
        import math

        return [flat[off : off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape) for off, shape, dtype in layout]

    def _side(self):
        """A context running copies on this arena's side stream (CUDA; ordered after the device's queued
        work), yielding the stream; on a CPU it yields None and copies run in place."""
        import contextlib

        import torch

        if not self.on_cuda:
            return contextlib.nullcontext(None)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))

        @contextlib.contextmanager
        def on_side():
            with torch.cuda.stream(self._stream):
                yield self._stream

        return on_side()


def _views_of(tensors: list, flat, layout) -> bool:
    """True if each tensor is the view of ``flat`` the layout puts there: same place, shape and dtype,
    contiguous, on ``flat``'s device (nothing replaced or re-strided it since)."""
    if len(tensors) != len(layout):
        return False
    base = flat.data_ptr()
    return all(
        t.device == flat.device
        and t.dtype == dtype
        and tuple(t.shape) == shape
        and t.is_contiguous()
        and t.data_ptr() == base + off
        for t, (off, shape, dtype) in zip(tensors, layout, strict=True)
    )
