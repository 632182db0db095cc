"""Executor layer: the messages the executor's own processes send each other, as frozen values.

Every type the executor defines to cross a process boundary inside a job
lives here: requests and results of rollout workers, weight and adapter
snapshots, the trainer's samples and statistics, switch timings, the engine
settings sent to a worker at start-up, and a job's progress and result for
its driver. What crosses to and from the scheduler (requests, replies,
errors) is the scheduler's protocol, :mod:`rlix.protocol`, which any
pipeline speaks; the run records of :mod:`rlix.exec.records` travel
inside ``JobProgress`` and ``JobResult``.

Backends (torch, vLLM), learners (GRPO, LoRA) and worker actors import this
module and not each other, so the executor's modules form no import circle.
No torch import here: an adapter snapshot's tensors travel as numpy bytes and
are made tensors only where they are read (:class:`WireTensors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rlix.exec.records import ActivityChange, JobStatus, RewardSpan, StepRecord, SwitchRecord, TrajRecord
from rlix.protocol import Stopped
from rlix.weightsync.types import SyncPath

# ------------------------------------------------------------------ weights


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """Shape shared by all adapters, and the adapters as (name, seed) pairs."""

    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    adapters: tuple[tuple[str, int], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.adapters)


@dataclass(frozen=True, kw_only=True)
class AdapterSnapshot:
    """One adapter's LoRA tensors at ``version`` (ticks trained), on the CPU; keys as in the peft model."""

    name: str
    version: int
    tensors: Any  # parameter name -> CPU tensor
    nbytes: int

    def __reduce__(self):
        """Pickled with each tensor's bytes as a numpy array, never as torch objects, and received as
        such: the tensors are made where they are read (:class:`WireTensors`). The coordinator, which
        only passes a snapshot on, so never runs torch code: on a CUDA machine the coordinator of a
        multi-LoRA job (a process with no GPU) crashed in Ray's deserializer, unpickling a torch
        storage first and then making a tensor from numpy there (a segfault taking the GIL)."""
        t = self.tensors
        wire = t.wire if isinstance(t, WireTensors) else {k: _to_wire(v) for k, v in t.items()}
        return (_adapter_from_wire, (self.name, self.version, wire, self.nbytes))


class WireTensors(Mapping):
    """A received adapter's tensors: name -> (dtype, shape, bytes as numpy) as they arrived, each made a
    CPU tensor of its own memory the first time it is read."""

    def __init__(self, wire: dict) -> None:
        self.wire = wire
        self._made: dict = {}

    def __getitem__(self, name: str):
        made = self._made.get(name)
        if made is None:
            torch = _torch()
            dtype, shape, raw = self.wire[name]
            made = torch.from_numpy(raw.copy()).view(getattr(torch, dtype)).reshape(shape)
        return self._made.setdefault(name, made)  # two threads reading at once get the same tensor

    def __contains__(self, name: object) -> bool:
        return name in self.wire  # (Mapping's would make the tensor to answer)

    def __iter__(self):
        return iter(self.wire)

    def __len__(self) -> int:
        return len(self.wire)


