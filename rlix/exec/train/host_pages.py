"""Executor layer: shared host memory page-locked where it lies, so weights copy to a GPU at pinned speed.

A rollout worker on the trainer's machine reads the published buckets in
Ray's object store: shared memory (a file under ``/dev/shm`` mapped into every
worker). Copied to a GPU from there, pageable, they move at a fraction of a
pinned copy; copied first into a pinned staging buffer, the host copy is the
slow half (``benchmarks/bench_gpu_torch.py --switches``: about 20 GB/s against
a pinned copy's 55 on an H200). Page-locking the store's pages where they lie
(``cudaHostRegister``) removes that copy: the device reads them directly.

Registering costs about 0.06 s per GB on that machine, so it is kept: the
store hands out the same addresses again as versions come and go, and a
registered range serves every bucket inside it. :class:`HostPages` holds the
ranges this process registered, at most ``budget`` bytes of them (the least
recently used go first), and registers only pages of a shared mapping under
``/dev/shm``, which the store keeps mapped for the life of the process.
Anything else (a bucket in the process's own heap, a refused registration)
goes through the staging buffer as before.
"""

from __future__ import annotations

import functools
import mmap
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

__all__ = ["HostPages", "process_pages", "shared_mapping"]

PAGE = mmap.PAGESIZE
SHARED_ROOT = "/dev/shm/"
REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process
REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: a mapping the process may only read
BUDGET_BYTES = 8 << 30  # shared host memory a process keeps page-locked in place, at most


def shared_mapping(start: int, end: int, maps: str | None = None) -> bool:
    """Whether bytes [start, end) lie in one shared mapping of a file under ``/dev/shm`` (``maps``:
    the text of ``/proc/self/maps``, read when not given)."""
    if maps is None:
        path = Path("/proc/self/maps")
        if not path.exists():
            return False
        maps = path.read_text()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[1][3:4] != "s" or not fields[5].startswith(SHARED_ROOT):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= start and end <= hi:
            return True
    return False


class HostPages:
    """Host page ranges this process page-locked in place, reused, at most ``budget`` bytes.

    ``register(start, nbytes, flags) -> int`` and ``unregister(start) -> int`` are CUDA's
    (``cudaHostRegister``, ``cudaHostUnregister``; 0 is success); ``is_shared(start, end)``
    says whether a range may be registered (:func:`shared_mapping`)."""

    def __init__(
        self,
        budget: int,
        register: Callable[[int, int, int], int] | None = None,
        unregister: Callable[[int], int] | None = None,
        is_shared: Callable[[int, int], bool] = shared_mapping,
    ) -> None:
        self._clear: Callable[[], object] | None = None
        self._quiesce: Callable[[], object] | None = None  # waits for copies still reading registered pages
        if register is None or unregister is None:
            import torch

            cudart = torch.cuda.cudart()
            register, unregister = cudart.cudaHostRegister, cudart.cudaHostUnregister
            self._clear = _flush_cuda_error
            self._quiesce = torch.cuda.synchronize
        self.budget = budget
        self._register, self._unregister, self._is_shared = register, unregister, is_shared
        self._ranges: OrderedDict[int, int] = OrderedDict()  # start -> end, least recently used first
        self.registered_bytes = 0  # bytes registered over the process's life (each range once)

    @property
    def held(self) -> int:
        return sum(end - start for start, end in self._ranges.items())

    def ranges(self) -> list[tuple[int, int]]:
        return sorted(self._ranges.items())

    def pinned(self, addr: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``addr`` are page-locked now: inside a range held already, or in shared
        memory whose pages this call registers, merged with the held ranges they overlap or touch (two
        buckets of one version share a page where one ends and the next begins), the least recently
        used dropped past the budget."""
        start, end = addr - addr % PAGE, -(-(addr + nbytes) // PAGE) * PAGE
        for lo, hi in self._ranges.items():
            if lo <= start and end <= hi:
                self._ranges.move_to_end(lo)
                return True
        merged = [lo for lo, hi in self._ranges.items() if lo <= end and start <= hi]
        lo = min([start, *merged])
        hi = max([end, *(self._ranges[m] for m in merged)])
        if not self._is_shared(lo, hi):  # the ranges lie in different mappings: this one alone
            merged, lo, hi = [m for m in merged if m < end and start < self._ranges[m]], start, end
        if hi - lo > self.budget or not self._is_shared(lo, hi):
            return False
        for m in merged:
            self._drop(m)
        while self._ranges and self.held + (hi - lo) > self.budget:
            self._drop(next(iter(self._ranges)))
        for flags in (REGISTER_PORTABLE, REGISTER_PORTABLE | REGISTER_READ_ONLY):
            if self._register(lo, hi - lo, flags) == 0:
                self._ranges[lo] = hi
                self.registered_bytes += hi - lo
                return True
            self._clear_error()
        return False

    def _clear_error(self) -> None:
        """A refused registration leaves CUDA's last error set, which the next kernel launch would report."""
        if self._clear is not None:
            self._clear()

    def _drop(self, start: int) -> None:
        """Unregister a range, once no copy still reads it (an earlier bucket of the same sync may)."""
        if self._quiesce is not None:
            self._quiesce()
        del self._ranges[start]
        if self._unregister(start) != 0:
            self._clear_error()

    def clear(self) -> None:
        for start in list(self._ranges):
            self._drop(start)


@functools.cache
def process_pages() -> HostPages:
    """This process's registry (a registration is the process's: two registries would refuse each other's)."""
    return HostPages(BUDGET_BYTES)


def _flush_cuda_error() -> None:
    """Clear CUDA's last error through torch's own runtime: a kernel launch reads (and so clears) it and
    raises what it read, which is the refusal already handled."""
    import torch

    try:
        torch.empty(1, device="cuda").zero_()
    except RuntimeError:
        pass
