"""Executor layer: the typed, validated ``rlix-run`` config.

``load_config(path)`` returns a :class:`RunConfig` or raises
:class:`ConfigError` whose message is one line naming the field, what was
wrong and how to fix it. Everything is checked here, before any Ray actor
starts: types and ranges (pydantic, unknown keys forbidden), then each job's
GPU topology against the cluster with the core's own validator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlix.core import ClusterSpec, JobKind, PipelineSpec, Role, RoleSpec, SchedulerConfig, SchedulingError
from rlix.core.policies import POLICIES
from rlix.core.topology import validate_pipeline
from rlix.exec.grpo import GrpoConfig
from rlix.exec.model import ModelSize
from rlix.exec.rollout import Emulation
from rlix.exec.tasks import TASKS


class ConfigError(ValueError):
    """A config that cannot run; the message is one line: ``field: problem; fix``."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _parse_gpus(value: object) -> object:
    """Accept ``[0, 1]`` or ``"0-3"`` / ``"0-3,8-11"`` (inclusive ranges)."""
    if isinstance(value, str):
        out: list[int] = []
        for part in value.split(","):
            lo, _, hi = part.strip().partition("-")
            try:
                out.extend(range(int(lo), int(hi or lo) + 1))
            except ValueError:
                raise ValueError(f"'{value}' is not a GPU list; write e.g. [0, 1] or \"0-7\"") from None
        return out
    return value


class ClusterConfig(_Model):
    nodes: int = Field(default=1, ge=1, description="machines in the Ray cluster")
    gpus_per_node: int = Field(default=4, ge=1, description="GPUs per machine (logical GPUs on a CPU host)")

    def spec(self) -> ClusterSpec:
        return ClusterSpec(nodes=self.nodes, gpus_per_node=self.gpus_per_node)


class SchedulerKnobs(_Model):
    """The core's :class:`SchedulerConfig`, plus how often the executor re-plans."""

    report_ttl_s: float = Field(default=30.0, gt=0, description="demand reports older than this are stale (s)")
    protect_fraction: float = Field(default=0.1, ge=0, le=1, description="batch fraction left below which busy workers are kept")
    min_residency_s: float = Field(default=2.0, ge=0, description="seconds a worker keeps its GPUs before a rebalance may take them")
    rebalance_margin_workers: float = Field(default=0.5, ge=0, description="hysteresis of the rollout split, in workers")
    replan_interval_s: float = Field(default=0.5, gt=0, description="periodic re-plan interval (s)")

    def core(self) -> SchedulerConfig:
        return SchedulerConfig(
            report_ttl_s=self.report_ttl_s,
            protect_fraction=self.protect_fraction,
            min_residency_s=self.min_residency_s,
            rebalance_margin_workers=self.rebalance_margin_workers,
        )


class RayConfig(_Model):
    address: str | None = Field(default=None, description="join this Ray cluster ('auto' or host:port); none = start a local one")
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the local Ray (default: all)")


class OutputConfig(_Model):
    dir: str = Field(default="runs/latest", description="directory for timeline.json, trace.json, metrics.json")
    console: bool = Field(default=True, description="live per-job progress on the console")


class EmulationConfig(_Model):
    """Device pacing for logical GPUs on a CPU host (0 = off; keep 0 on real GPUs)."""

    decode_step_s: float = Field(default=0.0, ge=0, description="minimum seconds per decode step of a trajectory")
    train_token_s: float = Field(default=0.0, ge=0, description="minimum seconds per token in log-prob and training stages")

    def value(self) -> Emulation:
        return Emulation(decode_step_s=self.decode_step_s, train_token_s=self.train_token_s)


class SizeConfig(_Model):
    arch: Literal["qwen2", "llama"] = Field(default="qwen2", description="HF architecture to build")
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=128, ge=8)
    seed: int = 0

    @model_validator(mode="after")
    def _heads(self) -> SizeConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; pick sizes that divide")
        return self

    def value(self) -> ModelSize:
        return ModelSize(**self.model_dump())


class ModelConfig(_Model):
    path: str | None = Field(default=None, description="local HF checkpoint directory (config.json + weights + tokenizer)")
    size: SizeConfig | None = Field(default=None, description="build a random-weight model of this size instead")

    @model_validator(mode="after")
    def _one(self) -> ModelConfig:
        if (self.path is None) == (self.size is None):
            raise ValueError("give exactly one of 'path' (a local checkpoint) or 'size' (build random weights)")
        if self.path is not None and not (Path(self.path) / "config.json").is_file():
            raise ValueError(f"'{self.path}' has no config.json; point path at a local HF checkpoint directory")
        return self


