"""Executor layer: how a learner computes (torch): precision and per-token log-probs in chunks.

Precision: ``bf16`` computes forward and backward in bfloat16 while the
weights, gradients after reduction and optimizer state keep the weights' own
dtype (the fp32 master weights). Over several ranks FSDP2's
``MixedPrecisionPolicy`` casts the gathered parameters (bf16) and reduces
gradients in fp32; on one rank ``torch.autocast`` does the casting.

Log-probs: the log-softmax over the full vocabulary is computed a chunk of
tokens at a time, cast up to fp32 per chunk only, so no fp32 copy of a whole
minibatch's logits is ever held: the peak temporary is about
``2 x chunk_tokens x vocab x 4`` bytes (the fp32 copy and its softmax)
instead of ``2 x tokens x vocab x 4``. With a 150k vocabulary that is
1.2 MB per token: 19.7 GB for a minibatch of 4 x 4096 tokens, 1.2 GB for a
chunk of 1024. Under autograd each chunk is checkpointed: backward
recomputes its fp32 softmax from the logits' own (bf16) values instead of
keeping it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

PRECISIONS = ("auto", "bf16", "fp32")


def uses_bf16(precision: str, device: str) -> bool:
    """Whether a learner on ``device`` computes in bfloat16 (``auto``: on CUDA devices only)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision '{precision}': choose one of {PRECISIONS}")
    return precision == "bf16" or (precision == "auto" and str(device).startswith("cuda"))


def mixed_precision_policy(master_dtype):
    """FSDP2's policy for bf16 compute: parameters gathered in bf16, gradients reduced in fp32 (or the
    master dtype, if wider)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.promote_types(torch.float32, master_dtype))


def autocast(device: str, enabled: bool) -> AbstractContextManager:
    """bf16 autocast on ``device`` when ``enabled`` (one rank, no FSDP policy to cast for it)."""
    import torch

    if not enabled:
        return nullcontext()
    return torch.autocast(device_type=str(device).split(":")[0], dtype=torch.bfloat16)


def _spans(rows: int, width: int, chunk_tokens: int) -> list[tuple[int, int, int, int]]:
    """(row from, row to, token from, token to) slices of a [rows, width] grid, each at most
    ``chunk_tokens`` tokens: whole rows together while they fit, else pieces of one row."""
    if width <= chunk_tokens:
        per = max(1, chunk_tokens // max(width, 1))
        return [(r, min(r + per, rows), 0, width) for r in range(0, rows, per)]
    return [(r, r + 1, t, min(t + chunk_tokens, width)) for r in range(rows) for t in range(0, width, chunk_tokens)]


def _chunk_logprobs(logits, labels):
    import torch

    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to fp32; float64 kept
    return wide.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(wide, dim=-1)


def token_logprobs(logits, labels, chunk_tokens: int):
    """``log_softmax(logits)[..., labels]`` for [B, T, V] ``logits`` and [B, T] ``labels``, in fp32 (or
    float64), computed ``chunk_tokens`` tokens at a time; differentiable."""
    import torch
    from torch.utils.checkpoint import checkpoint

    rows, width = labels.shape
    out = torch.empty(labels.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for r0, r1, t0, t1 in _spans(rows, width, chunk_tokens):
        piece, lab = logits[r0:r1, t0:t1], labels[r0:r1, t0:t1]
        if grad:  # keep only the logits (already held by the forward); recompute the fp32 softmax in backward
            parts.append((t1 == width, checkpoint(_chunk_logprobs, piece, lab, use_reentrant=False)))
        else:
            out[r0:r1, t0:t1] = _chunk_logprobs(piece, lab)
    if not grad:
        return out
    return _assemble(parts)


def _assemble(parts: list):
    """The grid of differentiable chunk results, given in order as (ends its rows, value): pieces of a
    split row joined along it, then row blocks stacked."""
    import torch

    lines, pending = [], []
    for ends_rows, value in parts:
        pending.append(value)
        if ends_rows:
            lines.append(torch.cat(pending, dim=1) if len(pending) > 1 else pending[0])
            pending = []
    return torch.cat(lines, dim=0)
