"""Shared layer: the rlix-trace format (version 1), loading and expansion (the simulator replays it, rlix-run records it).

A trace is one JSON file: the cluster, and for each pipeline its arrival,
kind, role mappings, switching costs and steps. A step lists its rollout
trajectory durations (seconds, one per trajectory) and the durations of its
other stages. The compact ``generate`` form (a distribution and a seed) is
expanded deterministically with numpy's PCG64, so the same trace always
yields the same trajectories. ``rlix-run`` writes the explicit form.

The JSON Schema (``rlix/schema/trace-v1.schema.json``) is generated from
these models: ``python -m rlix.trace --schema``.
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError, model_validator

from rlix.config import (
    MAX_GPUS,
    MAX_SECONDS,
    ClusterModel,
    JobModel,
    SchedulerModel,
    StrictModel,
    job_topology_error,
    one_line,
    read_document,
)
from rlix.core import ClusterSpec, PipelineSpec, SchedulingError, Stage
from rlix.core.scheduler import check_job, check_settings
from rlix.job import JobShape, StepShape, stage_gpus

FORMAT = "rlix-trace"
VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "trace-v1.schema.json"

StageName = Literal["old_logprobs", "ref_logprobs", "value_compute", "critic_train", "actor_train"]

MAX_DRAWN = 10_000_000  # trajectories a trace may draw (traces/large.json draws 1,048,576 in all)
MAX_TURNS = 1_000  # generation turns of one agentic trajectory
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


class TraceError(ValueError):
    """A trace that cannot be used; the message is one line naming the field."""


class SwitchModel(StrictModel):
    """Seconds a GPU spends switching (charged by the simulator)."""

    offload_s: Seconds = Field(default=2.0, description="shrinking a rollout worker (and ending a stage, unless stage_offload_s)")
    load_s: Seconds = Field(default=5.0, description="expanding a rollout worker (and starting a stage, unless stage_load_s)")
    weight_sync_s: Seconds = Field(default=1.0, description="pushing new weights to a live or resumed rollout worker")
    adapter_sync_s: Seconds = Field(default=0.2, description="pushing one LoRA adapter to a rollout worker")
    resume_s: Seconds = Field(default=1.0, description="re-prefilling a continued trajectory on its new worker")
    start_s: Seconds = Field(
        default=0.0,
        description="starting a rollout worker's process, in the background: those on the job's home bundles start when "
        "it arrives, the others once its model is loaded; the job reports those not up yet as starting, and no worker "
        "goes there before (0: always up)",
    )
    start_later_s: Seconds | None = Field(
        default=None,
        description="starting a rollout worker's process on the job's other bundles, once its model is loaded "
        "(null: start_s); a measured trace keeps it apart because the home's starts share the machine with the model load",
    )
    stage_load_s: Seconds | None = Field(default=None, description="starting a stage (null: load_s)")
    stage_offload_s: Seconds | None = Field(default=None, description="ending a stage (null: offload_s)")

    def stage_load(self) -> float:
        return self.load_s if self.stage_load_s is None else self.stage_load_s

    def stage_offload(self) -> float:
        return self.offload_s if self.stage_offload_s is None else self.stage_offload_s

    def start_later(self) -> float:
        return self.start_s if self.start_later_s is None else self.start_later_s


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
    trajectories: list[PositiveSeconds] | None = Field(
        default=None, min_length=1, description="rollout duration of each trajectory"
    )
    segments: list[list[Seconds]] | None = Field(
        default=None,
        min_length=1,
        description="agentic form, instead of 'trajectories': per trajectory, generation and tool seconds alternating "
        "(generation first and last: [gen, tool, gen, ...])",
    )
    stages: dict[StageName, Seconds] = Field(default_factory=dict, description="seconds of each non-rollout stage")
    prompts: list[Annotated[int, Field(ge=0, lt=2**63)]] | None = Field(
        default=None,
        description="per trajectory, the id of its prompt in the job's dataset (the step's trajectories sharing one "
        "form its group); a prompt seen again in a later step is the same prompt in another epoch",
    )

    @model_validator(mode="after")
    def _one_form(self) -> StepModel:
        if (self.trajectories is None) == (self.segments is None):
            raise ValueError(
                "give exactly one of 'trajectories' (seconds each) or 'segments' (agentic: [gen, tool, gen, ...] each)"
            )
        n = len(self.trajectories if self.trajectories is not None else self.segments or ())
        if self.prompts is not None and len(self.prompts) != n:
            raise ValueError(f"prompts: give one prompt id per trajectory ({n}), got {len(self.prompts)}")
        for j, segs in enumerate(self.segments or ()):
            if len(segs) % 2 == 0 or sum(segs[0::2]) <= 0:
                raise ValueError(
                    f"segments[{j}]: give an odd number of seconds, generation first and last, with some generation > 0"
                )
        return self


class ToolModel(StrictModel):
    """Generated agentic trajectories: each one's generation split into turns, tool calls in between."""

    turns: int = Field(ge=1, le=MAX_TURNS, description="generation turns per trajectory (tool calls = turns - 1)")
    turns_max: int | None = Field(default=None, ge=1, le=MAX_TURNS, description="draw turns uniformly from turns..turns_max")
    tool: DurationDist = Field(description="seconds of one tool/environment call (holds the slot, uses no GPU)")
    seed: int = Field(default=0, ge=0, description="seed of the draws (a whole number >= 0)")

    @model_validator(mode="after")
    def _range(self) -> ToolModel:
        if self.turns_max is not None and self.turns_max < self.turns:
            raise ValueError("turns_max must be >= turns")
        return self


