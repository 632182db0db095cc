"""An adapter snapshot crosses processes as numpy bytes, and receiving one runs no torch code.

On a CUDA machine the coordinator of a multi-LoRA job (a process without a
GPU, which only passes snapshots on) crashed with a segfault in Ray's
deserializer, first unpickling a torch storage, then making a tensor from
numpy there. Ray pickles values with protocol 5 and keeps numpy buffers out
of band, as these tests do.
"""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from rlix.exec.messages import AdapterSnapshot  # noqa: E402


def _snapshot() -> AdapterSnapshot:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "layers.0.q_proj.lora_A.a.weight": torch.randn(4, 16, generator=g),
        "layers.0.q_proj.lora_B.a.weight": torch.randn(16, 4, generator=g).to(torch.bfloat16),
        "scale": torch.tensor(0.5, dtype=torch.float16),  # a 0-d tensor keeps its shape
    }
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return AdapterSnapshot(name="a", version=3, tensors=tensors, nbytes=nbytes)


def _ray_like_round_trip(value):
    buffers: list = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return data, buffers, pickle.loads(data, buffers=buffers)


def test_an_adapter_snapshot_travels_as_numpy_bytes_and_comes_back_equal():
    snap = _snapshot()
    data, buffers, back = _ray_like_round_trip(snap)
    assert b"torch" not in data  # no torch class or storage in the pickle: nothing for torch.load to read
    assert len(buffers) == len(snap.tensors)  # each tensor's bytes out of band
    assert (back.name, back.version, back.nbytes) == (snap.name, snap.version, snap.nbytes)
    assert back.tensors.keys() == snap.tensors.keys()
    for k, t in snap.tensors.items():
        assert back.tensors[k].dtype == t.dtype and back.tensors[k].shape == t.shape
        assert torch.equal(back.tensors[k], t)


def test_a_received_snapshot_owns_its_tensors_memory():
    import numpy as np

    _, buffers, back = _ray_like_round_trip(_snapshot())
    in_store = {np.frombuffer(b.raw(), np.uint8).ctypes.data for b in buffers}
    # Ray's store memory is read-only and may be reused once the value is read: each tensor is a copy.
    assert not in_store & {t.data_ptr() for t in back.tensors.values()}


def test_receiving_and_passing_on_a_snapshot_runs_no_torch_code(monkeypatch):
    snap = _snapshot()
    data, buffers, _ = _ray_like_round_trip(snap)

    def refused(*args, **kwargs):
        raise AssertionError("torch code ran while a snapshot was received or passed on")

    with monkeypatch.context() as m:
        for name in ("from_numpy", "tensor", "empty", "frombuffer"):
            m.setattr(torch, name, refused)
        back = pickle.loads(data, buffers=buffers)  # what the coordinator does with a snapshot
        assert "scale" in back.tensors and len(back.tensors) == 3  # asking what it holds makes no tensor
        again, _, forwarded = _ray_like_round_trip(back)
    assert again == data  # passed on unread: the same bytes go on
    assert torch.equal(forwarded.tensors["layers.0.q_proj.lora_A.a.weight"], snap.tensors["layers.0.q_proj.lora_A.a.weight"])
