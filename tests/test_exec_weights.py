"""Weight sync without pickles: the trainer publishes flat bf16 buckets once per version; a rollout
worker reads them as zero-copy views and loads them into its engine.

"Today's" sync is what the coordinator moved before: the trainer's fp32 state dict pickled into
Ray's object store (``snapshot_of``), which every worker unpickled. Bytes through the store are
measured as Ray stores a value: pickle protocol 5, numpy buffers out of band.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]

torch = pytest.importorskip("torch")

from rlix.exec.data.model import ModelSize, build_model, load_model  # noqa: E402
from rlix.exec.messages import GenRequest  # noqa: E402
from rlix.exec.rollout.torch_backend import TorchRolloutBackend  # noqa: E402
from rlix.weightsync.buckets import device_tensors, publish_of, snapshot_of, views  # noqa: E402

SIZE = ModelSize(arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(SIZE, tmp_path_factory.mktemp("weights_model"))


def trained(model_dir, seed: int = 1):
    """The model after an 'update' (every weight moved), as a trainer holds it (fp32)."""
    model = load_model(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def stored(value) -> tuple[bytes, list]:
    """``value`` as Ray's object store holds it: the in-band pickle and the out-of-band buffers."""
    buffers: list = []
    inband = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return inband, buffers


def read_back(value):
    """``value`` as a worker on the same node reads it: unpickled over the stored buffers, read-only as
    Ray's shared memory is, without a copy."""
    inband, buffers = stored(value)
    shared = [b.raw().toreadonly() for b in buffers]
    return pickle.loads(inband, buffers=shared), shared


def test_a_sync_moves_at_most_055x_the_bytes_of_the_pickled_fp32_snapshot(model_dir):
    model = trained(model_dir)
    before = snapshot_of(model, 1)
    old_inband, old_buffers = stored(before)
    old_bytes = len(old_inband) + sum(b.raw().nbytes for b in old_buffers)

    w = publish_of(model, 1)
    inband, buffers = stored(w)
    new_bytes = len(inband) + sum(b.raw().nbytes for b in buffers)

    assert w.dtype == "bfloat16" and len(w.buckets) >= 1
    assert new_bytes <= 0.55 * old_bytes, (new_bytes, old_bytes)
    assert w.nbytes <= 0.55 * before.nbytes  # what SwitchRecord.synced_bytes books, before and after
    assert sum(b.raw().nbytes for b in buffers) == w.nbytes  # every weight byte travels out of band
    assert len(inband) < 0.02 * w.nbytes and b"torch" not in inband  # the index only: no pickled tensor
    print(f"bytes per sync: before {old_bytes}, after {new_bytes} ({new_bytes / old_bytes:.3f}x)")


def test_tied_weights_travel_once_and_rank_gt0_keeps_nothing(model_dir):
    model = trained(model_dir)
    w = publish_of(model, 1)
    slots = {s.name: s for s in w.slots}
    emb, head = slots["model.embed_tokens.weight"], slots["lm_head.weight"]
    assert (emb.bucket, emb.offset) == (head.bucket, head.offset)  # one copy of the tied matrix
    unique = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    assert w.nbytes < 2 * unique + 64 * len(w.slots)
    assert publish_of(model, 1, keep=False) is None


def test_small_buckets_split_the_weights_and_read_back_the_same(model_dir):
    model = trained(model_dir)
    one, many = publish_of(model, 1), publish_of(model, 1, bucket_bytes=32 << 10)
    assert len(one.buckets) == 1 and len(many.buckets) > 3
    for i, bucket in enumerate(many.buckets):  # within the bound, or one tensor larger than it alone
        assert bucket.nbytes <= 32 << 10 or len({s.offset for s in many.slots if s.bucket == i}) == 1
    a, b = views(one), views(many)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_consumer_that_may_keep_the_tensors_gets_copies_of_the_trainers_buckets_never_views(model_dir):
    """vLLM's loader may keep what it is given; the trainer's buckets read in place are freed at its next
    stage, so such a consumer gets its own copy of each (here CPU tensors stand in for the opened GPU buckets)."""
    w = publish_of(load_model(model_dir), 1, "float32")
    opened = [torch.from_numpy(np.frombuffer(b, dtype=np.float32).copy()) for b in w.buckets]
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in opened]

    def lent(t) -> bool:
        return any(lo <= t.data_ptr() < hi for lo, hi in spans)

    viewed, kept = dict(device_tensors(w, "cpu", opened=opened)), dict(device_tensors(w, "cpu", opened=opened, keep=True))
    assert all(lent(t) for t in viewed.values()) and not any(lent(t) for t in kept.values())
    assert all(torch.equal(viewed[name], t) for name, t in kept.items()) and kept.keys() == views(w).keys()