class DecodeSpeedModel(StrictModel):
    """Per-trajectory decode speed against trajectories generating on one worker: flat to a knee, then slowing."""

    knee: int = Field(ge=1, description="generating trajectories a worker runs at full per-trajectory speed")
    exponent: float = Field(
        default=1.0,
        ge=0,
        le=4,
        description="beyond the knee, speed = (knee / n) ** exponent (1: the worker's total throughput stays flat)",
    )


class StageCostModel(StrictModel):
    """How a step's stage seconds scale; the seconds a trace gives hold at the reference point."""

    reference_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="GPUs the given stage seconds were measured on; a stage whose mapping has g GPUs takes "
        "(reference_gpus / g) ** gpu_exponent of them (default: no GPU scaling)",
    )
    gpu_exponent: float = Field(default=1.0, ge=0, le=1, description="1: perfect data-parallel scaling; 0: none")
    token_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of each stage's seconds that grows with the batch's tokens (its trajectories' generation "
        "seconds, relative to the stream's mean step); the rest is fixed",
    )
    share_load: bool = Field(
        default=False,
        description="consecutive stages of a step on the same GPUs share one load and one offload (the model stays "
        "resident unless another job takes the GPUs in between)",
    )


class PromptsModel(StrictModel):
    """Generated prompt identity: each step samples groups of a prompt, prompts come back epoch after epoch, and a
    trajectory's length depends on its prompt.

    A trajectory's log-length is the duration's lognormal with its standard
    normal split three ways: ``sqrt(epoch_correlation) * z_prompt +
    sqrt(group_correlation - epoch_correlation) * z_visit + sqrt(1 - group_correlation) * z_own``.
    Two samples of one group correlate by ``group_correlation``, samples of one
    prompt in different epochs by ``epoch_correlation`` (of log-length); the
    lengths' distribution stays the duration's. With both 0 the lengths are
    those drawn without prompts.
    """

    group_size: int = Field(ge=1, description="trajectories per prompt in a step (GRPO's group); divides trajectories_per_step")
    dataset: int = Field(
        ge=1, le=MAX_DRAWN, description="prompts in the dataset: one epoch visits each once, in a shuffled order"
    )
    group_correlation: float = Field(default=0.0, ge=0, le=1, description="correlation of log-length within a group")
    epoch_correlation: float = Field(
        default=0.0, ge=0, le=1, description="correlation of one prompt's log-lengths across epochs (<= group_correlation)"
    )

    @model_validator(mode="after")
    def _order(self) -> PromptsModel:
        if self.epoch_correlation > self.group_correlation:
            raise ValueError("epoch_correlation must be <= group_correlation (a group shares its epoch's draw too)")
        return self


