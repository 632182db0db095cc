"""Weight sync: shared host memory page-locked where it lies, so weights copy to a GPU at pinned speed.

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
recently used go first, never one the current sync uses), and registers only
pages of a shared mapping under ``/dev/shm``; once per sync it reads the
process's mappings again, and a range whose mapping is not the one it was
registered in is unregistered when a bucket there is next loaded, not trusted
(one nothing loads again stays registered until the budget drops it). Anything
else (a bucket in the process's own heap, a refused registration) goes through
the staging buffer as before.
"""

from __future__ import annotations

import functools
import mmap
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

__all__ = ["HostPages", "mapping_of", "process_pages", "shared_mapping"]

PAGE = mmap.PAGESIZE
SHARED_ROOT = "/dev/shm/"
REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process
REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: a mapping the process may only read
BUDGET_BYTES = 8 << 30  # shared host memory a process keeps page-locked in place, at most


# Which file a mapping maps, and where: (device, inode, file, address of the file's byte 0). A mapping the
# kernel splits (or that CUDA's registration marks) keeps it; the same file mapped again elsewhere does not.
Mapping = tuple[int, int, str, int]


def mapping_of(start: int, end: int, maps: str | None = None) -> Mapping | None:
    """The shared mapping of a file under ``/dev/shm`` that holds bytes [start, end) whole, or None
    (``maps``: the text of ``/proc/self/maps``, read when not given). Adjacent lines mapping one file
    in one piece (a mapping the kernel split) count as one."""
    run: tuple[int, int, Mapping] | None = None  # the current run of adjacent lines of one mapping
    for line in (_read_maps() if maps is None else maps).splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[1][3:4] != "s" or not fields[5].startswith(SHARED_ROOT):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        which = (int(fields[3].replace(":", ""), 16), int(fields[4]), fields[5], lo - int(fields[2], 16))
        run = (run[0], hi, which) if run is not None and run[1] == lo and run[2] == which else (lo, hi, which)
        if run[0] <= start and end <= run[1]:
            return which
    return None


def _read_maps() -> str:
    path = Path("/proc/self/maps")
    return path.read_text() if path.exists() else ""


def shared_mapping(start: int, end: int, maps: str | None = None) -> bool:
    """Whether bytes [start, end) lie in one shared mapping of a file under ``/dev/shm``."""
    return mapping_of(start, end, maps) is not None


class HostPages:
    """Host page ranges this process page-locked in place, reused, at most ``budget`` bytes.

    ``register(start, nbytes, flags) -> int`` and ``unregister(start) -> int`` are CUDA's
    (``cudaHostRegister``, ``cudaHostUnregister``; 0 is success); ``read_maps()`` gives the text of
    ``/proc/self/maps``, read once per sync (:meth:`sync_done` ends one).

    Each range remembers the mapping it was registered in (:func:`mapping_of`): a range whose
    addresses another mapping holds now (the store unmapped and mapped again) is stale, and is
    unregistered rather than trusted. The ranges one sync uses are never dropped for another of
    the same sync: a version larger than the budget pins what fits and stages the rest, rather
    than registering and dropping every bucket of every sync."""

    def __init__(
        self,
        budget: int,
        register: Callable[[int, int, int], int] | None = None,
        unregister: Callable[[int], int] | None = None,
        read_maps: Callable[[], str] = _read_maps,
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
        self._register, self._unregister, self._read_maps = register, unregister, read_maps
        self._ranges: OrderedDict[int, tuple[int, Mapping]] = OrderedDict()  # start -> (end, its mapping), LRU first
        self._this_sync: set[int] = set()  # starts of the ranges this sync used
        self._maps: str | None = None  # /proc/self/maps as this sync read it
        self.registered_bytes = 0  # bytes registered over the process's life (each range once)

    @property
    def held(self) -> int:
        return sum(end - start for start, (end, _) in self._ranges.items())

    def ranges(self) -> list[tuple[int, int]]:
        return sorted((start, end) for start, (end, _) in self._ranges.items())

    def pinned(self, addr: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``addr`` are page-locked now: inside a range held already, or in shared
        memory whose pages this call registers, merged with the held ranges of the same mapping they
        overlap or touch (two buckets of one version share a page where one ends and the next begins),
        ranges no sync is using dropped, least recently used first, past the budget."""
        start, end = addr - addr % PAGE, -(-(addr + nbytes) // PAGE) * PAGE
        where = self._mapping(start, end)
        if where is None:
            return False
        for stale in [lo for lo, (hi, m) in self._ranges.items() if lo < end and start < hi and m != where]:
            self._drop(stale)  # its mapping is gone: these addresses are another's now
        for lo, (hi, _) in self._ranges.items():
            if lo <= start and end <= hi:
                self._use(lo)
                return True
        merged = [lo for lo, (hi, m) in self._ranges.items() if m == where and lo <= end and start <= hi]
        lo = min([start, *merged])
        hi = max([end, *(self._ranges[m][0] for m in merged)])
        if not self._room(hi - lo, keep=set(merged)):
            return False
        for m in merged:
            self._drop(m)
        for flags in (REGISTER_PORTABLE, REGISTER_PORTABLE | REGISTER_READ_ONLY):
            if self._register(lo, hi - lo, flags) == 0:
                self._ranges[lo] = (hi, where)
                self._use(lo)
                self.registered_bytes += hi - lo
                return True
            self._clear_error()
        return False

    def sync_done(self) -> None:
        """A sync ended: its ranges may be dropped for the next one's, and the maps are read again."""
        self._this_sync.clear()
        self._maps = None

    def _mapping(self, start: int, end: int) -> Mapping | None:
        """The mapping that holds [start, end), read from this sync's maps (read again once if not there:
        the store may have mapped more since)."""
        if self._maps is not None and (found := mapping_of(start, end, self._maps)) is not None:
            return found
        self._maps = self._read_maps()
        return mapping_of(start, end, self._maps)

    def _room(self, nbytes: int, keep: set[int]) -> bool:
        """Make room for ``nbytes`` (the ranges in ``keep`` are merged into it): drop the least recently
        used ranges no sync is using; False, nothing dropped, if that is not enough."""
        free = self.budget - self.held + sum(self._ranges[k][0] - k for k in keep)
        spare = [lo for lo in self._ranges if lo not in keep and lo not in self._this_sync]  # oldest first
        gone = []
        for lo in spare:
            if free >= nbytes:
                break
            free += self._ranges[lo][0] - lo
            gone.append(lo)
        if free < nbytes:
            return False
        for lo in gone:
            self._drop(lo)
        return True

    def _use(self, start: int) -> None:
        self._ranges.move_to_end(start)
        self._this_sync.add(start)

    def _clear_error(self) -> None:
        """A refused registration leaves CUDA's last error set, which the next kernel launch would report."""
        if self._clear is not None:
            self._clear()

    def _drop(self, start: int) -> None:
        """Unregister a range, once no copy still reads it (an earlier bucket of the same sync may)."""
        if self._quiesce is not None:
            self._quiesce()
        del self._ranges[start]
        self._this_sync.discard(start)
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
