"""Free device memory checked before a wake or a stage: a shortfall waits briefly, then is one clear error.

The device is the boundary here (no GPU on this machine): its free-memory query and the wait
between looks are given to :class:`rlix.exec.device_memory.MemoryCheck` by the tests.
"""

from __future__ import annotations

import pytest

from rlix.exec.device_memory import GIB, MEMORY_POLL_S, MemoryCheck, NotEnoughMemoryError


class _Device:
    """A GPU's free memory over time: ``free`` bytes, raised by ``freed`` at every look after ``after`` looks."""

    def __init__(self, free: int, *, after: int = 0, freed: int = 0) -> None:
        self.bytes, self.after, self.freed = free, after, freed
        self.looks = 0
        self.slept = 0.0

    def free(self, device: str) -> int:
        self.looks += 1
        if self.looks > self.after:
            self.bytes += self.freed
        return self.bytes

    def sleep(self, seconds: float) -> None:
        self.slept += seconds


def check(dev: _Device, wait_s: float = 5.0) -> MemoryCheck:
    return MemoryCheck("cuda:0", free=dev.free, wait_s=wait_s, sleep=dev.sleep)


def test_the_first_load_measures_what_it_takes_and_later_loads_wait_for_it():
    dev = _Device(10 * int(GIB))
    mem = check(dev)
    mem.wait_for("wake")  # nothing measured yet: nothing to wait for
    assert dev.looks == 0

    def load():
        dev.bytes -= 4 * int(GIB)  # the engine takes 4 GiB

    mem.measure("wake", load)
    assert mem.measured("wake") == 4 * int(GIB)
    dev.bytes = 3 * int(GIB)  # another process holds the rest ...
    dev.after, dev.freed = dev.looks + 2, int(GIB)  # ... and lets 1 GiB go at the third look
    mem.wait_for("wake")
    assert dev.bytes == 4 * int(GIB) and dev.slept == 2 * MEMORY_POLL_S


def test_a_wake_needs_what_the_sleep_before_it_freed_not_what_the_first_build_took():
    dev = _Device(10 * int(GIB))
    mem = check(dev)

    def build():
        dev.bytes -= 6 * int(GIB)  # engine, context and graphs

    def sleep():
        dev.bytes += 4 * int(GIB)  # weights and KV cache go; context and graphs stay

    mem.measure("wake", build)
    assert mem.measured("wake") == 6 * int(GIB)
    mem.measure_freed("wake", sleep)
    assert mem.measured("wake") == 4 * int(GIB)
    mem.wait_for("wake")  # 8 GiB free: enough for what the wake really takes
    assert dev.slept == 0


def test_a_shortfall_that_lasts_is_one_line_naming_the_device_and_both_figures():
    dev = _Device(int(1.5 * GIB))
    mem = check(dev, wait_s=2.0)
    with pytest.raises(NotEnoughMemoryError) as err:
        mem.wait_for("wake", need=2 * int(GIB))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("wake on cuda:0: 1.50 GiB free, 2.00 GiB needed (waited 2 s)")
    assert dev.slept == pytest.approx(2.0)


def test_nothing_is_checked_where_free_memory_cannot_be_measured():
    mem = MemoryCheck("cpu")  # the real query: None on a CPU
    mem.measure("wake", lambda: None)
    assert mem.measured("wake") is None
    mem.wait_for("wake", need=1 << 40)  # returns at once


def test_a_stage_moves_nothing_onto_a_device_without_room_for_its_parts():
    torch = pytest.importorskip("torch")
    from rlix.exec.messages import LearnerPart
    from rlix.exec.train.residency import Residency

    model = torch.nn.Linear(64, 64)  # 16,640 bytes of fp32
    dev = _Device(10_000)
    res = Residency("cpu", memory=check(dev, wait_s=1.0))
    res.add(LearnerPart.POLICY, model)
    res.offload()
    with pytest.raises(NotEnoughMemoryError, match=r"moving policy onto the device on cuda:0: 0.00 GiB free"):
        res.need([LearnerPart.POLICY])
    assert not res.on_device(LearnerPart.POLICY)  # nothing moved
    dev.bytes = 20_000
    res.need([LearnerPart.POLICY])
    assert res.on_device(LearnerPart.POLICY)