class GenerateModel(StrictModel):
    """Compact form: ``steps`` steps drawn from a distribution with ``seed``."""

    steps: int = Field(ge=1, le=MAX_DRAWN)
    trajectories_per_step: int = Field(ge=1, le=MAX_DRAWN)
    duration: DurationDist
    stages: dict[StageName, Seconds] = Field(default_factory=dict)
    stage_jitter: float = Field(default=0.0, ge=0, lt=1, description="relative +/- spread of stage seconds")
    seed: int = Field(default=0, ge=0, description="seed of the draws (a whole number >= 0)")
    agentic: ToolModel | None = Field(default=None, description="split each trajectory into turns with tool calls between")
    prompts: PromptsModel | None = Field(default=None, description="give trajectories prompt ids with correlated lengths")

    @model_validator(mode="after")
    def _groups(self) -> GenerateModel:
        if self.steps * self.trajectories_per_step > MAX_DRAWN:
            raise ValueError(
                f"generate: {self.steps} steps x {self.trajectories_per_step} trajectories is more than the "
                f"{MAX_DRAWN:,} one stream may draw; lower steps or trajectories_per_step"
            )
        if self.agentic is not None:
            turns = max(self.agentic.turns, self.agentic.turns_max or 0)
            if self.steps * self.trajectories_per_step * turns > MAX_DRAWN:
                raise ValueError(
                    f"generate: up to {turns} turns of {self.steps * self.trajectories_per_step:,} trajectories is more "
                    f"than the {MAX_DRAWN:,} turns one stream may draw; lower agentic.turns or the trajectories"
                )
        if self.prompts is not None:
            size, dataset = self.prompts.group_size, self.prompts.dataset
            if self.trajectories_per_step % size:
                raise ValueError(f"prompts.group_size ({size}) must divide trajectories_per_step ({self.trajectories_per_step})")
            if dataset < self.trajectories_per_step // size:
                raise ValueError(f"prompts.dataset ({dataset}) must hold a step's {self.trajectories_per_step // size} prompts")
        return self


class ArrivalsModel(StrictModel):
    """More jobs like this one, arriving over time into the cluster's queue: listed times or a seeded Poisson process.

    Copy ``k`` is the pipeline with id ``<id>-<k>`` (k from 0), arriving at its
    time, its ``generate`` seeds shifted by ``k`` so the copies differ.
    """

    times_s: list[Seconds] | None = Field(
        default=None, min_length=1, max_length=10_000, description="arrival of each copy (seconds)"
    )
    per_hour: float | None = Field(
        default=None, ge=0.001, description="Poisson arrivals: mean jobs per hour, from the pipeline's arrival_s"
    )
    count: int | None = Field(default=None, ge=1, le=10_000, description="Poisson arrivals: how many jobs")
    seed: int = Field(default=0, ge=0, description="seed of the draws (a whole number >= 0)")

    @model_validator(mode="after")
    def _one_form(self) -> ArrivalsModel:
        if (self.times_s is None) == (self.per_hour is None) or (self.per_hour is None) != (self.count is None):
            raise ValueError("give either 'times_s' (a list) or 'per_hour' with 'count' (a seeded Poisson process)")
        return self

    def times(self, start: float) -> list[float]:
        if self.times_s is not None:
            return list(self.times_s)
        assert self.per_hour is not None and self.count is not None
        rng = np.random.Generator(np.random.PCG64(self.seed))
        gaps = rng.exponential(3600.0 / self.per_hour, self.count)
        return [start + float(t) for t in np.cumsum(gaps) - gaps[0]]  # the first copy arrives at ``start``


class StreamModel(StrictModel):
    """One stream of steps: the whole job (full finetune) or one LoRA adapter."""

    id: str = Field(min_length=1)
    steps: list[StepModel] | None = Field(default=None, min_length=1)
    generate: GenerateModel | None = None

    @model_validator(mode="after")
    def _one_form(self) -> StreamModel:
        if (self.steps is None) == (self.generate is None):
            raise ValueError("give exactly one of 'steps' (explicit) or 'generate' (compact)")
        return self


