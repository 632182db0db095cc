"""Executor layer: how the torch engine turns a step's logits into the distribution it samples from.

The order is vLLM's, so the two engines sample from the same distribution and
report the same log-probs ("processed" log-probs, vLLM's ``processed_logprobs``):

1. repetition penalty over every token of the prompt and the completion so far
   (a positive logit divided by it, a negative one multiplied);
2. temperature;
3. ``min_p``: tokens below ``min_p`` times the most likely token's probability dropped;
4. ``top_k``: all but the ``top_k`` most likely dropped (0 or -1: none);
5. ``top_p``: the most likely tokens whose probability reaches ``top_p`` kept (vLLM's formula).

A dropped token's log-prob is ``-inf``; the sampled token's log-prob is taken
from what is left, renormalised.
"""

from __future__ import annotations

from rlix.exec.messages import GenRequest

MIN_TEMPERATURE = 1e-4  # temperature 0 samples (near-)greedily rather than dividing by zero


def processed_logprobs(logits, req: GenRequest, seen=None):
    """Log-probs of the next token (1-D, float32) after ``req``'s sampling settings; ``seen``: the ids of
    the prompt and completion so far (a 1-D long tensor), needed only under a repetition penalty."""
    import torch

    if req.repetition_penalty != 1.0 and seen is not None and seen.numel():
        picked = logits[seen]
        logits = logits.clone()
        logits[seen] = torch.where(picked > 0, picked / req.repetition_penalty, picked * req.repetition_penalty)
    logits = logits / max(req.temperature, MIN_TEMPERATURE)
    if req.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < req.min_p * probs.max(), float("-inf"))
    if 0 < req.top_k < logits.numel():
        kth = torch.topk(logits, req.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if req.top_p < 1.0:
        logits = _nucleus(logits, req.top_p)
    return torch.log_softmax(logits, dim=-1)


def _nucleus(logits, top_p: float):
    """``logits`` with every token outside the ``top_p`` nucleus at ``-inf``, as vLLM computes it: in
    ascending order, a token is dropped while the mass up to and including it is at most ``1 - top_p``
    (the most likely always kept)."""
    import torch

    ordered, order = torch.sort(logits, descending=False)
    drop = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) <= 1 - top_p
    drop[-1] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
