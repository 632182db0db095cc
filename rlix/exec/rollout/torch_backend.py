"""Executor layer: the torch rollout backend, and the choice of backend.

:class:`TorchRolloutBackend` implements :class:`~rlix.exec.rollout.backend.RolloutBackend`
with HF transformers and runs without a GPU; the vLLM backend (sleep levels,
batched engine, tensor parallelism; on GPU or CPU) slots in behind the same
interface and is imported only when a config asks for it (:func:`make_backend`). Requests and results are the values of
:mod:`rlix.exec.messages` (re-exported here for callers of the older names).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rlix.exec.messages import AdapterSnapshot, Emulation, GenRequest, GenResult, LoraSpec, VllmOptions
from rlix.exec.rollout.backend import RolloutBackend, unchanged_result
from rlix.exec.rollout.sampling import processed_logprobs
from rlix.weightsync.types import WeightBuckets

__all__ = ["Emulation", "GenRequest", "GenResult", "RolloutBackend", "TorchRolloutBackend", "VllmOptions", "make_backend"]


@dataclass(kw_only=True)
class _Flight:
    """Book-keeping of in-flight generations (guarded by the condition)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    epoch: int = 0  # bumped by abort: generations of an older epoch stop
    active: int = 0


class TorchRolloutBackend(RolloutBackend):
    """HF transformers model, token-by-token sampling with a KV cache.

    Multi-LoRA: the model is the peft-wrapped base with every adapter of the
    job; each request runs through its own adapter (peft's per-request
    ``adapter_names``), so concurrent requests of different adapters never
    switch shared state.
    """

    def __init__(self, emulation: Emulation = Emulation(), lora: LoraSpec | None = None) -> None:
        self.emulation = emulation
        self.lora = lora
        self._adapter_versions: dict[str, int] = {}
        self.model = None
        self._awake = False
        self._buffers: dict = {}
        self.model_path = ""
        self.config = None
        self.device = "cpu"
        self.eos_id = -1
        self._version = -1
        self._flight = _Flight()
        self._staging = None  # PinnedStaging on a CUDA device, reused across syncs

    # ---------------------------------------------------------- lifecycle

    def prepare(self, model_path: str, device: str) -> None:
        from transformers import AutoConfig

        from rlix.exec.data.model import quiet_transformers

        quiet_transformers()
        self.model_path = model_path
        self.device = device
        self.config = AutoConfig.from_pretrained(model_path)
        eos = self.config.eos_token_id
        self.eos_id = int(eos[0] if isinstance(eos, list) else eos)
        self.model, self._buffers = _skeleton(self.config, self.lora)
        self._awake = False

    def sleep(self) -> None:
        self.abort()
        with self._flight.cond:
            if self._awake:
                self.model.to("meta")  # weights dropped; the trainer's CPU cache is the copy
                self._awake = False
                self._version = -1
                self._adapter_versions = {}
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def wake(self, weights: WeightBuckets | None, adapters: tuple[AdapterSnapshot, ...] = ()) -> None:
        with self._flight.cond:
            if not self._awake:
                _materialize(self.model, self._buffers, self.device)
                if weights is None:
                    self._load_checkpoint()
                else:
                    self._load(weights)
                self._awake = True
                self._adapter_versions = {n: 0 for n in (self.lora.names if self.lora else ())}
            elif weights is not None and weights.version != self._version:
                self._load(weights)
            for a in adapters:
                self._load_adapter(a)

    def _load_checkpoint(self) -> None:
        """The checkpoint's own weights, exactly (version 0; no trainer has published any yet)."""
        from rlix.exec.data.model import load_model

        model = load_model(self.model_path)
        if self.lora is not None:
            from rlix.exec.train.lora import wrap_with_adapters

            model = wrap_with_adapters(model, self.lora)
        self.model.load_state_dict(model.state_dict(), strict=True)
        self._tie()
        self._version = 0

    def update_adapter(self, snapshot: AdapterSnapshot) -> None:
        with self._flight.cond:
            if self._awake:
                self._load_adapter(snapshot)

    def _load_adapter(self, snapshot: AdapterSnapshot) -> None:
        if snapshot.version <= self._adapter_versions.get(snapshot.name, -1):
            return
        unexpected = self.model.load_state_dict(snapshot.tensors, strict=False).unexpected_keys
        if unexpected:
            raise ValueError(f"adapter '{snapshot.name}': {len(unexpected)} tensors match no parameter (e.g. {unexpected[0]})")
        self._adapter_versions[snapshot.name] = snapshot.version

    @property
    def adapter_versions(self) -> dict[str, int]:
        return dict(self._adapter_versions)

    def _load(self, weights: WeightBuckets) -> None:
        """Copy the published buckets into the engine's parameters (cast to the engine's dtype): on a CPU
        straight from the object store's memory, on CUDA through the pinned staging buffer."""
        from rlix.weightsync.buckets import PinnedStaging, load_into

        if self._staging is None and self.device.startswith("cuda"):
            self._staging = PinnedStaging()
        self.route = load_into(self.model, weights, self.device, self._staging)
        self._tie()
        self._version = weights.version
        self.full_loads += 1

    def _tie(self) -> None:
        if self.lora is None or "lm_head" not in self.lora.target_modules:
            self.model.tie_weights()  # a LoRA-wrapped lm_head has its own base weight in the weights

    def update_weights(self, weights: WeightBuckets) -> None:
        with self._flight.cond:
            self._load(weights)

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def awake(self) -> bool:
        return self._awake

    def abort(self) -> None:
        f = self._flight
        with f.cond:
            f.epoch += 1
            while f.active:
                f.cond.wait(timeout=1.0)

    # ---------------------------------------------------------- generation

    def generate(self, request: GenRequest) -> GenResult:
        f = self._flight
        with f.cond:
            if not self._awake:
                return unchanged_result(request, self._version)
            f.active += 1
            epoch = f.epoch
            version = self._adapter_versions.get(request.adapter, 0) if request.adapter else self._version
        try:
            return self._decode(request, epoch, version)
        finally:
            with f.cond:
                f.active -= 1
                f.cond.notify_all()

    def _decode(self, req: GenRequest, epoch: int, version: int) -> GenResult:
        import torch

        t0 = time.perf_counter()
        gen = torch.Generator()
        ids = list(req.prefix_ids)
        lps = list(req.prefix_logprobs)
        budget = req.max_new_tokens - len(ids)
        finished = bool(ids) and ids[-1] == self.eos_id
        aborted = False
        step_s = self.emulation.decode_step_s
        with torch.inference_mode():
            x = torch.tensor([list(req.prompt_ids) + ids], device=self.device)
            past = None
            penalised = req.repetition_penalty != 1.0
            seen = x[0].cpu().unique() if penalised else None
            extra = {"adapter_names": [req.adapter]} if req.adapter else {}
            while not finished and budget > 0:
                if self._flight.epoch != epoch:
                    aborted = True
                    break
                t_step = time.perf_counter()
                with self._flight.cond:  # weights never change under a forward pass
                    out = self.model(input_ids=x, past_key_values=past, use_cache=True, **extra)
                past = out.past_key_values
                logp = processed_logprobs(out.logits[0, -1].float().cpu(), req, seen)
                # Seeded by the token's position: a trajectory continued elsewhere after a shrink draws what
                # it would have drawn uninterrupted, so sharing never changes what a job samples.
                gen.manual_seed(req.seed * 1_000_003 + len(ids))
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(tok)
                if penalised:
                    seen = torch.cat((seen, torch.tensor([tok]))).unique()
                lps.append(float(logp[tok]))
                budget -= 1
                finished = tok == self.eos_id or budget == 0
                x = torch.tensor([[tok]], device=self.device)
                _pace(step_s, t_step)
        return GenResult(
            traj_id=req.traj_id,
            token_ids=tuple(ids),
            logprobs=tuple(lps),
            finished=finished,
            aborted=aborted,
            weight_version=version,
            gen_s=time.perf_counter() - t0,
        )


