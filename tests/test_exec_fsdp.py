"""Data-parallel training without Ray: 2 ranks (FSDP2 over gloo, CPU processes) against 1.

The same learner code runs in 2 spawned processes that form a
torch.distributed group; rank 0 writes what it saw. On the same batch, the
losses, log-probs and updated weights must match the one-rank learner within
float tolerance (the sums run in another order), and a LoRA checkpoint
written by 2 ranks must resume on 2 ranks and on 1.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import replace

import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]

WORLD = 2
# The comparisons run in float64, where sums split over ranks round at ~1e-16:
# measured differences are ~1e-17 (losses) and ~2e-15 (weights after eight AdamW
# steps; float32 leaves ~2e-6), so these bounds fail on any real mismatch (a
# wrong normaliser, a lost share or an unclipped shard moved weights by ~1e-2).
DTYPE = "float64"
LOSS_TOL = dict(rel=1e-9, abs=1e-12)
WEIGHT_ATOL = 1e-9
ADAPTERS = (("a", 3), ("b", 4))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(n: int = 7, seed: int = 0):
    """``n`` trajectories of uneven prompt/completion lengths (padding differs per rank)."""
    import torch

    from rlix.exec.train.grpo import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, c = 2 + i % 3, 1 + (i * 5) % 7
        ids = torch.randint(3, 40, (p + c,), generator=g).tolist()
        out.append(
            Sample(prompt_ids=tuple([1] + ids[1:p]), completion_ids=tuple(ids[p:]), advantage=float(torch.randn((), generator=g)))
        )
    return out


def _perturbed(samples, rows, shift: float):
    """Old log-probs that differ from the policy's, so ratios clip on some tokens."""
    return [
        replace(s, old_logprobs=tuple(x + shift * ((i + j) % 3 - 1) for j, x in enumerate(r)))
        for i, (s, r) in enumerate(zip(samples, rows))
    ]


# ------------------------------------------------------------ the programs every rank runs


def full_program(ranks, model_dir: str, _ckpt: str, dtype: str = DTYPE) -> dict:
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner

    cfg = GrpoConfig(kl_coef=0.1, minibatches=4, lr=3e-3, seed=5)  # 7 samples in 4 minibatches: one rank is idle in some
    learner = GrpoLearner(model_dir, "cpu", cfg, ranks=ranks, dtype=dtype)
    samples = _samples()
    old = learner.logprobs(samples)
    samples = _perturbed(samples, old, 0.3)
    ref = learner.logprobs(samples, reference=True)
    samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, ref)]
    stats = [learner.train(samples) for _ in range(2)]
    learner.offload()
    learner.reload()
    after = learner.logprobs(samples)
    return {"old": old, "stats": stats, "after": after, "weights": learner.snapshot().tensors}


def _full(ranks, model_dir: str, dtype: str = DTYPE, **options):
    from rlix.exec.messages import TrainOptions
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner

    cfg = GrpoConfig(kl_coef=0.1, minibatches=4, lr=3e-3, seed=5)
    return GrpoLearner(model_dir, "cpu", cfg, ranks=ranks, dtype=dtype, options=TrainOptions(**options))


def _full_step(learner, seed: int):
    samples = _samples(seed=seed)
    samples = _perturbed(samples, learner.logprobs(samples), 0.3)
    ref = learner.logprobs(samples, reference=True)
    return learner.train([replace(s, ref_logprobs=tuple(x - 0.1 for x in r)) for s, r in zip(samples, ref)])


def _whole_state(learner) -> dict:
    """Weights and optimizer state, gathered whole (a collective), on the CPU."""
    from rlix.weightsync.buckets import full

    opt = learner.opt.state_dict()["state"]
    return {
        "weights": learner.snapshot().tensors,
        "opt": {i: {k: full(v).detach().to("cpu", copy=True) for k, v in s.items()} for i, s in sorted(opt.items())},
    }


def full_checkpoint_save(ranks, model_dir: str, ckpt: str, dtype: str = DTYPE) -> dict:
    from rlix.exec.train import checkpoint

    learner = _full(ranks, model_dir, dtype)
    stats = [_full_step(learner, seed) for seed in range(2)]
    checkpoint.save(learner, ckpt, model_dir)  # every rank writes its shards
    return {"stats": stats, "state": _whole_state(learner)}


def full_checkpoint_resume(ranks, model_dir: str, ckpt: str, dtype: str = DTYPE) -> dict:
    from rlix.exec.train import checkpoint

    learner = _full(ranks, model_dir, dtype)
    step = checkpoint.restore(learner, ckpt)
    state = _whole_state(learner)
    return {"step": step, "state": state, "next": _full_step(learner, 2)}


