"""The trainer's memory and precision, in process (no Ray): what each stage moves, bf16 against fp32,
activation checkpointing, and per-token log-probs computed in chunks.

Moves are observed where the tensors are: a part that moves (the policy's or
the reference's parameters, an optimizer's state) is copied into other storage,
to its host buffer or onto the device, while a part that stays keeps its
addresses, so a CPU run shows what a GPU run would copy. The host buffers are
checked the same way: a round trip gives back every bit, and the buffers are
allocated once and reused. Memory is measured with torch's profiler (every CPU
allocation and free, in order), not computed from shapes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]

# bf16 against fp32, the same first minibatch (16 samples) from the same weights. Measured
# over the batches of seeds 0-5: losses differ by 5.1e-6 to 4.3e-5 (|loss| 0.04-0.33),
# per-token log-probs by at most 1.6e-3. The bounds are ~5x those: a step computed in fp32
# by mistake fails the lower bound, a bf16 bug of any size (a wrong cast, a lost scale) the upper.
BF16_LOSS_ATOL = 2e-4
BF16_LOGPROB_ATOL = 1e-2
BF16_LOGPROB_MIN = 1e-5  # bf16 really computed: log-probs differ from fp32 by more than float32 rounding


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlix.exec.data.model import ModelSize, build_model

    return str(
        build_model(
            ModelSize(arch="qwen2", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64),
            tmp_path_factory.mktemp("m"),
        )
    )


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _scored(model_dir: str, n: int = 16, seed: int = 0):
    """``n`` samples with old and reference log-probs that differ from the policy's (every loss term works)."""
    from test_exec_fsdp import _perturbed, _samples

    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner

    samples = _samples(n=n, seed=seed)
    scored = GrpoLearner(model_dir, "cpu", GrpoConfig(seed=5)).logprobs(samples)
    samples = _perturbed(samples, scored, 0.3)
    return [replace(s, ref_logprobs=r) for s, r in zip(_perturbed(samples, scored, -0.2), scored)]


@pytest.fixture
def batch(model_dir):
    return _scored(model_dir)


def _learner(model_dir, **options):
    from rlix.exec.messages import TrainOptions
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner

    return GrpoLearner(model_dir, "cpu", GrpoConfig(kl_coef=0.1, minibatches=1, seed=5), options=TrainOptions(**options))


# ------------------------------------------------------------ what each stage moves


def _where(learner) -> dict[str, tuple[int, ...]]:
    """Where each part's tensors are (their storage addresses): policy and reference parameters,
    each optimizer's state (step counts aside). A part that moves, to the host or onto the device,
    is copied into other storage; one that stays keeps its addresses."""
    parts = {"policy": tuple(p.data_ptr() for p in learner.model.parameters())}
    if learner.ref is not None:
        parts["reference"] = tuple(p.data_ptr() for p in learner.ref.parameters())
    opts = [(n, st.opt) for n, st in learner.adapters.items()] if hasattr(learner, "adapters") else [("", learner.opt)]
    for name, opt in opts:
        state = tuple(v.data_ptr() for s in opt.state.values() for k, v in s.items() if k != "step")
        assert state, "the optimizer has state to move (it has stepped)"
        parts[f"optimizer {name}".strip()] = state
    return parts


def _moved(learner, run) -> set[str]:
    before = _where(learner)
    run()
    after = _where(learner)
    return {name for name in before if before[name] != after[name]}


def test_each_stage_moves_only_what_it_uses_and_offload_moves_it_back(model_dir, batch):
    from rlix.core import Stage
    from rlix.exec.messages import LearnerPart
    from rlix.exec.train.residency import STAGE_PARTS, release_cached_memory

    learner = _learner(model_dir)
    learner.train(batch)  # the optimizer has state
    learner.offload()
    stages = [
        (Stage.OLD_LOGPROBS, lambda: learner.logprobs(batch), {"policy"}),
        (Stage.REF_LOGPROBS, lambda: learner.logprobs(batch, reference=True), {"reference"}),
        (Stage.ACTOR_TRAIN, lambda: learner.train(batch), {"policy", "optimizer"}),
    ]
    for stage, work, uses in stages:
        first = len(learner.residency.moves)
        assert _moved(learner, lambda s=stage, w=work: (learner.reload(STAGE_PARTS[s]), w())) == uses, stage
        assert _moved(learner, learner.offload) == uses, stage  # back to the host: only what came
        moves = learner.residency.moves[first:]  # the learner's own record says the same
        assert sorted(m.part.value for m in moves if m.onto_device) == sorted(m.part.value for m in moves if not m.onto_device)
        assert {m.part.value for m in moves} == uses
        assert all(m.nbytes > 0 for m in learner.residency.moves[first:])
    # A stage called with none of its parts loaded brings them itself (here: training, the reference left).
    assert _moved(learner, lambda: learner.train(batch)) == {"policy", "optimizer"}
    assert {m.part for m in learner.residency.moves if m.onto_device} == set(LearnerPart)
    assert release_cached_memory("cpu") is False and learner.residency.releases == 0  # CPU: nothing cached to return


