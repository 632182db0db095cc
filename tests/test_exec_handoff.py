"""The weight hand-off's choice of path, its fallback and its record (rlix.weightsync.handoff).

What a CPU can check: which path a worker takes for each placement, that a
handle it cannot open sends it through the host buckets with the reason, that
a trainer without staged buckets publishes none, and that the run's metrics
name the path of every load. The CUDA IPC path itself (two processes on one
GPU, bit-exact against the host path, and its seconds) is measured by
``benchmarks/bench_gpu_torch.py --switches``.
"""

from __future__ import annotations

import pytest

from rlix.exec.records import SwitchKind, SwitchRecord
from rlix.weightsync.handoff import DeviceBuckets, choose, host_id
from rlix.weightsync.types import DeviceHandoff, SyncPath

UUID = "GPU-0b3c5d7e"
HANDOFF = DeviceHandoff(host="node-a/boot-1", device_uuid=UUID, buckets=())


@pytest.mark.parametrize(
    "handoff,device,host,visible,path,why",
    [
        (HANDOFF, "cuda:0", "node-a/boot-1", {UUID: 0}, SyncPath.CUDA_IPC, "visible here as cuda:0"),
        (HANDOFF, "cuda:0", "node-a/boot-1", {"GPU-other": 0, UUID: 1}, SyncPath.CUDA_IPC, "visible here as cuda:1"),
        (HANDOFF, "cuda:0", "node-a/boot-1", {"GPU-other": 0}, SyncPath.HOST, "not visible to this worker"),
        (HANDOFF, "cuda:0", "node-b/boot-7", {UUID: 0}, SyncPath.HOST, "on another machine"),
        (HANDOFF, "cuda:0", "node-a/boot-2", {UUID: 0}, SyncPath.HOST, "on another machine"),  # same name, rebooted
        (HANDOFF, "cpu", "node-a/boot-1", {UUID: 0}, SyncPath.HOST, "not on a CUDA device"),
        (None, "cuda:0", "node-a/boot-1", {UUID: 0}, SyncPath.HOST, "published without GPU buckets"),
    ],
)
def test_a_worker_reads_in_place_only_on_the_trainers_machine_seeing_its_gpu(handoff, device, host, visible, path, why):
    route = choose(handoff, device, host, visible)
    assert route.path is path and why in route.reason


def test_this_machine_is_named_by_host_name_and_boot():
    import socket

    name, _, boot = host_id().partition("/")
    assert name == socket.gethostname() and host_id() == f"{name}/{boot}"


def test_a_keeper_holds_one_version_in_one_dtype_and_drops_it():
    keeper = DeviceBuckets()
    assert not keeper.holds(0, "bfloat16") and keeper.nbytes == 0
    torch = pytest.importorskip("torch")
    keeper.hold([torch.zeros(8, dtype=torch.bfloat16)], (), version=3, dtype="bfloat16", device="cpu")
    assert keeper.holds(3, "bfloat16") and keeper.nbytes == 16
    assert not keeper.holds(2, "bfloat16") and not keeper.holds(3, "float16")
    keeper.drop()
    assert not keeper.holds(3, "bfloat16") and keeper.nbytes == 0


@pytest.mark.heavy
@pytest.mark.in_process
def test_handles_a_worker_cannot_open_send_it_through_the_host_bit_exact(tmp_path):
    """A worker that should read in place but whose open fails (here: handles naming a GPU allocation
    that is not there) loads the host buckets instead, the same bytes, and its route says why."""
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    from rlix.exec.data.model import ModelSize, build_model, load_model
    from rlix.weightsync.buckets import publish_of, route_to, views

    size = ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = load_model(build_model(size, tmp_path / "m"))
    w = publish_of(model, 1)
    assert w.handoff is None  # nothing staged on a GPU: host buckets only
    handle = ("torch:Tensor", (8,), (1,), 0, "torch.storage:UntypedStorage", "bfloat16", 0, b"no such block", 16, 0)
    handle += (False, b"c", 0, b"e", False)  # a plain handle of a block no process shared
    bogus = DeviceHandoff(host="this/boot", device_uuid=UUID, buckets=tuple(handle for _ in w.buckets))
    w = replace(w, handoff=bogus)
    route, opened = route_to(w, "cuda:0", host="this/boot", visible={UUID: 0})
    assert route.path is SyncPath.HOST and "CUDA IPC open failed" in route.reason and opened is None

    from rlix.exec.rollout.torch_backend import TorchRolloutBackend

    engine = TorchRolloutBackend()
    engine.prepare(str(tmp_path / "m"), "cpu")
    engine.wake(None)
    engine.update_weights(w)
    assert engine.route.path is SyncPath.HOST and "not on a CUDA device" in engine.route.reason
    want = views(w)
    for name, t in engine.model.state_dict().items():
        assert torch.equal(t, want[name].to(t.dtype)), name