class PipelineModel(JobModel):
    """One job of the trace: the shared job fields (:class:`rlix.config.JobModel`), its costs and its steps."""

    id: str = Field(min_length=1)
    preempt: Literal["continue", "requeue"] = Field(default="continue", description="fate of a trajectory on a shrunk worker")
    init_s: Seconds = Field(default=30.0, description="model load before the first step")
    switch: SwitchModel = Field(default_factory=SwitchModel)
    decode_speed: DecodeSpeedModel | None = Field(default=None, description="default: every trajectory decodes at full speed")
    stage_cost: StageCostModel = Field(default_factory=StageCostModel)
    arrivals: ArrivalsModel | None = Field(default=None, description="this pipeline is a template: copies of it arrive over time")
    # full finetune: the job's own steps; multi-LoRA: one stream per adapter
    steps: list[StepModel] | None = Field(default=None, min_length=1)
    generate: GenerateModel | None = None
    adapters: list[StreamModel] | None = None

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
        return self

    @model_validator(mode="after")
    def _arrive_in_time(self) -> PipelineModel:
        last = max(self.arrivals.times(self.arrival_s)) if self.arrivals is not None else self.arrival_s
        if not last <= MAX_SECONDS:  # a Poisson draw at a tiny per_hour: far off, or not a number
            raise ValueError(
                f"arrivals: a copy would arrive at {last:g} s, past {MAX_SECONDS:g} s; raise per_hour or lower count"
            )
        return self

    def drawn(self) -> int:
        """Trajectories this entry stands for, its copies' included."""
        per_copy = 0
        for stream in self.streams():
            if stream.generate is not None:
                per_copy += stream.generate.steps * stream.generate.trajectories_per_step
            for step in stream.steps or ():
                per_copy += len(step.trajectories or step.segments or ())
        return per_copy * len(self.job_ids())

    def job_ids(self) -> list[str]:
        if self.arrivals is None:
            return [self.id]
        n = len(self.arrivals.times_s) if self.arrivals.times_s is not None else self.arrivals.count or 0
        return [f"{self.id}-{k}" for k in range(n)]

    def copies(self) -> list[PipelineModel]:
        """The jobs this entry stands for: itself, or one copy per arrival."""
        if self.arrivals is None:
            return [self]
        out = []
        for k, t in enumerate(self.arrivals.times(self.arrival_s)):
            raw = self.model_dump(exclude_none=True, exclude={"arrivals"})
            raw.update(id=f"{self.id}-{k}", arrival_s=t)
            for block in [raw, *raw.get("adapters", [])]:
                if "generate" in block:
                    block["generate"]["seed"] += 7919 * k
            out.append(PipelineModel.model_validate(raw))
        return out

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
        counts = Counter(i for p in self.pipelines for i in p.job_ids())
        dup = sorted(i for i, n in counts.items() if n > 1)
        if dup:
            raise ValueError(f"pipeline ids must be unique; '{dup[0]}' appears more than once")
        drawn = sum(p.drawn() for p in self.pipelines)
        if drawn > MAX_DRAWN:
            raise ValueError(f"the trace draws {drawn:,} trajectories in all, more than {MAX_DRAWN:,}; give fewer jobs or steps")
        problem = self.scheduler.tenant_error([p.tenant for p in self.pipelines], "pipelines")
        if problem is not None:
            raise ValueError(problem)
        return self


def stream_stage_names(stream: StreamModel) -> set[Stage]:
    """Every non-rollout stage some step of ``stream`` runs."""
    if stream.generate is not None:
        return {Stage(name) for name in stream.generate.stages}
    return {Stage(name) for step in stream.steps or () for name in step.stages}


# ------------------------------------------------------------------ expansion


class Step:
    """One expanded step: trajectory seconds (numpy array), agentic segments if any, stage seconds, and prompt ids if any.

    ``trajectories`` holds each trajectory's seconds in all (generation and
    tool); ``segments``, when not None, holds each one's alternating
    generation and tool seconds; ``prompts``, when not None, each one's prompt
    id (the step's trajectories of one prompt are its group).
    """

    __slots__ = ("prompts", "segments", "stages", "trajectories")

    def __init__(
        self,
        trajectories: np.ndarray,
        stages: dict[Stage, float],
        segments: list[tuple[float, ...]] | None = None,
        prompts: np.ndarray | None = None,
    ) -> None:
        self.trajectories = trajectories
        self.segments = segments
        self.stages = stages
        self.prompts = prompts

    def rollout(self):
        """What the rollout engine queues: durations, or segment tuples."""
        return self.trajectories if self.segments is None else self.segments

    def generation_s(self) -> np.ndarray:
        """Seconds of generation (GPU compute) per trajectory."""
        if self.segments is None:
            return self.trajectories
        return np.asarray([sum(s[0::2]) for s in self.segments], dtype=np.float64)

    def reorder(self, idx: np.ndarray) -> None:
        """Put the trajectories (with their segments and prompts) in the order ``idx``."""
        self.trajectories = self.trajectories[idx]
        if self.segments is not None:
            self.segments = [self.segments[i] for i in idx]
        if self.prompts is not None:
            self.prompts = self.prompts[idx]