def _skeleton(config, lora: LoraSpec | None):
    """A weightless model (meta tensors) kept across sleeps, and the buffers that are not in a state dict
    (rotary tables): waking is then allocate + copy, no init."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config)
        if lora is not None:
            from rlix.exec.train.lora import wrap_with_adapters

            model = wrap_with_adapters(model, lora)
        model = model.eval()
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return model.to("meta"), buffers


def _materialize(model, buffers: dict, device: str) -> None:
    """``model``'s skeleton allocated on ``device`` (weights uninitialised) with its ``buffers`` put back."""
    model.to_empty(device=device)
    for name, buf in buffers.items():
        mod, _, leaf = name.rpartition(".")
        model.get_submodule(mod)._buffers[leaf] = buf.to(device)


def make_backend(
    kind: str,
    emulation: Emulation = Emulation(),
    lora: LoraSpec | None = None,
    vllm: VllmOptions = VllmOptions(),
    devices: tuple[int, ...] = (0,),
) -> RolloutBackend:
    """The rollout backend a config names; vLLM is imported only when asked for.

    ``devices`` are the worker's GPUs (node-local ids, its bundle): a vLLM
    engine spans them with tensor parallelism.
    """
    if kind == "vllm":
        from rlix.exec.rollout.vllm_backend import VllmRolloutBackend

        return VllmRolloutBackend(lora=lora, options=vllm, devices=devices)
    return TorchRolloutBackend(emulation, lora=lora)


def _pace(step_s: float, started: float) -> None:
    """Sleep until ``step_s`` seconds have passed since ``started`` (emulated device)."""
    if step_s > 0:
        left = step_s - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
