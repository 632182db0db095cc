"""Executor layer: multi-LoRA on one shared base model (peft), independent of Ray.

Several adapters live side by side on one frozen base. Each adapter has its
own optimizer (over its own LoRA parameters only), its own version (= ticks
trained) and its own seed: its initial weights are drawn from a generator
seeded by the adapter alone, so an adapter trained together with others
follows exactly the trajectory it follows alone. Rollout engines get the
base once (a full snapshot) and then only adapter snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlix.exec.messages import AdapterSnapshot, Emulation, GrpoConfig, LearnerPart, LoraSpec, Sample, TrainOptions, TrainStats
from rlix.exec.train.fsdp import SINGLE, Ranks, shard_like
from rlix.exec.train.grpo import GrpoLearner
from rlix.weightsync.buckets import full, publish_of, snapshot_of
from rlix.weightsync.types import WeightBuckets, WeightSnapshot

__all__ = ["AdapterSnapshot", "LoraLearner", "LoraSpec", "wrap_with_adapters"]


def wrap_with_adapters(model, spec: LoraSpec):
    """``model`` (a HF causal LM) wrapped by peft with every adapter of ``spec``.

    Each adapter's initial weights come from its own seed (not from the
    global generator's position), so adding adapters never changes another.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules), lora_dropout=0.0, bias="none")
    peft_model = None
    for name, seed in spec.adapters:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if peft_model is None:
                peft_model = get_peft_model(model, cfg, adapter_name=name)
            else:
                peft_model.add_adapter(name, cfg)
    return peft_model


def adapter_keys(state_keys, name: str) -> list[str]:
    """The state-dict keys that belong to adapter ``name``."""
    return [k for k in state_keys if f".lora_A.{name}." in k or f".lora_B.{name}." in k]


def adapter_snapshot_of(model, name: str, version: int) -> AdapterSnapshot:
    """``name``'s tensors on the CPU (gathered whole under FSDP2: a collective, called by every rank)."""
    sd = model.state_dict()
    tensors = {k: full(sd[k]).detach().to("cpu", copy=True) for k in adapter_keys(sd, name)}
    return AdapterSnapshot(
        name=name, version=version, tensors=tensors, nbytes=sum(t.numel() * t.element_size() for t in tensors.values())
    )


@dataclass(kw_only=True)
class _AdapterState:
    cfg: GrpoConfig
    opt: Any
    version: int = 0
    params: list = field(default_factory=list)


