"""Executor layer: the GRPO recipe (torch), independent of Ray.

Group-relative advantages, a clipped policy-gradient loss averaged over
tokens, and an optional KL penalty to a frozen reference (the k3
estimator). :class:`GrpoLearner` is what a trainer worker wraps; it also runs
in-process, which is how the recipe is tested without Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from rlix.exec.messages import Emulation, GrpoConfig, LearnerPart, Sample, TrainOptions, TrainStats
from rlix.exec.train.compute import autocast, mixed_precision_policy, token_logprobs, uses_bf16
from rlix.exec.train.fsdp import SINGLE, Ranks, clip_grad_norm
from rlix.exec.train.residency import ALL_PARTS, Residency
from rlix.weightsync.buckets import publish_of, snapshot_of, stage_on_device
from rlix.weightsync.handoff import DeviceBuckets
from rlix.weightsync.types import DeviceHandoff, WeightBuckets, WeightSnapshot

__all__ = ["GrpoConfig", "GrpoLearner", "Sample", "TrainStats"]


class GrpoLearner:
    """Policy (+ optional frozen reference) and its optimizer on one device, or
    sharded over data-parallel ``ranks`` (every rank constructs it alike).

    ``dtype`` is the weights' (and optimizer state's) dtype: float32 trains;
    float64 lets a test hold N ranks to the one-rank update within ~1e-15
    (float32 rounding, summed in another order, leaves ~1e-6 after a few steps).
    ``options`` says how it computes (:class:`TrainOptions`: bf16 or fp32,
    activation checkpointing, log-prob chunks). Each stage uses only some of
    its parts (:class:`~rlix.exec.train.residency.Residency`)."""

    def __init__(
        self,
        model_path: str,
        device: str,
        cfg: GrpoConfig,
        emulation: Emulation = Emulation(),
        ranks: Ranks = SINGLE,
        dtype: str = "float32",
        options: TrainOptions = TrainOptions(),
    ) -> None:
        import torch

        from rlix.exec.data.model import load_model, pad_token_id

        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self._setup(device, emulation, ranks, options)
        self.model = self._prepare(load_model(model_path, device, dtype), train=True)
        self.ref = self._prepare(load_model(model_path, device, dtype).eval(), train=False) if cfg.kl_coef > 0 else None
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.version = 0
        self.pad_id = pad_token_id(self.model.config)
        self.residency.add(LearnerPart.POLICY, self.model)
        if self.ref is not None:
            self.residency.add(LearnerPart.REFERENCE, self.ref)
        self.residency.add(LearnerPart.OPTIMIZER, self.opt)

    def _setup(self, device: str, emulation: Emulation, ranks: Ranks, options: TrainOptions) -> None:
        self.device = device
        self.emulation = emulation
        self.ranks = ranks
        self.options = options
        self.bf16 = uses_bf16(options.precision, device)
        self.residency = Residency(device)
        # The trained weights kept on the GPU for workers beside it (rank 0 keeps them; None: not on a GPU)
        # one rank only: under FSDP2 every rank must gather as many tensors at publish as rank 0
        on_gpu = options.gpu_handoff and device.startswith("cuda") and ranks.world == 1
        self.handoff = DeviceBuckets() if on_gpu and ranks.rank == 0 else None
        self._stages_handoff = on_gpu

    def _prepare(self, model, *, train: bool):
        """``model`` set up to compute as :attr:`options` say, and sharded over the ranks."""
        if train and self.options.activation_checkpointing:
            # Non-reentrant: works with frozen inputs (LoRA's base) and with FSDP2's hooks.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        dtype = next(model.parameters()).dtype
        return self.ranks.shard(model, mixed_precision_policy(dtype) if self.bf16 else None)

    # ------------------------------------------------------------ offload

    def offload(self) -> None:
        """Free the device: whatever of model, reference and optimizer state is on it goes to the CPU,
        and the device's cached memory back to the driver."""
        self.residency.offload()

    def reload(self, parts: Iterable[LearnerPart] = ALL_PARTS) -> None:
        """``parts`` onto the device (a stage's: :data:`~rlix.exec.train.residency.STAGE_PARTS`); the
        published version's GPU buckets go first (the stage's workers have been shrunk)."""
        if self.handoff is not None:
            self.handoff.drop()
        self.residency.need(parts)

    def snapshot(self) -> WeightSnapshot:
        return snapshot_of(self.model, self.version)

    def stage_handoff(self, dtype: str = "bfloat16") -> None:
        """On a GPU, at the end of a training stage: the new version's ``dtype`` buckets written on the
        device while the stage still holds it, for :meth:`publish` to hand to workers beside it (a
        collective under FSDP2)."""
        if self._stages_handoff:
            stage_on_device(self.model, self.version, dtype, self.handoff, self.device)

    def handoff_handles(self, dtype: str = "bfloat16") -> DeviceHandoff | None:
        """The CUDA IPC handles of the published version's buckets staged on the GPU (None: none staged)."""
        return self.handoff.handles(self.version, dtype) if self.handoff is not None else None

    def publish(self, dtype: str = "bfloat16") -> WeightBuckets | None:
        """The weights as rollout workers load them (``dtype`` buckets); rank 0 keeps them, the others
        return None (a collective under FSDP2). With this version staged on the GPU, copied from there
        (its CUDA IPC handles: :meth:`handoff_handles`)."""
        return publish_of(self.model, self.version, dtype, keep=self.ranks.rank == 0, on_device=self.handoff)

    # ------------------------------------------------------------ scoring

    def logprobs(self, samples: list[Sample], *, reference: bool = False) -> list[tuple[float, ...]]:
        """Per-token log-probs of each completion under the policy (or the reference).

        Each rank scores its share; a rank with no share still runs a forward
        (FSDP gathers parameters collectively) and keeps nothing."""
        import torch

        self.residency.need([LearnerPart.REFERENCE if reference else LearnerPart.POLICY])
        model = self.ref if reference else self.model
        t0 = time.perf_counter()
        mine = self.ranks.share(samples)
        with torch.no_grad():
            lp, mask = self._token_logprobs(model, mine or samples[:1])
        out = [tuple(float(x) for x, m in zip(row, mrow) if m) for row, mrow in zip(lp.cpu(), mask.cpu())] if mine else []
        self._pace(mine, t0)
        return self.ranks.unshare(out, len(samples))

    def _batch(self, samples: list[Sample]):
        import torch

        seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in samples]
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        tmask = torch.zeros((len(seqs), width - 1), dtype=torch.bool)  # predicts token t+1
        for i, (s, seq) in enumerate(zip(samples, seqs)):
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            p = len(s.prompt_ids)
            tmask[i, p - 1 : len(seq) - 1] = True
        return ids.to(self.device), attn.to(self.device), tmask.to(self.device)

    def _token_logprobs(self, model, samples: list[Sample]):
        ids, attn, tmask = self._batch(samples)
        with autocast(self.device, self.bf16 and self.ranks.world == 1):  # several ranks: FSDP2's policy casts
            logits = model(input_ids=ids, attention_mask=attn).logits
        return token_logprobs(logits[:, :-1], ids[:, 1:], self.options.logprob_chunk_tokens), tmask

    # ------------------------------------------------------------ training

    def train(self, samples: list[Sample]) -> TrainStats:
        """One GRPO update over ``samples``; bumps the policy version."""
        params = [p for group in self.opt.param_groups for p in group["params"]]  # the shards, under FSDP2
        self.residency.need([LearnerPart.POLICY, LearnerPart.OPTIMIZER])
        stats = self._update(samples, self.cfg, self.opt, params, self.version)
        self.version += 1
        return stats

    def _update(self, samples: list[Sample], cfg: GrpoConfig, opt, params: list, version: int) -> TrainStats:
        """``cfg.epochs`` passes of clipped-PG minibatch steps of ``opt`` over ``params``
        (minibatch order seeded by ``cfg.seed + version``).

        Every rank takes its share of each minibatch; the loss is normalised by
        the whole minibatch's token count (known to every rank), so the
        gradients summed over ranks are the one-rank gradient."""
        import torch

        t0 = time.perf_counter()
        self.model.train()
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(cfg.seed + version))
        chunks = [order[i :: cfg.minibatches].tolist() for i in range(cfg.minibatches)]
        tot_loss = tot_kl = tot_clip = 0.0
        tokens = 0
        for _ in range(cfg.epochs):
            for chunk in chunks:
                if not chunk:
                    continue
                mb = [samples[i] for i in chunk]
                n = sum(len(s.completion_ids) for s in mb)  # tokens of the whole minibatch
                mine = self.ranks.share(mb)
                loss, kl, clipped = self._loss(mine or mb[:1], cfg, max(n, 1), live=bool(mine))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad_norm(params, cfg.max_grad_norm)
                opt.step()
                loss_v, kl_v, clipped = self.ranks.sum([float(loss.detach()), kl, clipped])
                tot_loss += loss_v * n
                tot_kl += kl_v * n
                tot_clip += clipped
                tokens += n
        opt.zero_grad(set_to_none=True)  # spent: an offload then moves no stale gradients, and the device holds none
        self.model.eval()
        self._pace(self.ranks.share(samples), t0)
        n = max(tokens, 1)
        return TrainStats(
            loss=tot_loss / n, kl=tot_kl / n, clip_fraction=tot_clip / n, tokens=tokens, seconds=time.perf_counter() - t0
        )

    def _loss(self, mb: list[Sample], cfg: GrpoConfig, n: int, live: bool = True):
        """(loss, kl term, clipped tokens) of ``mb``, both terms normalised by ``n`` tokens.

        A rank with no share of the minibatch (``live`` False) runs ``mb`` with
        every token masked out: it joins FSDP's collectives and adds nothing."""
        import torch

        lp, tmask = self._token_logprobs(self.model, mb)
        old = _pad_like(lp, tmask, [s.old_logprobs for s in mb])
        adv = torch.tensor([s.advantage for s in mb], device=lp.device).unsqueeze(1)
        ratio = torch.exp(lp - old)
        eps = cfg.clip_eps
        pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
        mask = tmask if live else torch.zeros_like(tmask)
        loss = (pg * mask).sum() / n
        kl_val = 0.0
        if self.ref is not None and cfg.kl_coef > 0:
            ref = _pad_like(lp, tmask, [s.ref_logprobs for s in mb])
            log_r = ref - lp
            kl = torch.exp(log_r) - log_r - 1  # k3: unbiased, non-negative
            kl_term = (kl * mask).sum() / n
            loss = loss + cfg.kl_coef * kl_term
            kl_val = float(kl_term.detach())
        clipped = ((ratio - 1).abs() > eps) & mask
        return loss, kl_val, float(clipped.sum())

    def _pace(self, samples: list[Sample], started: float) -> None:
        per_tok = self.emulation.train_token_s
        if per_tok > 0:
            want = per_tok * sum(len(s.completion_ids) + len(s.prompt_ids) for s in samples)
            left = want - (time.perf_counter() - started)
            if left > 0:
                time.sleep(left)


def _pad_like(lp, mask, rows: list[tuple[float, ...]]):
    """Scatter per-completion values into the [B, T-1] token grid of ``mask``."""
    import torch

    out = torch.zeros_like(lp)
    for i, row in enumerate(rows):
        idx = mask[i].nonzero().squeeze(-1)
        if len(row) != len(idx):
            raise ValueError(f"sample {i}: {len(row)} log-probs for {len(idx)} completion tokens")
        out[i, idx] = torch.tensor(row, dtype=out.dtype, device=out.device)
    return out