def _to_wire(tensor) -> tuple:
    """(dtype name, shape, its bytes as a flat uint8 numpy array on the CPU): any dtype, bfloat16 too."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(_torch().uint8).numpy()
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), raw


def _adapter_from_wire(name: str, version: int, wire: dict, nbytes: int) -> AdapterSnapshot:
    return AdapterSnapshot(name=name, version=version, tensors=WireTensors(wire), nbytes=nbytes)


def _torch():
    import torch  # only where snapshots are made or rebuilt: this module itself needs no torch

    return torch


# ------------------------------------------------------------------ rollout


@dataclass(frozen=True, kw_only=True)
class GenRequest:
    """Generate one trajectory; ``prefix_*`` continues one aborted mid-way."""

    traj_id: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0  # the nucleus kept (1: all); the order of these settings: rlix.exec.rollout.sampling
    top_k: int = 0  # the most likely tokens kept (0 or -1: all)
    min_p: float = 0.0  # tokens below min_p x the most likely one's probability dropped
    repetition_penalty: float = 1.0  # over the prompt's and the completion's tokens (1: none)
    seed: int = 0
    prefix_ids: tuple[int, ...] = ()
    prefix_logprobs: tuple[float, ...] = ()
    adapter: str = ""  # multi-LoRA: generate through this adapter ("" = the full model)


@dataclass(frozen=True, kw_only=True)
class GenResult:
    """What a worker produced for a request (prefix included)."""

    traj_id: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # behaviour log-probs, one per token
    finished: bool  # hit EOS or the token budget
    aborted: bool  # stopped early by abort/sleep; continue it elsewhere
    weight_version: int  # the oldest policy (or adapter) version that produced any token
    gen_s: float  # seconds this segment spent generating


@dataclass(frozen=True, kw_only=True)
class Emulation:
    """Pacing that lets a logical GPU on a CPU host behave like a device.

    Each decode step of a trajectory takes at least ``decode_step_s`` seconds
    (sleeping, not computing), so N logical GPUs give N-fold rollout
    capacity even on two CPU cores. 0 disables pacing (real devices).
    """

    decode_step_s: float = 0.0
    train_token_s: float = 0.0  # seconds per trained/scored token in gang stages


@dataclass(frozen=True, kw_only=True)
class VllmOptions:
    """Engine settings of the vLLM backend (ignored by the torch backend)."""

    gpu_memory_utilization: float = 0.3  # fraction of the GPU's memory one engine may take
    sleep_level: int = 2  # 1: weights to CPU; 2: weights dropped (reloaded from the trainer's snapshot)
    enforce_eager: bool = True  # no CUDA graphs: faster start, less memory
    max_model_len: int | None = None  # tokens (prompt + completion); None = the checkpoint's own limit
    dtype: str = "bfloat16"  # engine weights (the trainer's float32 snapshot is cast on load)
    kv_cache_gib: float | None = (
        None  # KV cache per engine rank (GiB); None: what gpu_memory_utilization leaves on a GPU, 0.5 on a CPU host
    )


@dataclass(frozen=True, kw_only=True)
class SwitchTiming:
    """Seconds a worker spent switching, and the weights it moved (bytes)."""

    seconds: float
    synced_bytes: int = 0
    version: int = -1
    adapters: tuple[tuple[str, int], ...] = ()  # multi-LoRA: (adapter, version) the engine serves
    cold: bool = False  # the wake built the engine on the device (a cold start, not a resume)
    sync_path: SyncPath | None = None  # how the full weights came, where the switch loaded them

    def adapter_version(self, name: str) -> int:
        return dict(self.adapters).get(name, -1)


@dataclass(frozen=True, kw_only=True)
class WorkerFault:
    """Faults a rollout worker process injects into itself (tests and drills)."""

    hang_wake: bool = False  # its wake never returns
    die_in_rollout: bool = False  # the process exits 1 s into its first rollout
    refuse_requests: bool = False  # generate raises EngineRefused for every request


class EngineRefused(RuntimeError):
    """The rollout engine refused a request (an application error: the worker stays up)."""


class EngineStopped(RuntimeError):
    """The rollout engine itself broke: the worker process exits, and its work goes elsewhere as a dead worker's does."""


# ------------------------------------------------------------------ training


@dataclass(frozen=True, kw_only=True)
class GrpoConfig:
    lr: float = 3e-3
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # 0 = no reference model at all
    minibatches: int = 2
    epochs: int = 1
    max_grad_norm: float = 1.0
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One finished trajectory, as the trainer needs it."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    old_logprobs: tuple[float, ...] = ()
    ref_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TrainStats:
    loss: float
    kl: float
    clip_fraction: float
    tokens: int
    seconds: float