def precision_program(ranks, model_dir: str, _ckpt: str, precision: str) -> dict:
    """Float32 master weights computing in ``precision`` (bf16 on 2 ranks: FSDP2's mixed-precision policy)."""
    learner = _full(ranks, model_dir, "float32", precision=precision)
    samples = _samples()
    return {"old": learner.logprobs(samples), "stats": [_full_step(learner, seed) for seed in range(2)]}


def _lora(ranks, model_dir: str):
    from rlix.exec.train.grpo import GrpoConfig
    from rlix.exec.train.lora import LoraLearner, LoraSpec

    spec = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"), adapters=ADAPTERS)
    return LoraLearner(model_dir, "cpu", spec, {n: GrpoConfig(seed=s, lr=5e-3) for n, s in ADAPTERS}, ranks=ranks, dtype=DTYPE)


def _tick(learner, adapter: str, seed: int):
    samples = _samples(seed=seed)
    old = learner.adapter_logprobs(adapter, samples)
    return learner.train_adapter(adapter, _perturbed(samples, old, 0.2))


def lora_program(ranks, model_dir: str, _ckpt: str, _dtype: str = DTYPE) -> dict:
    learner = _lora(ranks, model_dir)
    stats = [_tick(learner, name, seed) for seed, name in enumerate(["a", "b", "a"])]
    snaps = {n: learner.adapter_snapshot(n).tensors for n in learner.spec.names}
    return {"stats": stats, "adapters": snaps, "checkpoint": learner.checkpoint("a")}


def lora_first_half(ranks, model_dir: str, ckpt: str, _dtype: str = DTYPE) -> dict:
    learner = _lora(ranks, model_dir)
    stats = [_tick(learner, "a", seed) for seed in range(2)]
    state = learner.checkpoint("a")  # every rank gathers; rank 0 writes
    if ranks.rank == 0:
        from rlix.exec.train.lora import write_checkpoint

        write_checkpoint(state, "a", ckpt)
    return {"stats": stats}


def lora_second_half(ranks, model_dir: str, ckpt: str, _dtype: str = DTYPE) -> dict:
    learner = _lora(ranks, model_dir)
    versions = learner.restore(ckpt)
    stats = [_tick(learner, "a", seed) for seed in range(versions["a"], 4)]
    return {"stats": stats, "versions": versions}


def _rank_main(rank: int, port: int, program: str, model_dir: str, ckpt: str, out: str, dtype: str) -> None:
    import torch

    from rlix.exec.train.fsdp import Rendezvous, join, leave

    torch.set_num_threads(1)
    ranks = join(Rendezvous(host="127.0.0.1", port=port, world=WORLD), rank)
    try:
        result = globals()[program](ranks, model_dir, ckpt, dtype)
        if rank == 0:
            torch.save(result, out)
    finally:
        leave()
    # Done and saved: skip the interpreter's teardown, where a gloo thread still being
    # joined at exit can abort the rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _on_ranks(program: str, model_dir, tmp_path, ckpt="", dtype=DTYPE) -> dict:
    import torch
    import torch.multiprocessing as mp

    out = tmp_path / f"{program}.pt"
    mp.spawn(_rank_main, args=(_free_port(), program, str(model_dir), str(ckpt), str(out), dtype), nprocs=WORLD, join=True)
    return torch.load(out, weights_only=False)


def _on_one(program: str, model_dir, ckpt="", dtype=DTYPE) -> dict:
    import torch

    from rlix.exec.train.fsdp import SINGLE

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank does: the same kernels, the same sums
    try:
        return globals()[program](SINGLE, str(model_dir), str(ckpt), dtype)
    finally:
        torch.set_num_threads(threads)  # later tests (an in-process vLLM engine) get this process as it was


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlix.exec.data.model import ModelSize, build_model

    return build_model(
        ModelSize(arch="qwen2", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), tmp_path_factory.mktemp("m")
    )


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_stats(two, one):
    for s2, s1 in zip(two, one, strict=True):
        assert s2.tokens == s1.tokens
        assert (s2.loss, s2.kl, s2.clip_fraction) == pytest.approx((s1.loss, s1.kl, s1.clip_fraction), **LOSS_TOL)


def test_two_ranks_train_like_one(model_dir, tmp_path):
    two = _on_ranks("full_program", model_dir, tmp_path)
    one = _on_one("full_program", model_dir)
    for r2, r1 in zip(two["old"] + two["after"], one["old"] + one["after"], strict=True):
        assert r2 == pytest.approx(r1, abs=WEIGHT_ATOL)
    _assert_same_stats(two["stats"], one["stats"])
    assert any(s.clip_fraction > 0 for s in one["stats"]) and one["stats"][0].kl > 0  # every term of the loss is exercised
    diff = _max_diff(two["weights"], one["weights"])
    moved = _max_diff(one["weights"], _on_one_initial(model_dir))
    print(
        f"1 vs 2 ranks: losses {[s.loss for s in one['stats']]} vs {[s.loss for s in two['stats']]}; max weight diff "
        f"{diff:.2e} (update moved {moved:.2e})"
    )
    assert diff < WEIGHT_ATOL < moved