def test_a_worker_reads_the_buckets_in_place_and_serves_the_trainers_bf16_rounded_weights(model_dir):
    model = trained(model_dir)
    w, buffers = read_back(publish_of(model, 7))
    for bucket, shared in zip(w.buckets, buffers):
        assert not bucket.flags.writeable and np.shares_memory(bucket, np.frombuffer(shared, np.uint8))  # no copy
    head = next(s for s in w.slots if s.name == "lm_head.weight")
    tensors = dict(device_tensors(w, "cpu"))  # what the engine copies from: views of the same memory
    assert tensors["lm_head.weight"].data_ptr() == w.buckets[head.bucket].ctypes.data + 2 * head.offset

    b = TorchRolloutBackend()
    b.prepare(str(model_dir), "cpu")
    b.wake(None)
    assert b.weight_version == 0
    b.update_weights(w)
    assert b.weight_version == 7
    got = b.model.state_dict()
    want = {k: v.to(torch.bfloat16).to(v.dtype) for k, v in model.state_dict().items()}
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)  # exactly the trainer's weights, rounded to bf16
    assert any(not torch.equal(got[k], v) for k, v in model.state_dict().items())  # rounding did happen


def test_generation_after_a_sync_equals_generation_from_a_model_loaded_with_those_weights(model_dir, tmp_path):
    model = trained(model_dir, seed=3)
    rounded = trained(model_dir, seed=3)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    rounded.save_pretrained(str(tmp_path / "m"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = model_dir / name
        if src.is_file() and not (tmp_path / "m" / name).is_file():
            (tmp_path / "m" / name).write_bytes(src.read_bytes())

    synced = TorchRolloutBackend()
    synced.prepare(str(model_dir), "cpu")
    synced.wake(None)
    req = GenRequest(traj_id=0, prompt_ids=(1, 5, 6, 7), max_new_tokens=12, temperature=1.0, seed=11)
    before = synced.generate(req)
    synced.update_weights(publish_of(model, 1))

    loaded = TorchRolloutBackend()
    loaded.prepare(str(tmp_path / "m"), "cpu")
    loaded.wake(None)  # the checkpoint's weights, loaded as a cold start does

    after, want = synced.generate(req), loaded.generate(req)
    assert after.token_ids == want.token_ids and after.logprobs == want.logprobs
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)  # the sync changed what it serves


def test_a_trajectory_continued_after_an_abort_samples_what_it_would_have_uninterrupted(model_dir):
    """Each token is drawn with a seed of its position, so a trajectory cut after 5 tokens (a shrink)
    and continued from its prefix on another worker ends as the uninterrupted one: sharing never
    changes what a job samples."""
    whole, first, rest = (TorchRolloutBackend() for _ in range(3))
    for b in (whole, first, rest):
        b.prepare(str(model_dir), "cpu")
        b.wake(None)
    req = GenRequest(traj_id=0, prompt_ids=(1, 5, 6, 7), max_new_tokens=16, temperature=1.0, seed=5)
    want = whole.generate(req)
    cut = first.generate(GenRequest(traj_id=0, prompt_ids=req.prompt_ids, max_new_tokens=5, seed=5))
    assert len(cut.token_ids) == 5 and cut.token_ids[-1] != first.eos_id
    got = rest.generate(
        GenRequest(
            traj_id=0,
            prompt_ids=req.prompt_ids,
            max_new_tokens=16,
            seed=5,
            prefix_ids=cut.token_ids,
            prefix_logprobs=cut.logprobs,
        )
    )
    assert len(want.token_ids) > 6  # the continuation drew tokens of its own
    assert got.token_ids == want.token_ids
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)  # re-prefilled, not decoded step by step


@pytest.mark.parametrize("threads,numel", [(4, 5_000_003), (8, 4_194_307), (3, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "inference"])
def test_the_staging_host_copy_split_over_threads_copies_every_byte(threads, numel, layout, monkeypatch):
    """The object store -> pinned half of a CUDA sync, on plain CPU tensors, split whatever the size: every
    part lands where it belongs (sizes that do not divide by the thread count, fewer elements than threads),
    from a strided source too, and under inference mode (the parts run in the caller's mode)."""
    from rlix.weightsync import buckets
    from rlix.weightsync.buckets import PinnedStaging

    monkeypatch.setattr(buckets, "COPY_SPLIT_BYTES", 0)
    bits = torch.randint(-(2**15), 2**15, (2 * numel if layout == "strided" else numel,), dtype=torch.int16)
    src = bits.view(torch.bfloat16)[::2] if layout == "strided" else bits.view(torch.bfloat16)
    staging = PinnedStaging(copy_threads=threads)
    if layout == "inference":
        with torch.inference_mode():
            dst = torch.zeros_like(src)
            staging._host_copy(dst, src)
    else:
        dst = torch.zeros_like(src)
        staging._host_copy(dst, src)
    assert staging._pool is not None  # the split ran
    assert torch.equal(dst.view(torch.int16), src.contiguous().view(torch.int16))