class LoraLearner(GrpoLearner):
    """GRPO over several adapters of one peft model; every call names its adapter."""

    def __init__(
        self,
        model_path: str,
        device: str,
        spec: LoraSpec,
        cfgs: dict[str, GrpoConfig],
        emulation: Emulation = Emulation(),
        ranks: Ranks = SINGLE,
        dtype: str = "float32",
        options: TrainOptions = TrainOptions(),
    ) -> None:
        import torch

        from rlix.exec.data.model import load_model, pad_token_id

        self.spec = spec
        self._setup(device, emulation, ranks, options)
        self.ref = None
        self.model = self._prepare(wrap_with_adapters(load_model(model_path, device, dtype), spec).eval(), train=True)
        self.pad_id = pad_token_id(self.model.config)
        self.residency.add(LearnerPart.POLICY, self.model)
        self.adapters: dict[str, _AdapterState] = {}
        named = dict(self.model.named_parameters())
        for name, _ in spec.adapters:
            params = [named[k] for k in sorted(adapter_keys(named, name))]
            opt = torch.optim.AdamW(params, lr=cfgs[name].lr, weight_decay=0.0)
            self.adapters[name] = _AdapterState(cfg=cfgs[name], opt=opt, params=params)
            self.residency.add(LearnerPart.OPTIMIZER, opt, name)  # each adapter's optimizer moves on its own
        self.version = 0

    def _use(self, adapter: str) -> None:
        self.model.set_adapter(adapter)  # forward through this adapter only; only its params need grads

    def adapter_logprobs(self, adapter: str, samples: list[Sample]) -> list[tuple[float, ...]]:
        self._use(adapter)
        return self.logprobs(samples)

    def train_adapter(self, adapter: str, samples: list[Sample]) -> TrainStats:
        """One GRPO tick of ``adapter`` with its own optimizer; bumps its version."""
        st = self.adapters[adapter]
        self._use(adapter)
        self.residency.need([LearnerPart.POLICY, LearnerPart.OPTIMIZER], [adapter, ""])  # only this adapter's optimizer
        stats = self._update(samples, st.cfg, st.opt, st.params, st.version)
        st.version += 1
        return stats

    def train(self, samples: list[Sample]) -> TrainStats:
        raise TypeError("a LoraLearner trains one adapter at a time: call train_adapter(name, samples)")

    # ------------------------------------------------------------ weights

    def snapshot(self) -> WeightSnapshot:
        """Base + every adapter as they are now (what a waking rollout engine loads)."""
        return snapshot_of(self.model, 0)

    def publish(self, dtype: str = "bfloat16") -> WeightBuckets | None:
        """Base + every adapter as a waking rollout engine loads them (version 0: the base never trains)."""
        return publish_of(self.model, 0, dtype, keep=self.ranks.rank == 0)

    def adapter_snapshot(self, adapter: str) -> AdapterSnapshot:
        return adapter_snapshot_of(self.model, adapter, self.adapters[adapter].version)

    def versions(self) -> dict[str, int]:
        return {n: st.version for n, st in self.adapters.items()}

    # ------------------------------------------------------------ checkpoints

    def save(self, adapter: str, directory: str | Path) -> Path:
        """Write ``adapter``'s weights, optimizer state and version to ``directory/adapter/state.pt``
        (every rank gathers them: a collective; rank 0 writes)."""
        state = self.checkpoint(adapter)
        if self.ranks.rank == 0:
            write_checkpoint(state, adapter, directory)
        return Path(directory) / adapter

    def checkpoint(self, adapter: str) -> dict:
        """``adapter``'s whole weights, optimizer state and version, on the CPU.

        The same for any number of ranks (shards gathered whole: a collective),
        so a checkpoint written by N ranks resumes on M."""
        st = self.adapters[adapter]
        snap = self.adapter_snapshot(adapter)
        opt = st.opt.state_dict()
        opt["state"] = {
            i: {k: full(v).detach().to("cpu", copy=True) for k, v in s.items()} for i, s in sorted(opt["state"].items())
        }
        return {"version": st.version, "tensors": snap.tensors, "opt": opt}

    def restore(self, directory: str | Path) -> dict[str, int]:
        """Load every adapter that has a checkpoint under ``directory``; returns their versions."""
        import torch

        out = {}
        for name, st in self.adapters.items():
            f = Path(directory) / name / "state.pt"
            if not f.is_file():
                continue
            ck = torch.load(f, map_location=self.device, weights_only=False)
            missing = set(adapter_keys(self.model.state_dict(), name)) - set(ck["tensors"])
            if missing:
                raise ValueError(f"{f}: checkpoint lacks {len(missing)} tensors of adapter '{name}' (different lora shape?)")
            named = dict(self.model.named_parameters())
            self.model.load_state_dict({k: shard_like(v, named[k]) for k, v in ck["tensors"].items()}, strict=False)
            opt = ck["opt"]
            opt["state"] = {
                i: {k: shard_like(v, st.params[i]) if v.dim() else v for k, v in s.items()} for i, s in opt["state"].items()
            }
            st.opt.load_state_dict(opt)
            st.version = int(ck["version"])
            out[name] = st.version
        return out


def write_checkpoint(state: dict, adapter: str, directory: str | Path) -> Path:
    """Write :meth:`LoraLearner.checkpoint`'s ``state`` to ``directory/adapter/state.pt``."""
    import torch

    path = Path(directory) / adapter
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / "state.pt")  # never a half-written checkpoint
    return path


def saved_version(directory: str | Path, adapter: str) -> int | None:
    """The steps ``adapter``'s checkpoint under ``directory`` holds (None: it has none); reads
    only the version (the tensors are mapped, not loaded)."""
    import torch

    f = Path(directory) / adapter / "state.pt"
    if not f.is_file():
        return None
    return int(torch.load(f, map_location="cpu", mmap=True, weights_only=False)["version"])