def test_a_training_step_leaves_no_gradients_to_move_or_hold(model_dir, batch):
    learner = _learner(model_dir)
    learner.train(batch)
    params = [p for group in learner.opt.param_groups for p in group["params"]]
    assert params and all(p.grad is None for p in params)  # spent: an offload moves only weights and optimizer state


def test_a_lora_tick_moves_only_its_own_adapters_optimizer(model_dir):
    from test_exec_fsdp import _perturbed, _samples

    from rlix.exec.train.grpo import GrpoConfig
    from rlix.exec.train.lora import LoraLearner, LoraSpec

    spec = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"), adapters=(("a", 3), ("b", 4)))
    learner = LoraLearner(model_dir, "cpu", spec, {"a": GrpoConfig(seed=3), "b": GrpoConfig(seed=4)})
    samples = _samples()
    for name in ("a", "b"):
        learner.train_adapter(name, _perturbed(samples, learner.adapter_logprobs(name, samples), 0.2))
    learner.offload()
    tick = _perturbed(samples, learner.adapter_logprobs("b", samples), 0.2)
    assert _moved(learner, lambda: learner.train_adapter("b", tick)) == {"optimizer b"}  # the model came with log-probs


# ------------------------------------------------------------ precision


def test_bf16_losses_are_within_tolerance_of_fp32_with_fp32_master_weights(model_dir, batch):
    import torch

    fp32, bf16 = _learner(model_dir, precision="fp32"), _learner(model_dir, precision="bf16")
    lp32, lp16 = fp32.logprobs(batch), bf16.logprobs(batch)
    lp_diff = max(abs(a - b) for r32, r16 in zip(lp32, lp16) for a, b in zip(r32, r16))
    s32, s16 = fp32.train(batch), bf16.train(batch)
    diff = abs(s16.loss - s32.loss)
    print(f"bf16 vs fp32: loss {s16.loss:.6f} vs {s32.loss:.6f} (diff {diff:.2e}); log-probs differ by {lp_diff:.2e}")
    assert BF16_LOGPROB_MIN < lp_diff < BF16_LOGPROB_ATOL
    assert s16.loss == pytest.approx(s32.loss, abs=BF16_LOSS_ATOL) and s16.loss != s32.loss
    assert s16.kl == pytest.approx(s32.kl, abs=BF16_LOSS_ATOL) and s16.tokens == s32.tokens
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}  # master weights
    assert {v.dtype for s in bf16.opt.state.values() for k, v in s.items() if k != "step"} == {torch.float32}
    assert _learner(model_dir).bf16 is False  # auto: fp32 on a CPU


def test_activation_checkpointing_recomputes_layers_and_changes_nothing(model_dir, batch):
    def run(checkpointing: bool):
        learner = _learner(model_dir, precision="fp32", activation_checkpointing=checkpointing)
        calls = []
        # A module inside the layer: transformers checkpoints a layer's forward, not its hooks.
        learner.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        stats = [learner.train(batch) for _ in range(2)]
        return [v for s in stats for v in (s.loss, s.kl)], len(calls), learner.snapshot().tensors

    plain, plain_calls, plain_w = run(False)
    ckpt, ckpt_calls, ckpt_w = run(True)
    assert (plain_calls, ckpt_calls) == (2, 4)  # each minibatch's layer runs again in backward
    assert ckpt == pytest.approx(plain, rel=1e-6, abs=1e-9)
    assert max(float((plain_w[k] - ckpt_w[k]).abs().max()) for k in plain_w) < 1e-6


# ------------------------------------------------------------ log-probs in chunks


def _straight(logits, labels):
    """The computation the chunks replace: one fp32 log-softmax over the whole [B, T, V] batch."""
    import torch

    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 16, 50, 4096])  # pieces of a row, whole rows, several rows, everything