def test_a_handle_carries_no_torch_object_so_a_process_that_passes_it_on_never_imports_torch():
    torch = pytest.importorskip("torch")
    import pickle
    import subprocess
    import sys

    from rlix.weightsync.handoff import plain_handle, torch_handle

    shape, storage = (torch.Tensor, torch.Size([4, 2]), (2, 1), 0), (torch.UntypedStorage, torch.bfloat16, 0, b"h", 16, 0)
    args = (*shape, *storage, False, b"c", 8, b"e", True)  # torch's rebuild arguments of a shared CUDA tensor
    handle = plain_handle(args)
    assert torch_handle(handle) == list(args)
    w = DeviceHandoff(host="node-a/boot-1", device_uuid=UUID, buckets=(handle,))
    code = "import pickle, sys; w = pickle.loads(sys.stdin.buffer.read()); print(w.buckets[0][5], 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(w), capture_output=True, timeout=60)
    assert out.stdout.decode().split() == ["bfloat16", "False"], out.stderr.decode()[-2000:]


def test_the_run_metrics_name_the_path_of_every_weight_load():
    pytest.importorskip("ray")  # the executor's outputs module needs the exec extra
    from rlix.exec.front.outputs import _weight_loads

    switches = [
        SwitchRecord(kind=SwitchKind.WAKE, t=1.0, seconds=0.05, synced_bytes=100, sync_path=SyncPath.CUDA_IPC),
        SwitchRecord(kind=SwitchKind.SLEEP, t=2.0, seconds=0.01),
        SwitchRecord(kind=SwitchKind.SYNC, t=3.0, seconds=0.2, synced_bytes=100, sync_path=SyncPath.HOST),
        SwitchRecord(kind=SwitchKind.WAKE, t=4.0, seconds=0.01),  # a resume with the weights it had: no load
    ]
    assert _weight_loads(switches) == [
        {"t": 1.0, "kind": "wake", "seconds": 0.05, "bytes": 100, "path": "cuda_ipc"},
        {"t": 3.0, "kind": "sync", "seconds": 0.2, "bytes": 100, "path": "host"},
    ]


# ------------------------------------------------------------------ shared host memory page-locked in place


class Cuda:
    """CUDA's cudaHostRegister / cudaHostUnregister as this process sees them: a range registered once,
    an overlapping registration refused (as CUDA refuses it), and what was asked, in order."""

    def __init__(self, refuse_flags: int = -1) -> None:
        self.held: dict[int, int] = {}
        self.calls: list[tuple] = []
        self.refuse_flags = refuse_flags

    def register(self, start: int, nbytes: int, flags: int) -> int:
        self.calls.append(("register", start, nbytes, flags))
        if flags == self.refuse_flags or any(s < start + nbytes and start < s + n for s, n in self.held.items()):
            return 712  # cudaErrorHostMemoryAlreadyRegistered (or refused)
        self.held[start] = nbytes
        return 0

    def unregister(self, start: int) -> int:
        self.calls.append(("unregister", start))
        return 0 if self.held.pop(start, None) is not None else 713


def maps(*mappings: tuple[int, int, str]) -> str:
    """``/proc/self/maps`` text with these shared mappings of files: (first page, end page, file), in pages."""
    from rlix.weightsync.host_pages import PAGE

    return "".join(f"{lo * PAGE:x}-{hi * PAGE:x} rw-s 00000000 00:1a {i + 5} {f}\n" for i, (lo, hi, f) in enumerate(mappings))


ONE_MAPPING = maps((0, 1 << 20, "/dev/shm/plasma"))


