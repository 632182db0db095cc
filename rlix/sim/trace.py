"""Simulator layer: the rlix-trace format (version 1), loading and expansion.

A trace is one JSON file: the cluster, and for each pipeline its arrival,
kind, role mappings, switching costs and steps. A step lists its rollout
trajectory durations (seconds, one per trajectory) and the durations of its
other stages. The compact ``generate`` form (a distribution and a seed) is
expanded deterministically with numpy's PCG64, so the same trace always
yields the same trajectories. ``rlix-run`` writes the explicit form.

The JSON Schema (``rlix/sim/schema/trace-v1.schema.json``) is generated from
these models: ``python -m rlix.sim.trace --schema``.
"""

from __future__ import annotations

import json
import math
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from rlix.config import ClusterModel, RoleModel, SchedulerModel, StrictModel, one_line, parse_gpus
from rlix.core import JobKind, PipelineSpec, Role, RoleSpec, Stage

FORMAT = "rlix-trace"
VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "trace-v1.schema.json"

# Non-rollout stages of one step, in the order a step runs them.
STEP_STAGES = (Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS, Stage.VALUE_COMPUTE, Stage.CRITIC_TRAIN, Stage.ACTOR_TRAIN)
StageName = Literal["old_logprobs", "ref_logprobs", "value_compute", "critic_train", "actor_train"]

Seconds = Annotated[float, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]


class TraceError(ValueError):
    """A trace that cannot be used; the message is one line naming the field."""


class SwitchModel(StrictModel):
    """Seconds a GPU spends switching (charged by the simulator)."""

    offload_s: Seconds = Field(default=2.0, description="shrinking a rollout worker / ending a stage")
    load_s: Seconds = Field(default=5.0, description="expanding a rollout worker / starting a stage")
    weight_sync_s: Seconds = Field(default=1.0, description="pushing new weights to a live or resumed rollout worker")
    adapter_sync_s: Seconds = Field(default=0.2, description="pushing one LoRA adapter to a rollout worker")
    resume_s: Seconds = Field(default=1.0, description="re-prefilling a continued trajectory on its new worker")


class DurationDist(StrictModel):
    """A lognormal fitted by median and p99, optionally capped (long tail)."""

    dist: Literal["lognormal"] = "lognormal"
    median_s: PositiveSeconds
    p99_s: PositiveSeconds
    max_s: PositiveSeconds | None = Field(default=None, description="response-length cap, in seconds of decoding")

    @model_validator(mode="after")
    def _order(self) -> DurationDist:
        if self.p99_s < self.median_s:
            raise ValueError("p99_s must be >= median_s")
        return self


class StepModel(StrictModel):
    trajectories: list[PositiveSeconds] = Field(min_length=1, description="rollout duration of each trajectory")
    stages: dict[StageName, Seconds] = Field(default_factory=dict, description="seconds of each non-rollout stage")


class GenerateModel(StrictModel):
    """Compact form: ``steps`` steps drawn from a distribution with ``seed``."""

    steps: int = Field(ge=1)
    trajectories_per_step: int = Field(ge=1)
    duration: DurationDist
    stages: dict[StageName, Seconds] = Field(default_factory=dict)
    stage_jitter: float = Field(default=0.0, ge=0, lt=1, description="relative +/- spread of stage seconds")
    seed: int = 0


class StreamModel(StrictModel):
    """One stream of steps: the whole job (full finetune) or one LoRA adapter."""

    id: str = Field(min_length=1)
    steps: list[StepModel] | None = None
    generate: GenerateModel | None = None

    @model_validator(mode="after")
    def _one_form(self) -> StreamModel:
        if (self.steps is None) == (self.generate is None):
            raise ValueError("give exactly one of 'steps' (explicit) or 'generate' (compact)")
        return self