def test_chunked_logprobs_equal_the_straight_computation_with_gradients(chunk):
    import torch

    from rlix.exec.train.compute import token_logprobs

    g = torch.Generator().manual_seed(chunk)
    logits = torch.randn(3, 37, 1000, generator=g, requires_grad=True)
    labels = torch.randint(0, 1000, (3, 37), generator=g)
    weights = torch.randn(3, 37, generator=g)
    want = _straight(logits, labels)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), logits)
    got = token_logprobs(logits, labels, chunk)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), logits)
    assert got.dtype == torch.float32 and got.shape == (3, 37)
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(got_grad, want_grad, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(token_logprobs(logits, labels, chunk), want, atol=1e-5)


def _peak_bytes(fn) -> int:
    """The most CPU memory ``fn`` held at once beyond what existed before it (torch's profiler: every
    allocation and free, in order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: (e.time_range.start, e.id))
    held = peak = 0
    for e in events:
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("grad", [False, True])
def test_chunked_logprobs_hold_a_chunk_not_the_batch(grad):
    """bf16 logits of 4 x 256 tokens over a 16k vocabulary (32 MiB); chunks of 256 tokens."""
    import torch

    from rlix.exec.train.compute import token_logprobs

    logits = torch.randn(4, 256, 16384).to(torch.bfloat16).requires_grad_(grad)
    labels = torch.randint(0, 16384, (4, 256))
    with torch.set_grad_enabled(grad):
        straight = _peak_bytes(lambda: _straight(logits, labels))
        chunked = _peak_bytes(lambda: token_logprobs(logits, labels, 256))
    fp32_batch = 4 * 256 * 16384 * 4
    print(f"grad={grad}: peak {straight / 2**20:.1f} MiB straight, {chunked / 2**20:.1f} MiB in chunks of 256 tokens")
    assert straight >= 2 * fp32_batch  # the fp32 copy and its log-softmax, whole
    assert chunked <= straight / 6


# ------------------------------------------------------------ the host buffers


def _values(learner) -> list:
    import torch

    tensors = [*learner.model.parameters(), *learner.model.buffers()]
    tensors += [v for s in learner.opt.state.values() for k, v in s.items() if torch.is_tensor(v)]
    return [t.detach().clone() for t in tensors]


def _host_addresses(learner) -> set[int]:
    return {p.data_ptr() for p in learner.model.parameters()}


def test_a_round_trip_through_the_host_buffers_gives_back_every_bit_and_reuses_them(model_dir, batch):
    import torch

    learner = _learner(model_dir)
    learner.train(batch)  # the optimizer has state
    before = _values(learner)
    learner.offload()
    arena = learner.residency.arena
    first = (arena.allocations, arena.host_bytes(), _host_addresses(learner))
    assert first[0] == 3 and first[1] > 0  # policy, reference, optimizer: one buffer each
    assert all(torch.equal(a, b) for a, b in zip(before, _values(learner), strict=True))
    for _ in range(2):
        learner.reload()
        assert all(torch.equal(a, b) for a, b in zip(before, _values(learner), strict=True))
        assert not _host_addresses(learner) & first[2]  # on the device: out of the host buffer
        learner.offload()
        assert (arena.allocations, arena.host_bytes(), _host_addresses(learner)) == first  # the same buffers again
    assert all(torch.equal(a, b) for a, b in zip(before, _values(learner), strict=True))
    assert {m.pinned for m in learner.residency.moves} == {False}  # a CPU learner: plain memory


def test_training_through_offloads_learns_exactly_what_training_in_place_learns(model_dir, batch):
    """Offload and reload between every stage change nothing: the same parameters, bit for bit, and
    tied weights stay one tensor."""
    import torch

    moved, kept = _learner(model_dir), _learner(model_dir)
    for step in range(3):
        learner_batch = _scored(model_dir, seed=step)
        moved.offload()
        moved.reload()
        moved.train(learner_batch)
        kept.train(learner_batch)
    moved.offload()
    moved.reload()
    for (name, a), (_, b) in zip(moved.model.named_parameters(), kept.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    emb, head = moved.model.get_input_embeddings(), moved.model.get_output_embeddings()
    assert moved.model.config.tie_word_embeddings  # build_model ties them, as small Qwen2 checkpoints do
    assert emb.weight is head.weight and emb.weight.data_ptr() == head.weight.data_ptr()