def _on_one_initial(model_dir) -> dict:
    from rlix.exec.data.model import load_model

    return {k: v.detach().clone() for k, v in load_model(model_dir, dtype=DTYPE).state_dict().items()}


def test_two_ranks_train_lora_adapters_like_one(model_dir, tmp_path):
    two = _on_ranks("lora_program", model_dir, tmp_path)
    one = _on_one("lora_program", model_dir)
    _assert_same_stats(two["stats"], one["stats"])
    for name in ("a", "b"):
        assert _max_diff(two["adapters"][name], one["adapters"][name]) < WEIGHT_ATOL
    ck2, ck1 = two["checkpoint"], one["checkpoint"]
    assert ck2["version"] == ck1["version"] == 2
    assert sorted(ck2["opt"]["state"]) == sorted(ck1["opt"]["state"])
    for i, st in ck1["opt"]["state"].items():
        for k, v in st.items():
            assert v.shape == ck2["opt"]["state"][i][k].shape
            assert float((v - ck2["opt"]["state"][i][k]).abs().max()) < WEIGHT_ATOL


def test_checkpoint_written_by_two_ranks_resumes(model_dir, tmp_path):
    ckpt = tmp_path / "ck"
    first = _on_ranks("lora_first_half", model_dir, tmp_path, ckpt)["stats"]
    assert (ckpt / "a" / "state.pt").is_file()
    rest2 = _on_ranks("lora_second_half", model_dir, tmp_path, ckpt)
    rest1 = _on_one("lora_second_half", model_dir, ckpt)
    assert rest2["versions"] == rest1["versions"] == {"a": 2}
    straight = _on_one("lora_straight", model_dir)["stats"]
    _assert_same_stats(first + rest2["stats"], straight)
    _assert_same_stats(first + rest1["stats"], straight)


def test_full_checkpoint_written_by_two_ranks_resumes_on_one_and_on_two(model_dir, tmp_path):
    """Sharded (DCP) full-finetune checkpoint: weights and optimizer state come back exactly on 1 and on 2
    ranks, and the next step trains alike on both; the HF export holds the same weights."""
    import torch

    from rlix.exec.data.model import load_model

    ckpt = tmp_path / "ck"
    saved = _on_ranks("full_checkpoint_save", model_dir, tmp_path, ckpt)["state"]
    assert sorted(p.name for p in (ckpt / "step_000002" / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    exported = load_model(ckpt / "step_000002", dtype=DTYPE).state_dict()
    assert all(torch.equal(exported[k], saved["weights"][k]) for k in exported)
    two = _on_ranks("full_checkpoint_resume", model_dir, tmp_path, ckpt)
    one = _on_one("full_checkpoint_resume", model_dir, ckpt)
    for resumed in (one, two):
        assert resumed["step"] == 2
        assert _max_diff(resumed["state"]["weights"], saved["weights"]) == 0.0
        assert sorted(resumed["state"]["opt"]) == sorted(saved["opt"])
        for i, st in saved["opt"].items():
            assert sorted(st) == sorted(resumed["state"]["opt"][i]) == ["exp_avg", "exp_avg_sq", "step"]
            assert all(torch.equal(v, resumed["state"]["opt"][i][k]) for k, v in st.items()), i
    _assert_same_stats([two["next"]], [one["next"]])


def test_two_ranks_in_bf16_train_within_tolerance_of_fp32(model_dir, tmp_path):
    """FSDP2's MixedPrecisionPolicy (bf16 parameters, fp32 gradient reduction) over gloo, against one fp32 rank."""
    two = _on_ranks("precision_program", model_dir, tmp_path, dtype="bf16")
    one = _on_one("precision_program", model_dir, "", "fp32")
    lp_diff = max(abs(a - b) for r2, r1 in zip(two["old"], one["old"]) for a, b in zip(r2, r1))
    loss_diff = max(abs(s2.loss - s1.loss) for s2, s1 in zip(two["stats"], one["stats"], strict=True))
    print(f"2 ranks bf16 vs 1 rank fp32: log-probs differ by {lp_diff:.2e}, losses (2 steps) by {loss_diff:.2e}")
    # Measured: log-probs 1.3e-3 apart, losses 7.3e-5 (one rank's autocast against fp32: 4.3e-5 at most, see
    # test_exec_trainer.py); the bounds fail on fp32 by mistake (below 1e-5) or on a wrong cast or reduction.
    assert 1e-5 < lp_diff < 1e-2
    assert loss_diff < 3e-4


def lora_straight(ranks, model_dir: str, _ckpt: str, _dtype: str = DTYPE) -> dict:
    learner = _lora(ranks, model_dir)
    return {"stats": [_tick(learner, "a", seed) for seed in range(4)]}