class TaskConfig(_Model):
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


class AlgoConfig(_Model):
    """GRPO hyper-parameters."""

    lr: float = Field(default=3e-3, gt=0, description="AdamW learning rate")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="PPO ratio clip")
    kl_coef: float = Field(default=0.0, ge=0, description="KL-to-reference weight (0: no reference model)")
    minibatches: int = Field(default=2, ge=1)
    epochs: int = Field(default=1, ge=1)
    max_grad_norm: float = Field(default=1.0, gt=0)

    def value(self, seed: int) -> GrpoConfig:
        return GrpoConfig(seed=seed, **self.model_dump())


class RoleConfig(_Model):
    gpus: list[int] = Field(min_length=1, description="GPU ids the role may use: a list or a range string like '0-7'")
    gpus_per_worker: int = Field(default=1, ge=1, description="tensor-parallel size: GPUs per worker")

    _split = field_validator("gpus", mode="before")(_parse_gpus)


class FaultConfig(_Model):
    """Fault injection (tests, drills): crash the job's coordinator on purpose."""

    crash_at_step: int | None = Field(default=None, ge=0, description="raise inside the job when this step starts")


class JobConfig(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="pipeline id prefix")
    kind: Literal["full_finetune"] = Field(default="full_finetune", description="multi_lora comes with the next issue")
    arrival_s: float = Field(default=0.0, ge=0, description="seconds after start at which the job is admitted")
    model: ModelConfig
    task: TaskConfig = Field(default_factory=TaskConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    steps: int = Field(default=10, ge=1, description="training steps")
    prompts_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=2, description="samples per prompt (GRPO group)")
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    staleness: int = Field(default=0, ge=0, description="steps rollout may run ahead of training (0 = on-policy)")
    slots_per_worker: int = Field(default=4, ge=1, description="trajectories one rollout worker runs at once")
    roles: dict[Literal["actor_train", "actor_infer", "reference"], RoleConfig]
    home: list[int] = Field(default_factory=list, description="dedicated partition for the static baselines")
    seed: int = 0
    fault: FaultConfig = Field(default_factory=FaultConfig)

    _split_home = field_validator("home", mode="before")(_parse_gpus)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def pipeline_spec(self, pipeline_id: str) -> PipelineSpec:
        roles = tuple(
            RoleSpec(role=Role(name), gpus=tuple(sorted(r.gpus)), gpus_per_worker=r.gpus_per_worker) for name, r in sorted(self.roles.items())
        )
        return PipelineSpec(
            pipeline_id=pipeline_id,
            roles=roles,
            kind=JobKind(self.kind),
            slots_per_worker=self.slots_per_worker,
            home=tuple(sorted(self.home)),
        )


class RunConfig(_Model):
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
        return self


# ------------------------------------------------------------------ loading


def load_config(path: str | Path, **overrides: object) -> RunConfig:
    """Read, validate and topology-check a YAML config; raise :class:`ConfigError`."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; pass the path of a YAML config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where}: not valid YAML; fix the syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping with at least 'jobs'")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(raw)


def parse_config(raw: dict) -> RunConfig:
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    check_topology(cfg)
    return cfg


def check_topology(cfg: RunConfig) -> None:
    """Each job's roles must fit the cluster (the core's own rules)."""
    cluster = cfg.cluster.spec()
    for i, job in enumerate(cfg.jobs):
        try:
            validate_pipeline(cluster, job.pipeline_spec(job.name))
        except SchedulingError as exc:
            raise ConfigError(f"jobs[{i}].roles: {exc}") from None


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a cross-field check: its message starts with the field it names
        return msg
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None or err["type"] == "missing" else f" (got {got!r})"
    hint = _HINTS.get(err["type"], "")
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{loc}: {msg}{shown}{hint}{more}"


_HINTS = {
    "extra_forbidden": "; remove it or check its spelling",
    "missing": "; add it",
    "greater_than": "; use a larger value",
    "greater_than_equal": "; use a larger value",
    "less_than": "; use a smaller value",
    "less_than_equal": "; use a smaller value",
    "int_parsing": "; write a whole number",
    "float_parsing": "; write a number",
    "literal_error": "; use one of the listed values",
}