class PipelineModel(StrictModel):
    id: str = Field(min_length=1)
    kind: Literal["full_finetune", "multi_lora"] = "full_finetune"
    arrival_s: Seconds = 0.0
    roles: dict[Literal["actor_train", "actor_infer", "critic", "reference"], RoleModel]
    home: list[int] = Field(default_factory=list, description="dedicated partition for the baselines (default: training GPUs)")
    staleness: int = Field(default=0, ge=0, description="steps rollout may run ahead of training (0 = on-policy)")
    slots_per_worker: int = Field(default=16, ge=1, description="trajectories one rollout worker runs at once")
    preempt: Literal["continue", "requeue"] = Field(default="continue", description="fate of a trajectory on a shrunk worker")
    init_s: Seconds = Field(default=30.0, description="model load before the first step")
    switch: SwitchModel = Field(default_factory=SwitchModel)
    # full finetune: the job's own steps; multi-LoRA: one stream per adapter
    steps: list[StepModel] | None = None
    generate: GenerateModel | None = None
    adapters: list[StreamModel] | None = None

    _split_home = field_validator("home", mode="before")(parse_gpus)

    @model_validator(mode="after")
    def _streams(self) -> PipelineModel:
        if self.kind == "multi_lora":
            if not self.adapters or self.steps is not None or self.generate is not None:
                raise ValueError("a multi_lora pipeline lists its 'adapters' (each with steps or generate), not top-level steps")
            ids = [a.id for a in self.adapters]
            if len(set(ids)) != len(ids):
                raise ValueError("adapter ids must be unique")
        else:
            if self.adapters is not None:
                raise ValueError("'adapters' is only for kind multi_lora")
            if (self.steps is None) == (self.generate is None):
                raise ValueError("give exactly one of 'steps' (explicit) or 'generate' (compact)")
        for role in ("actor_train", "actor_infer"):
            if role not in self.roles:
                raise ValueError(f"roles.{role} is missing; every pipeline maps actor_train and actor_infer")
        return self

    def streams(self) -> list[StreamModel]:
        if self.kind == "multi_lora":
            return list(self.adapters or [])
        return [StreamModel(id=self.id, steps=self.steps, generate=self.generate)]


class TraceModel(StrictModel):
    format: Literal["rlix-trace"] = FORMAT
    version: Literal[1] = VERSION
    name: str = ""
    description: str = ""
    cluster: ClusterModel
    scheduler: SchedulerModel = Field(default_factory=SchedulerModel)
    pipelines: list[PipelineModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> TraceModel:
        ids = [p.id for p in self.pipelines]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"pipeline ids must be unique; '{dup[0]}' appears more than once")
        return self


# ------------------------------------------------------------------ expansion


class Step:
    """One expanded step: trajectory durations (numpy array) and stage seconds."""

    __slots__ = ("trajectories", "stages")

    def __init__(self, trajectories: np.ndarray, stages: dict[Stage, float]) -> None:
        self.trajectories = trajectories
        self.stages = stages


def expand_stream(stream: StreamModel) -> list[Step]:
    """Explicit steps as they are; a ``generate`` block drawn deterministically."""
    if stream.steps is not None:
        return [Step(np.asarray(s.trajectories, dtype=np.float64), {Stage(k): v for k, v in s.stages.items()}) for s in stream.steps]
    gen = stream.generate
    assert gen is not None
    rng = np.random.Generator(np.random.PCG64(gen.seed))
    d = gen.duration
    mu = math.log(d.median_s)
    sigma = max(math.log(d.p99_s / d.median_s) / 2.326347874, 1e-9)  # z(0.99)
    out = []
    for _ in range(gen.steps):
        durations = rng.lognormal(mu, sigma, gen.trajectories_per_step)
        if d.max_s is not None:
            np.minimum(durations, d.max_s, out=durations)
        stages = {}
        for name in sorted(gen.stages):
            jitter = 1.0 + gen.stage_jitter * (2.0 * rng.random() - 1.0) if gen.stage_jitter else 1.0
            stages[Stage(name)] = gen.stages[name] * jitter
        out.append(Step(durations, stages))
    return out