def pages(budget: int, cuda: Cuda, text: str = ONE_MAPPING):
    """A registry over ``cuda``, the process's mappings being ``text`` (a list: its last item, as it changes)."""
    from rlix.weightsync.host_pages import HostPages

    read = (lambda: text[-1]) if isinstance(text, list) else (lambda: text)
    return HostPages(budget, cuda.register, cuda.unregister, read_maps=read)


def test_shared_memory_is_registered_once_by_whole_pages_and_reused():
    from rlix.weightsync.host_pages import PAGE

    cuda = Cuda()
    reg = pages(1 << 30, cuda)
    assert reg.pinned(10 * PAGE + 64, 3 * PAGE)  # not page-aligned: its pages are
    assert reg.ranges() == [(10 * PAGE, 14 * PAGE)]
    assert reg.pinned(11 * PAGE, PAGE) and reg.pinned(10 * PAGE, 4 * PAGE)  # inside: nothing registered again
    assert [c[0] for c in cuda.calls] == ["register"] and reg.registered_bytes == 4 * PAGE


def test_ranges_that_overlap_or_touch_merge_and_the_oldest_go_past_the_budget():
    from rlix.weightsync.host_pages import PAGE

    cuda = Cuda()
    reg = pages(8 * PAGE, cuda)
    assert reg.pinned(0, 2 * PAGE) and reg.pinned(5 * PAGE, PAGE)
    assert reg.pinned(2 * PAGE - 8, 8 + PAGE)  # the next bucket begins on the page the first ends on: merged
    assert reg.ranges() == [(0, 3 * PAGE), (5 * PAGE, 6 * PAGE)] and cuda.held == {0: 3 * PAGE, 5 * PAGE: PAGE}
    assert reg.pinned(PAGE, PAGE) and reg.pinned(5 * PAGE + 9, 10)  # inside: nothing registered again
    calls = len(cuda.calls)
    assert reg.pinned(10 * PAGE, 3 * PAGE)  # 3 + 1 + 3 pages fit in 8
    assert len(cuda.calls) == calls + 1 and reg.held == 7 * PAGE
    reg.sync_done()
    assert reg.pinned(20 * PAGE, 2 * PAGE)  # the next sync: 9 > 8, the least recently used (at 0) goes
    assert reg.ranges() == [(5 * PAGE, 6 * PAGE), (10 * PAGE, 13 * PAGE), (20 * PAGE, 22 * PAGE)]
    assert not reg.pinned(30 * PAGE, 9 * PAGE)  # larger than the budget: staged, nothing dropped for it
    assert len(reg.ranges()) == 3
    reg.clear()
    assert cuda.held == {} and reg.ranges() == []


def test_ranges_in_different_mappings_are_not_merged_and_an_overlap_keeps_what_it_had():
    from rlix.weightsync.host_pages import PAGE

    cuda = Cuda()
    reg = pages(1 << 30, cuda, maps((0, 4, "/dev/shm/a"), (4, 64, "/dev/shm/b")))
    assert reg.pinned(2 * PAGE, 2 * PAGE) and reg.pinned(4 * PAGE, PAGE)  # they touch, across two mappings
    assert reg.ranges() == [(2 * PAGE, 4 * PAGE), (4 * PAGE, 5 * PAGE)]
    assert reg.pinned(6 * PAGE, 4 * PAGE)  # b: [6, 10)
    assert reg.pinned(4 * PAGE + 8, 3 * PAGE)  # [4, 8) touches a's range, overlaps b's two: merged with b's whole
    assert reg.ranges() == [(2 * PAGE, 4 * PAGE), (4 * PAGE, 10 * PAGE)]
    assert cuda.held == {2 * PAGE: 2 * PAGE, 4 * PAGE: 6 * PAGE}
    assert not reg.pinned(3 * PAGE, 2 * PAGE)  # across the two mappings: no one mapping holds it, staged