class LearnerPart(Enum):
    """What of a learner a stage moves onto its GPUs (and what offload moves back)."""

    POLICY = "policy"  # the trained model (old log-probs, training)
    REFERENCE = "reference"  # the frozen reference (reference log-probs)
    OPTIMIZER = "optimizer"  # the optimizer state (training only)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """How the trainer computes: precision, activation checkpointing, log-prob chunks.

    ``precision`` ``bf16`` computes in bfloat16 (FSDP2's mixed-precision policy over
    several ranks, autocast on one) while the optimizer keeps the weights' own dtype
    (float32 master weights); ``fp32`` computes in the weights' dtype; ``auto`` is bf16
    on a CUDA device and fp32 on a CPU (where bfloat16 kernels are slow)."""

    precision: str = "auto"  # "auto" | "bf16" | "fp32"
    activation_checkpointing: bool = False  # recompute each decoder layer in backward (less memory, ~1/3 more compute)
    logprob_chunk_tokens: int = 1024  # tokens whose full-vocabulary log-softmax is computed at once
    # On a GPU, one rank: keep each trained version's published buckets on the trainer's GPU until its next
    # stage, so rollout workers that see that GPU load them over CUDA IPC (rlix.weightsync.handoff); costs
    # the published bytes of GPU memory between stages. Off by default: measured by benchmarks/bench_gpu_torch.py
    # on one GPU, not yet under Ray on a GPU
    gpu_handoff: bool = False


@dataclass(frozen=True, kw_only=True)
class TrainerJob:
    """What every trainer rank builds: the same model, recipe and (LoRA) adapters."""

    model_path: str
    cfg: GrpoConfig
    emulation: Emulation = Emulation()
    lora: LoraSpec | None = None
    adapter_cfgs: tuple[tuple[str, GrpoConfig], ...] = ()
    checkpoint_dir: str | None = None
    dtype: str = "float32"  # weights and optimizer state (the master weights under bf16 precision)
    sync_dtype: str = "bfloat16"  # the dtype of the weights published to rollout workers (what the engine serves)
    train: TrainOptions = TrainOptions()


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where the ranks meet: rank 0's host and a free TCP port on it, and how many ranks."""

    host: str
    port: int
    world: int


# ------------------------------------------------------------------ a job's run, for its driver


@dataclass(frozen=True, kw_only=True)
class JobProgress:
    """A coordinator's answer to the driver's progress poll (the console's live view)."""

    pipeline_id: str
    status: JobStatus
    step: int  # steps completed (a resumed job's: those its checkpoint held included)
    steps: int  # steps the job will have trained at its end
    rewards: tuple[RewardSpan, ...]  # per stream, first and last mean reward of this run so far
    gpus_held: int
    requeued: int
    workers_lost: int = 0  # as JobResult.workers_lost, so far
    phase: str = ""  # what a running job waits for ("loading model", "waiting for GPUs (actor_train)"); "" = working
    phase_since_s: float = 0.0  # when that phase began (seconds since the run started)
    events: tuple[ActivityChange, ...] = ()  # drained since the previous poll


LOAD_WAIT = "waiting for GPUs to load"  # JobProgress.phase while the model load waits (for GPUs, or the job's queues)


@dataclass(frozen=True, kw_only=True)
class JobResult:
    """What a coordinator's run returns to the driver: the job's records, folded into the outputs."""

    pipeline_id: str
    status: JobStatus
    error: str = ""
    arrival_s: float = 0.0
    init_s: float = 0.0
    finish_s: float = 0.0
    steps: tuple[StepRecord, ...] = ()
    steps_before: int = 0  # steps an earlier run trained (the job resumed from its checkpoint)
    steps_planned: int = 0  # steps the job will have trained at its end (steps_before included)
    trained_already: bool = False  # its checkpoints held all its steps: it started nothing (left out of the run's metrics)
    trajectories: tuple[TrajRecord, ...] = ()
    switches: tuple[SwitchRecord, ...] = ()
    requeued: int = 0
    orphaned: int = 0  # of the requeued, those whose worker died under them (continued elsewhere)
    lost: int = 0
    preemptions: int = 0  # shrinks that interrupted running trajectories (as in the simulator)
    workers_lost: int = 0  # rollout workers lost: died, failed to start, or killed after a call failed or missed its
    # deadline; and wakes refused for want of device memory (the process kept, asleep)
    control_overhead_s: float = 0.0  # blocking control-plane time beyond waiting for GPUs
    control_calls: int = 0
    gpu_wait_s: float = 0.0  # time gang requests waited for GPUs in the scheduler
    trainer_ranks: int = 0  # data-parallel trainer processes (one per actor_train GPU); 0 = never started
    events: tuple[ActivityChange, ...] = ()  # not yet drained by a progress poll
    bad_input: bool = False  # failed on the user's input (a reward function), not on rlix: exit status 2
    warnings: tuple[str, ...] = ()  # what went wrong beside the training, one line each (said on stderr at the run's end)
    stopped: Stopped | None = None  # cancelled through the scheduler: who asked (exit status 3, or 4 for a stopped scheduler)
