"""Executor layer: free device memory, checked before a wake or a stage loads anything.

A GPU is time-shared: a rollout engine waking on it, or a trainer stage moving
its parts onto it, finds it free only if the previous holder really let go. A
process that has not (still dying, or holding cached memory) would make the
load fail deep inside vLLM or PyTorch with an out-of-memory error. Instead,
before loading, :meth:`MemoryCheck.wait_for` compares the device's free memory
with what the load needs (measured the first time it loaded, then what the
unload before it freed; or given),
waits a short while for it to appear (a dying process lets go within
seconds), and otherwise raises :class:`NotEnoughMemoryError`: one line naming the
device and both figures. A rollout worker whose wake fails so is reported
lost, and the scheduler places no worker of that job on that bundle for
``lost_cooldown_s`` (a backoff, not a loop). On a CPU there is nothing to
check: free memory is not measured and no check waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MEMORY_WAIT_S = 20.0  # how long a load waits for the memory it needs to be free (s)
MEMORY_POLL_S = 0.5  # seconds between looks at the device's free memory
GIB = float(1 << 30)


class NotEnoughMemoryError(RuntimeError):
    """The device lacks the free memory a wake or a stage needs (one line, both figures)."""


def cuda_free_bytes(device: str) -> int | None:
    """Free bytes on a CUDA ``device`` (as the driver counts them, other processes included); None elsewhere."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


class MemoryCheck:
    """Free memory on one device against what its loads need.

    ``free``: the device's free bytes now (None: not measurable, as on a CPU);
    ``sleep`` waits between looks. Both are the device boundary, given in tests.
    """

    def __init__(
        self,
        device: str,
        *,
        free: Callable[[str], int | None] = cuda_free_bytes,
        wait_s: float = MEMORY_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.device = device
        self.free = free
        self.wait_s = wait_s
        self.sleep = sleep
        self.needs: dict[str, int] = {}  # what each kind of load took when first measured (bytes)

    def measured(self, what: str) -> int | None:
        return self.needs.get(what)

    def wait_for(self, what: str, need: int | None = None) -> None:
        """Return once ``need`` bytes (default: what ``what`` took when measured) are free on the device;
        :class:`NotEnoughMemoryError` if they are not within ``wait_s``. Nothing to wait for unmeasured."""
        need = self.needs.get(what) if need is None else need
        if not need:
            return
        waited = 0.0
        while True:
            free = self.free(self.device)
            if free is None or free >= need:
                return
            if waited >= self.wait_s:
                raise NotEnoughMemoryError(
                    f"{what} on {self.device}: {free / GIB:.2f} GiB free, {need / GIB:.2f} GiB needed "
                    f"(waited {waited:g} s); another process holds the rest of the device"
                )
            self.sleep(MEMORY_POLL_S)
            waited += MEMORY_POLL_S

    def measure(self, what: str, load: Callable[[], object]) -> object:
        """Run ``load`` and, the first time, keep the device memory it took as ``what``'s need."""
        if what in self.needs:
            return load()
        before = self.free(self.device)
        out = load()
        after = self.free(self.device)
        if before is not None and after is not None:
            self.needs[what] = max(before - after, 0)
        return out

    def measure_freed(self, what: str, unload: Callable[[], object]) -> object:
        """Run ``unload`` and keep the device memory it gave back as ``what``'s need from now on (a wake
        needs what the sleep before it freed, not what the first wake took: the engine's context and
        graphs stay while it sleeps)."""
        before = self.free(self.device)
        out = unload()
        after = self.free(self.device)
        if before is not None and after is not None and after > before:
            self.needs[what] = after - before
        return out