def _explicit(s: StepModel) -> Step:
    stages = {Stage(k): v for k, v in s.stages.items()}
    prompts = None if s.prompts is None else np.asarray(s.prompts, dtype=np.int64)
    if s.segments is None:
        return Step(np.asarray(s.trajectories, dtype=np.float64), stages, prompts=prompts)
    segments = [tuple(float(x) for x in segs) for segs in s.segments]
    return Step(np.asarray([sum(x) for x in segments], dtype=np.float64), stages, segments, prompts)


class _PromptDraw:
    """A generated stream's prompts, epoch after epoch, and the shared part of each trajectory's log-length draw."""

    def __init__(self, model: PromptsModel, per_step: int, seed: int) -> None:
        self.model = model
        self.rng = np.random.Generator(np.random.PCG64([seed, 0, 1]))  # its own: the lengths' generator draws as before
        self.per_step = per_step // model.group_size
        self.z_prompt = self.rng.standard_normal(model.dataset)  # what a prompt keeps from epoch to epoch
        self._order: deque[int] = deque()  # the rest of this epoch's prompts, in the order visited

    def next_step(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt id per trajectory, its shared standard-normal part) for the next step."""
        prompts: list[int] = []
        while len(prompts) < self.per_step:
            if not self._order:  # a new epoch; a prompt this step already holds waits for its end
                fresh = self.rng.permutation(self.model.dataset).tolist()
                held = set(prompts)
                self._order = deque([q for q in fresh if q not in held] + [q for q in fresh if q in held])
            prompts.append(self._order.popleft())
        ids = np.asarray(prompts, dtype=np.int64)
        z_visit = self.rng.standard_normal(len(ids))
        m = self.model
        shared = (
            math.sqrt(m.epoch_correlation) * self.z_prompt[ids] + math.sqrt(m.group_correlation - m.epoch_correlation) * z_visit
        )
        g = m.group_size
        return np.repeat(ids, g), np.repeat(shared, g)


def _agentic(durations: np.ndarray, tools: ToolModel, rng: np.random.Generator) -> list[tuple[float, ...]]:
    """Split each trajectory's generation into turns with drawn tool calls between them."""
    mu, sigma = _lognormal(tools.tool)
    out = []
    for d in durations:
        turns = tools.turns if tools.turns_max is None else int(rng.integers(tools.turns, tools.turns_max + 1))
        calls = rng.lognormal(mu, sigma, turns - 1)
        if tools.tool.max_s is not None:
            np.minimum(calls, tools.tool.max_s, out=calls)
        gen = float(d) / turns
        segs = [gen]
        for c in calls:
            segs += [float(c), gen]
        out.append(tuple(segs))
    return out


def _lognormal(d: DurationDist) -> tuple[float, float]:
    return math.log(d.median_s), max(math.log(d.p99_s / d.median_s) / 2.326347874, 1e-9)  # z(0.99)


def expand_stream(stream: StreamModel) -> list[Step]:
    """Explicit steps as they are; a ``generate`` block drawn deterministically."""
    if stream.steps is not None:
        return [_explicit(s) for s in stream.steps]
    gen = stream.generate
    assert gen is not None
    rng = np.random.Generator(np.random.PCG64(gen.seed))
    d = gen.duration
    mu, sigma = _lognormal(d)
    draw = None if gen.prompts is None else _PromptDraw(gen.prompts, gen.trajectories_per_step, gen.seed)
    out = []
    for _ in range(gen.steps):
        prompts = None
        if draw is None:
            durations = rng.lognormal(mu, sigma, gen.trajectories_per_step)
        else:  # the prompt's share of the normal moves the mean; the trajectory's own share draws as before
            prompts, shared = draw.next_step()
            durations = rng.lognormal(mu + sigma * shared, sigma * math.sqrt(1.0 - draw.model.group_correlation))
        if d.max_s is not None:
            np.minimum(durations, d.max_s, out=durations)
        stages = {}
        for name in sorted(gen.stages):
            jitter = 1.0 + gen.stage_jitter * (2.0 * rng.random() - 1.0) if gen.stage_jitter else 1.0
            stages[Stage(name)] = gen.stages[name] * jitter
        out.append(Step(durations, stages, prompts=prompts))
    if gen.agentic is not None:  # its own generator: the durations above stay those of the plain form
        tool_rng = np.random.Generator(np.random.PCG64([gen.seed, gen.agentic.seed]))
        for step in out:
            step.segments = _agentic(step.trajectories, gen.agentic, tool_rng)
            step.trajectories = np.asarray([sum(s) for s in step.segments], dtype=np.float64)
    return out