def test_a_range_whose_mapping_was_replaced_is_registered_again():
    from rlix.weightsync.host_pages import PAGE

    cuda = Cuda()
    text = [maps((0, 16, "/dev/shm/a"))]
    reg = pages(1 << 30, cuda, text)
    assert reg.pinned(2 * PAGE, 2 * PAGE)
    reg.sync_done()
    assert reg.pinned(2 * PAGE, PAGE) and len(cuda.calls) == 1  # the same mapping: held, nothing asked
    text.append("".join(maps((0, 3, "/dev/shm/a")).splitlines(True)) + "3000-10000 rw-s 00003000 00:1a 5 /dev/shm/a\n")
    reg.sync_done()  # the kernel split a's mapping in two (a's file, the same place): still the same pages
    assert reg.pinned(2 * PAGE, PAGE) and reg.pinned(2 * PAGE + 8, PAGE) and len(cuda.calls) == 1  # across the split too
    text.append(maps((0, 16, "/dev/shm/b")))  # the store unmapped a and mapped b at the same addresses
    assert reg.pinned(2 * PAGE, PAGE) and len(cuda.calls) == 1  # within a sync the maps are read once
    reg.sync_done()
    assert reg.pinned(2 * PAGE, PAGE)
    assert cuda.calls[1:] == [("unregister", 2 * PAGE), ("register", 2 * PAGE, PAGE, 1)]
    assert reg.ranges() == [(2 * PAGE, 3 * PAGE)]
    text.append("")  # gone: not shared memory any more
    reg.sync_done()
    assert not reg.pinned(2 * PAGE, PAGE)


def test_a_version_over_the_budget_pins_what_fits_and_stages_the_rest_without_thrashing():
    from rlix.weightsync.host_pages import PAGE

    cuda = Cuda()
    reg = pages(4 * PAGE, cuda)
    version = [(0, 2), (10, 2), (20, 2)]  # three buckets of two pages, a budget of four
    for _ in range(3):  # three syncs of the same version, at the same addresses
        assert [reg.pinned(at * PAGE, n * PAGE) for at, n in version] == [True, True, False]
        reg.sync_done()
    assert [c[0] for c in cuda.calls] == ["register", "register"]  # registered once, never dropped
    assert [reg.pinned(at * PAGE, 2 * PAGE) for at in (30, 40)] == [True, True]  # the next version's: the old go
    assert reg.ranges() == [(30 * PAGE, 32 * PAGE), (40 * PAGE, 42 * PAGE)]


def test_only_shared_memory_is_registered_and_a_refusal_tries_read_only_then_stages():
    from rlix.weightsync.host_pages import PAGE, REGISTER_PORTABLE, REGISTER_READ_ONLY

    cuda = Cuda()
    assert not pages(1 << 30, cuda, maps()).pinned(0, PAGE) and cuda.calls == []
    cuda = Cuda(refuse_flags=REGISTER_PORTABLE)
    assert pages(1 << 30, cuda).pinned(0, PAGE)  # a read-only mapping: registered read-only
    assert [c[3] for c in cuda.calls] == [REGISTER_PORTABLE, REGISTER_PORTABLE | REGISTER_READ_ONLY]
    cuda.held[8 * PAGE] = PAGE  # registered by someone else in this process: refused both ways
    reg = pages(1 << 30, cuda)
    assert not reg.pinned(8 * PAGE, PAGE) and reg.ranges() == []


def test_a_shared_mapping_under_dev_shm_is_found_in_the_process_maps(tmp_path):
    import mmap
    from pathlib import Path

    from rlix.weightsync.host_pages import shared_mapping

    if not Path("/dev/shm").is_dir() or not Path("/proc/self/maps").exists():
        pytest.skip("needs /dev/shm and /proc")
    import ctypes
    import tempfile

    with tempfile.TemporaryFile(dir="/dev/shm") as f:
        f.truncate(4 * mmap.PAGESIZE)
        shared = mmap.mmap(f.fileno(), 4 * mmap.PAGESIZE)
        start = ctypes.addressof(ctypes.c_char.from_buffer(shared))
        assert shared_mapping(start, start + 4 * mmap.PAGESIZE)
        assert not shared_mapping(start, start + 5 * mmap.PAGESIZE)  # runs past the mapping
        private = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous: not the object store's
        at = ctypes.addressof(ctypes.c_char.from_buffer(private))
        assert not shared_mapping(at, at + 16)
        del start, at
    fake = "7f0000000000-7f0000100000 rw-p 00000000 00:1a 5 /dev/shm/x\n7f0000200000-7f0000300000 rw-s 00000000 00:1a 6 /tmp/y\n"
    assert not shared_mapping(0x7F0000000000, 0x7F0000000010, fake)  # private, and shared outside /dev/shm
    assert not shared_mapping(0x7F0000200000, 0x7F0000200010, fake)
