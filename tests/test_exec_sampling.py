"""The torch engine's sampling settings (rlix.exec.rollout.sampling): what each keeps and drops, in
vLLM's order. tests/test_exec_vllm.py checks that vLLM reports the same log-probs under them."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlix.exec.messages import GenRequest  # noqa: E402
from rlix.exec.rollout.sampling import processed_logprobs  # noqa: E402

PROBS = torch.tensor([0.05, 0.5, 0.15, 0.3])  # token 1 most likely, then 3, 2, 0


def req(**sampling) -> GenRequest:
    return GenRequest(traj_id=0, prompt_ids=(1,), max_new_tokens=4, **sampling)


def kept(**sampling) -> set[int]:
    logp = processed_logprobs(PROBS.log(), req(**sampling))
    assert math.isclose(float(logp.exp().sum()), 1.0, rel_tol=1e-6)  # what is left is a distribution
    return {i for i, v in enumerate(logp.tolist()) if v > -math.inf}


def test_no_setting_is_the_softmax_at_the_temperature():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    for t in (1.0, 0.7):
        assert torch.allclose(processed_logprobs(logits, req(temperature=t)), torch.log_softmax(logits / t, dim=-1))
    assert kept(top_k=0) == kept(top_k=-1) == kept(top_k=9) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("sampling", "left"),
    [
        ({"top_k": 1}, {1}),
        ({"top_k": 2}, {1, 3}),
        ({"top_p": 0.45}, {1}),  # the most likely alone reaches 0.45
        ({"top_p": 0.79}, {1, 3}),  # 0.5 + 0.3 reaches 0.79: the next is not needed
        ({"top_p": 0.81}, {1, 3, 2}),
        ({"top_p": 0.01}, {1}),  # the most likely is always kept
        ({"min_p": 0.5}, {1, 3}),  # at least half of 0.5
        ({"min_p": 0.1}, {1, 3, 2}),
        ({"min_p": 0.5, "top_k": 1}, {1}),
        ({"top_k": 3, "top_p": 0.7}, {1, 3}),
    ],
)
def test_each_setting_keeps_the_tokens_it_should(sampling, left):
    assert kept(**sampling) == left


def test_the_kept_tokens_are_renormalised_and_min_p_reads_the_tempered_probabilities():
    logp = processed_logprobs(PROBS.log(), req(top_k=2))
    assert logp[1].exp() == pytest.approx(0.5 / 0.8) and logp[3].exp() == pytest.approx(0.3 / 0.8)
    # At temperature 2 the probabilities flatten: token 0 (0.05) is then above a fifth of the most likely.
    assert kept(min_p=0.2) == {1, 3, 2} and kept(min_p=0.2, temperature=2.0) == {0, 1, 2, 3}


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones_of_seen_tokens():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    got = processed_logprobs(logits, req(repetition_penalty=2.0), torch.tensor([0, 1]))
    want = torch.log_softmax(torch.tensor([1.0, -2.0, 0.5, 3.0]), dim=-1)
    assert torch.allclose(got, want)
    assert torch.allclose(processed_logprobs(logits, req(repetition_penalty=2.0)), torch.log_softmax(logits, dim=-1))
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0]  # the engine's logits are not changed in place


def test_the_torch_engine_samples_under_the_settings(tmp_path):
    """top_k=1 is greedy whatever the seed; a repetition penalty changes what a seed draws."""
    from rlix.exec.data.model import ModelSize, build_model
    from rlix.exec.rollout.torch_backend import TorchRolloutBackend

    size = ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    engine = TorchRolloutBackend()
    engine.prepare(str(build_model(size, tmp_path)), "cpu")
    engine.wake(None)
    prompt = (1, 5, 6, 7)

    def play(seed: int, **sampling):
        return engine.generate(GenRequest(traj_id=0, prompt_ids=prompt, max_new_tokens=12, seed=seed, **sampling))

    greedy = play(0, temperature=1e-5)
    assert all(play(seed, top_k=1).token_ids == greedy.token_ids for seed in (1, 2, 3))
    assert all(lp == 0.0 for lp in play(4, top_k=1).logprobs)  # one token left: probability one
    plain = [play(seed).token_ids for seed in range(4)]
    assert [play(seed, repetition_penalty=3.0).token_ids for seed in range(4)] != plain
