"""The weight hand-off's choice of path, its fallback and its record (rlix.exec.train.handoff).

What a CPU can check: which path a worker takes for each placement, that a
handle it cannot open sends it through the host buckets with the reason, that
a trainer without staged buckets publishes none, and that the run's metrics
name the path of every load. The CUDA IPC path itself (two processes on one
GPU, bit-exact against the host path, and its seconds) is measured by
``benchmarks/bench_gpu_torch.py --switches``.
"""

from __future__ import annotations

import pytest

from rlix.exec.messages import DeviceHandoff
from rlix.exec.records import SwitchKind, SwitchRecord, SyncPath
from rlix.exec.train.handoff import DeviceBuckets, choose, host_id

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
def test_handles_a_worker_cannot_open_send_it_through_the_host_bit_exact(tmp_path):
    """A worker that should read in place but whose open fails (here: handles naming a GPU allocation
    that is not there) loads the host buckets instead, the same bytes, and its route says why."""
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    from rlix.exec.data.model import ModelSize, build_model, load_model
    from rlix.exec.train.weights import publish_of, route_to, views

    size = ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = load_model(build_model(size, tmp_path / "m"))
    w = publish_of(model, 1)
    assert w.handoff is None  # nothing staged on a GPU: host buckets only
    bogus = DeviceHandoff(host="this/boot", device_uuid=UUID, buckets=tuple((None,) * 15 for _ in w.buckets))
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


def test_the_run_metrics_name_the_path_of_every_weight_load():
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