def _as_block(value: object) -> object:
    """A knob's value as given: a list or a mapping where it is written as one in YAML (``[...]``,
    ``{...}``), else the text itself (the field's own type reads it: ``1e3`` is a number, ``true`` a yes,
    ``a: 2`` a tenant), ``null`` none (a knob's unset default). A value that is not text (a number, a
    bool, a list from Python) is taken as it is."""
    if isinstance(value, str) and value.strip() in ("null", "None"):
        return None
    if not isinstance(value, str) or not value.strip().startswith(("[", "{")):
        return value
    try:
        block = yaml.safe_load(value)
    except (yaml.YAMLError, ValueError, RecursionError):
        return value
    return block if isinstance(block, (list, dict)) else value


def scale_stages(steps: list[Step], cost: StageCostModel, spec: PipelineSpec) -> list[Step]:
    """Apply the stage cost model in place: GPU-count scaling per stage, token scaling per step."""
    if cost.reference_gpus is None and cost.token_fraction == 0:
        return steps
    gen = [float(step.generation_s().sum()) for step in steps]
    mean = sum(gen) / len(gen) if gen else 0.0
    for step, tokens in zip(steps, gen):
        ratio = tokens / mean if mean > 0 else 1.0
        by_tokens = 1.0 - cost.token_fraction + cost.token_fraction * ratio
        for stage in sorted(step.stages, key=lambda s: s.value):
            by_gpus = 1.0
            if cost.reference_gpus is not None:
                by_gpus = (cost.reference_gpus / len(stage_gpus(spec, stage))) ** cost.gpu_exponent
            step.stages[stage] *= by_gpus * by_tokens
    return steps


def speed_curve(model: DecodeSpeedModel | None):
    """Generating trajectories on a worker -> fraction of full decode speed (None: always full)."""
    if model is None:
        return None
    knee, exponent = model.knee, model.exponent
    return lambda n: 1.0 if n <= knee else (knee / n) ** exponent