class Trace:
    """A loaded, validated trace with helpers the simulator needs."""

    def __init__(self, model: TraceModel, source: str = "<trace>") -> None:
        self.model = model
        self.source = source
        self.cluster = model.cluster.spec()
        self._check_topology()

    @property
    def pipelines(self) -> list[PipelineModel]:
        return list(self.model.pipelines)

    def spec(self, p: PipelineModel) -> PipelineSpec:
        roles = tuple(
            RoleSpec(role=Role(name), gpus=tuple(sorted(r.gpus)), gpus_per_worker=r.gpus_per_worker) for name, r in sorted(p.roles.items())
        )
        return PipelineSpec(
            pipeline_id=p.id,
            roles=roles,
            kind=JobKind(p.kind),
            slots_per_worker=p.slots_per_worker,
            home=tuple(sorted(p.home)),
            resumable=p.preempt == "continue",
        )

    @cached_property
    def streams(self) -> dict[str, list[tuple[str, list[Step]]]]:
        """pipeline id -> [(stream id, expanded steps)]."""
        return {p.id: [(s.id, expand_stream(s)) for s in p.streams()] for p in self.model.pipelines}

    def reseeded(self, seed: int) -> Trace:
        """The same trace with every ``generate`` block drawn from ``seed`` instead."""
        raw = self.model.model_dump(exclude_none=True)
        for i, p in enumerate(raw["pipelines"]):
            blocks = [p] if "generate" in p else p.get("adapters", [])
            for j, block in enumerate(blocks):
                if "generate" in block:
                    block["generate"]["seed"] = seed * 1_000_003 + i * 1_009 + j
        return Trace(TraceModel.model_validate(raw), self.source)

    def with_scheduler(self, settings: dict[str, str]) -> Trace:
        """The same trace with some scheduler knobs replaced (``{"backlog_weight": "2"}``)."""
        raw = self.model.scheduler.model_dump()
        raw.update(settings)
        try:
            scheduler = SchedulerModel.model_validate(raw)
        except ValidationError as e:
            raise TraceError(f"scheduler.{one_line(e)}") from None
        return Trace(self.model.model_copy(update={"scheduler": scheduler}), self.source)

    def total_trajectories(self) -> int:
        return sum(len(step.trajectories) for streams in self.streams.values() for _, steps in streams for step in steps)

    def _check_topology(self) -> None:
        from rlix.core import SchedulingError
        from rlix.core.topology import validate_pipeline

        for i, p in enumerate(self.model.pipelines):
            try:
                validate_pipeline(self.cluster, self.spec(p))
            except SchedulingError as e:
                raise TraceError(f"{self.source}: pipelines[{i}] ({p.id}): {e}") from None


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; raise :class:`TraceError` with a one-line message."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; give the path of a trace JSON (see traces/)") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return parse_trace(raw, source=str(path))


def parse_trace(raw: object, source: str = "<trace>") -> Trace:
    if isinstance(raw, dict) and raw.get("format", FORMAT) != FORMAT:
        raise TraceError(f"{source}: format: expected '{FORMAT}', got {raw.get('format')!r}")
    if isinstance(raw, dict) and raw.get("version", VERSION) != VERSION:
        raise TraceError(f"{source}: version: this rlix reads version {VERSION}, got {raw.get('version')!r}")
    try:
        model = TraceModel.model_validate(raw)
    except ValidationError as e:
        raise TraceError(f"{source}: {one_line(e)}") from None
    return Trace(model, source)


def dump_trace(model: TraceModel, path: str | Path) -> None:
    Path(path).write_text(model.model_dump_json(indent=1, exclude_none=True) + "\n")


def json_schema() -> dict:
    schema = TraceModel.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://rlix.dev/schema/trace-v1.schema.json"
    return schema


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--schema"]:
        SCHEMA_PATH.parent.mkdir(exist_ok=True)
        SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {SCHEMA_PATH}")