class Trace:
    """A loaded, validated trace, with its jobs, specs and expanded steps."""

    def __init__(self, model: TraceModel, source: str = "<trace>") -> None:
        self.model = model
        self.source = source
        self.cluster = model.cluster.spec()
        self._check_topology()

    @property
    def pipelines(self) -> list[PipelineModel]:
        """Every job, templates with ``arrivals`` expanded into their copies."""
        return list(self.jobs)

    @cached_property
    def jobs(self) -> tuple[PipelineModel, ...]:
        return tuple(copy for p in self.model.pipelines for copy in p.copies())

    def spec(self, p: PipelineModel) -> PipelineSpec:
        return p.spec(p.id, resumable=p.preempt == "continue")

    @cached_property
    def streams(self) -> dict[str, list[tuple[str, list[Step]]]]:
        """pipeline id -> [(stream id, expanded steps)], stage seconds scaled by the pipeline's cost model."""
        out = {}
        for p in self.jobs:
            spec = self.spec(p)
            out[p.id] = [(s.id, scale_stages(expand_stream(s), p.stage_cost, spec)) for s in p.streams()]
            for stream_id, steps in out[p.id]:
                self._drawn_in_time(p.id, stream_id, steps)
        return out

    def _drawn_in_time(self, pid: str, stream_id: str, steps: list[Step]) -> None:
        """Refuse a drawn trajectory or a scaled stage past ``MAX_SECONDS`` (a long tail's draw, a cost model's
        scaling): a float clock stops moving there, and the replay would never end."""
        for k, step in enumerate(steps):
            longest = max(float(step.trajectories.max(initial=0.0)), *step.stages.values(), 0.0)
            if not longest <= MAX_SECONDS:
                raise TraceError(
                    f"{self.source}: pipeline '{pid}' ({stream_id}) step {k} draws {longest:g} s, past {MAX_SECONDS:g} s; "
                    "lower its duration's p99_s (or max_s) or its stage_cost"
                )

    @property
    def drawn(self) -> bool:
        """Is any of its streams drawn from a seed (a ``generate`` block)? Only those a seed redraws."""
        return any(s.generate is not None for p in self.model.pipelines for s in p.streams())

    def reseeded(self, seed: int) -> Trace:
        """The same trace with every ``generate`` block drawn from ``seed`` instead."""
        raw = self.model.model_dump(exclude_none=True)
        for i, p in enumerate(raw["pipelines"]):
            blocks = [p] if "generate" in p else p.get("adapters", [])
            for j, block in enumerate(blocks):
                if "generate" in block:
                    block["generate"]["seed"] = seed * 1_000_003 + i * 1_009 + j
        return Trace(TraceModel.model_validate(raw), self.source)

    def without_prompts(self) -> Trace:
        """The same trace with its trajectories' prompt ids dropped (started as drawn, none predicted)."""
        raw = self.model.model_dump(exclude_none=True)
        for p in raw["pipelines"]:
            for block in [p, *p.get("adapters", [])]:
                block.get("generate", {}).pop("prompts", None)
                for step in block.get("steps", []):
                    step.pop("prompts", None)
        return Trace(TraceModel.model_validate(raw), self.source)

    def with_scheduler(self, settings: dict[str, object]) -> Trace:
        """The same trace with some scheduler knobs replaced (``{"backlog_weight": "2"}`` or ``2``; a list or a
        mapping written as YAML, ``{"queues": "[{name: q, gpus: 0-7, max_jobs: 1}]"}``, is read as one)."""
        raw = self.model.scheduler.model_dump()
        raw.update({name: _as_block(value) for name, value in settings.items()})
        try:
            scheduler = SchedulerModel.model_validate(raw)
        except ValidationError as e:
            raise TraceError(f"scheduler.{one_line(e)}") from None
        return self.replaced(scheduler=scheduler)

    def replaced(self, **fields) -> Trace:
        """The same trace with some of its top-level fields replaced, checked again as a whole (a job's
        tenant against the tenants declared, ids unique)."""
        raw = self.model.model_copy(update=fields).model_dump(exclude_none=True)
        try:
            return Trace(TraceModel.model_validate(raw), self.source)
        except ValidationError as e:
            raise TraceError(one_line(e)) from None

    def job_shapes(self) -> list[JobShape]:
        """The jobs as the job model's lower bounds see them (generation seconds only: tool time holds no GPU)."""
        shapes = []
        for p in self.jobs:
            streams = tuple(
                tuple(
                    StepShape(
                        trajectory_s=float(step.generation_s().sum()),
                        longest_s=float(step.trajectories.max()),
                        stages=tuple(step.stages.items()),
                    )
                    for step in steps
                )
                for _, steps in self.streams[p.id]
            )
            shapes.append(
                JobShape(
                    spec=self.spec(p),
                    arrival_s=p.arrival_s,
                    init_s=p.init_s,
                    staleness=p.staleness,
                    streams=streams,
                    streaming=p.rollout_mode == "streaming",
                )
            )
        return shapes

    def total_trajectories(self) -> int:
        return sum(len(step.trajectories) for streams in self.streams.values() for _, steps in streams for step in steps)

    def _check_topology(self) -> None:
        config = self.model.scheduler.to_config()
        try:
            check_settings(self.cluster, config)  # tenants' guarantees and queues within the cluster, as a replay's core checks
        except SchedulingError as exc:
            raise TraceError(f"{self.source}: scheduler.{exc}") from None
        for i, p in enumerate(self.model.pipelines):  # copies share their template's topology
            problem = pipeline_topology_error(self.cluster, p)
            try:
                check_job(config, p.spec(p.id, resumable=True))
            except SchedulingError as exc:
                problem = problem or str(exc)
            if problem is not None:
                raise TraceError(f"{self.source}: pipelines[{i}] ({p.id}): {problem}")


def pipeline_topology_error(cluster: ClusterSpec, p: PipelineModel) -> str | None:
    """What is wrong with pipeline ``p``'s mappings on ``cluster`` (the core's rules, a mapping for each stage), or None."""
    stages = {stage for stream in p.streams() for stage in stream_stage_names(stream)}
    return job_topology_error(cluster, p.spec(p.id, resumable=p.preempt == "continue"), stages)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; raise :class:`TraceError` with a one-line message."""
    raw = read_document(path, "json", TraceError, "a trace JSON (see traces/)")
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
