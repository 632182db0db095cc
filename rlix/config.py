"""Shared layer: the config pieces both CLIs validate the same way.

``rlix-sim`` traces and ``rlix-run`` configs describe clusters, role
mappings, jobs and scheduler knobs with these models, and read their files
with one loader, so a job is written, defaulted and refused identically in
both: a trace's pipeline and an ``rlix-run`` job both extend
:class:`JobModel`. Errors come out as one line:
``field.path: what is wrong; how to fix it``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlix.core import ClusterSpec, PipelineSpec, QueueSpec, SchedulerConfig, SchedulingError, Stage, TenantSpec
from rlix.core.topology import validate_pipeline
from rlix.job import JobModelError, check_stage_roles, pipeline_spec

MAX_SECONDS = 1e9  # about 32 years: beyond it a float clock no longer moves by a trajectory's seconds
MAX_GPUS = 100_000  # a cluster larger than any built; past it a replay's bookkeeping outgrows the memory
MAX_SLOTS = 100_000  # trajectories one rollout worker runs at once: far past any engine's batch


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusals are one line (``prog: error: ...; see --help``), exit 2, not usage and error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def ray_address(text: str) -> str:
    """An ``--address``: 'auto' or host:port (``ray://`` too), never empty (which would quietly mean 'not given')."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give host:port or 'auto', or leave --address out")
    if text != "auto" and not re.fullmatch(r"(ray://)?[^\s/]+:\d{1,5}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address; give host:port (the head's, as ray start printed it) or 'auto'"
        )
    return text


class StrictModel(BaseModel):
    """Frozen, unknown keys are errors (a typo never passes silently), and numbers are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def parse_gpus(value: object) -> object:
    """Accept ``[0, 1, 2]`` or ``"0-7"`` / ``"0-3,8-11"`` (inclusive ranges)."""
    if isinstance(value, str):
        out: list[int] = []
        for part in value.split(","):
            lo, dash, hi = part.strip().partition("-")
            try:
                ids = range(int(lo), int(hi if dash else lo) + 1)
            except ValueError:
                raise ValueError(f"'{value}' is not a GPU list; write e.g. [0, 1] or \"0-7\"") from None
            if not ids:
                raise ValueError(f"'{part.strip()}' in '{value}' runs backwards; write the lower GPU first, e.g. \"0-7\"")
            if len(out) + len(ids) > MAX_GPUS:  # before the list is made: "0-100000000" would fill the memory
                raise ValueError(f"'{value}' names more than {MAX_GPUS:,} GPUs; no cluster has them")
            out.extend(ids)
        return out
    return value


def gpu_list_schema(schema: dict) -> None:
    """The JSON Schema of a field :func:`parse_gpus` reads: a list of GPU ids, or a range string."""
    as_list = {k: schema.pop(k) for k in ("type", "items", "minItems") if k in schema}
    schema["anyOf"] = [as_list, {"type": "string", "pattern": r"^ *[0-9]+( *- *[0-9]+)?( *, *[0-9]+( *- *[0-9]+)?)* *$"}]


class ClusterModel(StrictModel):
    nodes: int = Field(ge=1, description="machines")
    gpus_per_node: int = Field(ge=1, description="GPUs per machine")

    @model_validator(mode="after")
    def _buildable(self) -> ClusterModel:
        if self.nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(
                f"cluster: {self.nodes} nodes x {self.gpus_per_node} GPUs is more than {MAX_GPUS:,} GPUs; give fewer"
            )
        return self

    def spec(self) -> ClusterSpec:
        return ClusterSpec(nodes=self.nodes, gpus_per_node=self.gpus_per_node)


class RoleModel(StrictModel):
    gpus: list[int] = Field(
        min_length=1,
        description="GPU ids this role may use: a list or a range string like '0-7'",
        json_schema_extra=gpu_list_schema,
    )
    gpus_per_worker: int = Field(default=1, ge=1, description="tensor-parallel size: GPUs per worker bundle")

    _split_gpus = field_validator("gpus", mode="before")(parse_gpus)


class TenantModel(StrictModel):
    """A tenant with a share of the cluster (:class:`rlix.core.TenantSpec`); jobs name it in ``tenant``."""

    name: str = Field(min_length=1, description="the tenant's name, as jobs give it")
    weight: float = Field(default=1.0, gt=0, description="its share against the other tenants' when all want more")
    guarantee_gpus: int = Field(default=0, ge=0, le=MAX_GPUS, description="GPUs it gets whenever its jobs can use them")
    borrow_limit_gpus: int | None = Field(
        default=None, ge=0, le=MAX_GPUS, description="GPUs it may hold beyond its guarantee (default: no limit)"
    )

    def spec(self) -> TenantSpec:
        return TenantSpec(**self.model_dump())


class QueueModel(StrictModel):
    """An admission limit on a set of GPUs (:class:`rlix.core.QueueSpec`): jobs whose mappings overlap
    run at once, and wait for admission only where a queue says so."""

    name: str = Field(min_length=1, description="the queue's name, as status and errors give it")
    gpus: list[int] = Field(
        min_length=1, description="the GPUs it limits: a list or a range string like '0-7'", json_schema_extra=gpu_list_schema
    )
    max_jobs: int = Field(default=0, ge=0, description="most jobs touching these GPUs admitted at once (0: no limit)")
    max_resident_gb: float = Field(
        default=0.0, ge=0, description="most resident model memory (the jobs' resident_gb) admitted at once (0: no limit)"
    )

    _split_gpus = field_validator("gpus", mode="before")(parse_gpus)

    @model_validator(mode="after")
    def _limits(self) -> QueueModel:
        if not (self.max_jobs or self.max_resident_gb):
            raise ValueError(f"queue '{self.name}' sets no limit; give max_jobs or max_resident_gb")
        return self

    def spec(self) -> QueueSpec:
        return QueueSpec(
            name=self.name, gpus=tuple(sorted(self.gpus)), max_jobs=self.max_jobs, max_resident_gb=self.max_resident_gb
        )


def parse_tenants(value: object) -> object:
    """``"a:2:8:4,b:1"`` (name:weight[:guarantee[:borrow limit]], as ``--set tenants=...`` gives it) as a list."""
    if not isinstance(value, str):
        return value
    out = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        fields = item.split(":")
        if len(fields) > 4 or not fields[0]:
            raise ValueError(f"'{item}' is not a tenant; write name:weight[:guarantee_gpus[:borrow_limit_gpus]]")
        keys = ("name", "weight", "guarantee_gpus", "borrow_limit_gpus")
        out.append(dict(zip(keys, fields)))
    return out


class SchedulerModel(StrictModel):
    """The core's :class:`rlix.core.SchedulerConfig`, field for field, and the control loop's two periods beside it.

    ``plan_interval_s`` and ``heartbeat_s`` are not policy knobs (the core
    never reads a clock): they say how often the shell asks the core for a
    plan and re-sends unchanged demand, and :meth:`to_config` leaves them out.
    """

    report_ttl_s: float = Field(default=600.0, gt=0, description="demand reports older than this are stale (s)")
    protect_fraction: float = Field(default=0.1, ge=0, le=1, description="batch fraction left below which busy workers are kept")
    min_residency_s: float = Field(
        default=30.0, ge=0, description="seconds a worker keeps its GPUs before a rebalance may take them"
    )
    rebalance_margin_workers: float = Field(default=0.5, ge=0, description="hysteresis of the rollout split, in workers")
    weight_by_demand: bool = Field(
        default=False,
        description="weigh rollout shares by reported remaining trajectories (gameable: a job that over-reports gains); "
        "off: every job has the same entitlement, its demand only caps its share",
    )
    backlog_weight: float = Field(
        default=0.0, ge=0, description="with weight_by_demand: weight of not-yet-started trajectories in the rollout split"
    )
    weight_by_duration: bool = Field(
        default=False,
        description="with weight_by_demand: split by remaining work (trajectories x mean seconds), not counts",
    )
    home_floor: bool = Field(
        default=False,
        description="a pipeline's share never drops below its home partition's rollout workers while it can use them",
    )
    home_guarantee: bool = Field(
        default=True,
        description="a job with demand gets at least its free home bundles back at once from borrowers (sharing incentive)",
    )
    lend_ahead_s: float = Field(
        default=60.0,
        ge=0,
        description="with home_guarantee: a job ahead of its own static pace by more than twice this many seconds "
        "lends its guarantee until its lead falls back to it (0: always guaranteed)",
    )
    guest_stage_fit: float = Field(
        default=0.75,
        ge=0,
        le=1,
        description="a guest's gang stage goes on GPUs another job owns only if it ends within this fraction of the "
        "owner's shortest rollout and the owner's rollout left fits elsewhere in its home (0: it waits for the owner to leave)",
    )
    priority_weight: float = Field(
        default=2.0, ge=1, le=100, description="a job's rollout share weight is multiplied by priority_weight ** priority"
    )
    small_first: float = Field(
        default=3.0,
        ge=0,
        le=10,
        description="favour jobs with little work left: weight x (most work left / own work left) ** small_first (0: off)",
    )
    path_halving_s: float = Field(
        default=350.0,
        ge=0,
        description="favour the job with the longest chain of steps ahead: weight halves per this many seconds "
        "of shorter chain (0: off)",
    )
    slowdown_weight: float = Field(
        default=5.0,
        ge=0,
        le=10,
        description="finish-time fairness among co-tenants (jobs with no home of their own): weight x (projected "
        "slowdown) ** slowdown_weight, and the most slowed co-tenant's gang stage first among stages alike (0: off)",
    )
    urgency_cap: float = Field(
        default=8.0,
        ge=0,
        description="with slowdown_weight: the most small_first and path_halving_s together may favour one co-tenant "
        "with demand over another, as a ratio of weights (0: no cap)",
    )
    floor_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="a co-tenant (no home of its own) not starving gets its one-worker floor only where its share "
        "without floors is at least this many workers; else it takes turns (0: every job a floor while capacity holds them)",
    )
    stage_yield: float = Field(
        default=0.0,
        ge=0,
        description="a co-tenant's gang stage waits (up to turn_limit_s) while it would preempt the busy rollout of a "
        "co-tenant this many times as slowed (finish-time fairness before the stage priorities; 0: off, else > 1)",
    )
    lost_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="seconds a bundle whose rollout worker was lost (died, or did not wake) gets no worker of that job (0: off)",
    )
    turn_limit_s: float = Field(
        default=900.0,
        gt=0,
        description="seconds at most that the worker a starving job got is kept from other starving jobs, "
        "if the job finishes no trajectory before (keep it above the longest trajectory)",
    )
    tenants: list[TenantModel] = Field(
        default_factory=list,
        description="tenants with shares: weight, guaranteed GPUs and a borrowing limit (none: no tenant split)",
    )

    queues: list[QueueModel] = Field(
        default_factory=list,
        description="admission limits on sets of GPUs (none: jobs whose mappings overlap all run at once, as co-tenants)",
    )

    plan_interval_s: float = Field(
        default=5.0,
        ge=0.1,  # more often, a replay spends its time on plans that change nothing (1e-9 s never ended)
        description="seconds between the control loop's periodic plans (demand, TTLs, residency)",
    )
    heartbeat_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds between re-sent demand reports of a job with open trajectories (default: report_ttl_s / 4)",
    )

    _split_tenants = field_validator("tenants", mode="before")(parse_tenants)

    @field_validator("stage_yield")
    @classmethod
    def _yield_off_or_at_least_one(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError("use 0 (off) or a ratio above 1")
        return value

    @model_validator(mode="after")
    def _beat_in_time(self) -> SchedulerModel:
        if self.heartbeat() >= self.report_ttl_s:
            raise ValueError(
                f"heartbeat_s: {self.heartbeat()} s is not below report_ttl_s ({self.report_ttl_s} s), so reports "
                "would go stale between heartbeats; lower heartbeat_s or raise report_ttl_s"
            )
        return self

    def heartbeat(self) -> float:
        """Seconds between heartbeats: ``heartbeat_s``, or a quarter of the report TTL (well before a report goes stale)."""
        return self.heartbeat_s if self.heartbeat_s is not None else self.report_ttl_s / 4

    def to_config(self) -> SchedulerConfig:
        """The policy knobs only (the control loop's periods stay with the shell)."""
        knobs = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(SchedulerConfig) if f.name not in ("tenants", "queues")
        }
        return SchedulerConfig(
            **knobs, tenants=tuple(t.spec() for t in self.tenants), queues=tuple(q.spec() for q in self.queues)
        )

    def tenant_error(self, tenants: list[str], where: str) -> str | None:
        """What is wrong with the jobs' ``tenants`` (named ``where[i].tenant``) against these, or None."""
        declared = [t.name for t in self.tenants]
        if len(set(declared)) != len(declared):
            return "scheduler.tenants: two tenants have one name; give each its own"
        for i, name in enumerate(tenants):
            if name and name not in declared:
                return (
                    f"{where}[{i}].tenant: '{name}' is not declared in scheduler.tenants "
                    f"(declared: {', '.join(declared) or 'none'}); declare it there or remove the job's tenant"
                )
        return None


RoleName = Literal["actor_train", "actor_infer", "critic", "reference"]
REQUIRED_ROLES = ("actor_train", "actor_infer")
SLOTS_PER_WORKER = 4  # trajectories one rollout worker runs at once, when a job does not say


class JobModel(StrictModel):
    """What a job is to the scheduler, shared by a trace's pipeline and an ``rlix-run`` job.

    The shells extend it (a trace adds its steps and costs, ``rlix-run`` its
    model, data and algorithm) and build its :class:`PipelineSpec` with
    :meth:`spec`, so a job gets the same defaults, home rule and checks in both.
    """

    kind: Literal["full_finetune", "multi_lora"] = Field(
        default="full_finetune", description="full_finetune, or several LoRA adapters on one base"
    )
    arrival_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS, description="seconds after the start at which the job arrives")
    roles: dict[RoleName, RoleModel] = Field(description="GPU mapping of each role; actor_train and actor_infer are required")
    home: list[int] = Field(
        default_factory=list,
        json_schema_extra=gpu_list_schema,
        description="GPUs guaranteed to the job: it gets them back the moment it has work for them, and the baselines "
        "confine it there (default: none guaranteed where other jobs map the same GPUs, which makes them co-tenants; "
        "the baselines use the training GPUs, or every GPU the job maps when no rollout bundle lies inside those)",
    )
    resident_gb: float = Field(
        default=0.0, ge=0, description="host memory its model holds while admitted (the CPU weight cache), for queue limits"
    )
    staleness: int = Field(default=0, ge=0, description="steps rollout may run ahead of training (0 = on-policy)")
    slots_per_worker: int = Field(
        default=SLOTS_PER_WORKER, ge=1, le=MAX_SLOTS, description="trajectories one rollout worker runs at once"
    )
    priority: int = Field(
        default=0,
        ge=-10,
        le=10,
        description="job priority, higher wins: its gang stages go first and its rollout share weighs "
        "priority_weight ** priority",
    )
    tenant: str = Field(default="", description="the tenant the job belongs to (declared in scheduler.tenants)")
    rollout_mode: Literal["batch", "streaming"] = Field(
        default="batch",
        description="batch: one rollout batch at a time; streaming: a free slot starts the next batch's trajectories "
        "as soon as the staleness bound allows, and training takes each batch once it is complete",
    )
    partial_rollout: bool = Field(
        default=False,
        description="streaming: a weight update reaches workers with trajectories in flight (they go on under the new "
        "weights; staleness counts their oldest segment) instead of waiting for the worker to drain",
    )

    dispatch: Literal["predicted", "drawn"] = Field(
        default="predicted",
        description="order of a rollout's waiting trajectories: predicted-longest first (rlix.lengths: from their "
        "prompts' earlier lengths and their group siblings', once those are seen to track lengths; as drawn until "
        "then, and for a trace's job whose steps lack prompt ids), or as drawn",
    )

    placement: Literal["lowest_gpu", "longest_held"] = Field(
        default="lowest_gpu",
        description="which worker a waiting trajectory starts on: the lowest GPU with a free slot first; or, where "
        "the waiting trajectories fill every free slot, the workers the job has held longest first, so the front "
        "of the queue (put back trajectories, then, under dispatch predicted once lengths are seen to repeat, the "
        "predicted-longest) goes where the job has stayed longest "
        "(docs/lengths.md: it does not pay on the traces measured)",
    )

    _split_home = field_validator("home", mode="before")(parse_gpus)

    @field_validator("priority", mode="before")
    @classmethod
    def _not_a_bool(cls, v: object) -> object:
        if isinstance(v, bool):  # pydantic would read true as 1
            raise ValueError(f"{str(v).lower()} is not a priority; write a whole number from -10 to 10")
        return v

    @model_validator(mode="after")
    def _required_roles(self) -> JobModel:
        for role in REQUIRED_ROLES:
            if role not in self.roles:
                raise ValueError(f"roles.{role} is missing; every job maps actor_train and actor_infer")
        if self.partial_rollout and self.rollout_mode != "streaming":
            raise ValueError("partial_rollout needs rollout_mode 'streaming'")
        return self

    @model_validator(mode="after")
    def _home_within_mappings(self) -> JobModel:
        """A home guarantees GPUs the job uses: each at most once, and each in one of its roles' mappings."""
        if len(set(self.home)) != len(self.home):
            twice = next(g for g in self.home if self.home.count(g) > 1)
            raise ValueError(f"home: GPU {twice} is listed twice; list each GPU once")
        mapped = {g for role in self.roles.values() for g in role.gpus}
        if outside := sorted(set(self.home) - mapped):
            raise ValueError(
                f"home: GPU {outside[0]} is in none of the job's role mappings; a home guarantees GPUs the job "
                "uses, so name GPUs its roles map (or widen a role's gpus)"
            )
        return self

    def spec(self, pipeline_id: str, *, resumable: bool) -> PipelineSpec:
        """The topology this job registers (an empty home stays empty: the job named none)."""
        return pipeline_spec(
            pipeline_id=pipeline_id,
            roles=self.roles,
            kind=self.kind,
            slots_per_worker=self.slots_per_worker,
            home=self.home,
            resumable=resumable,
            priority=self.priority,
            tenant=self.tenant,
            resident_gb=self.resident_gb,
        )


def job_topology_error(cluster: ClusterSpec, spec: PipelineSpec, stages: Iterable[Stage] = ()) -> str | None:
    """What is wrong with a job's topology on ``cluster`` (the core's rules, and a mapping for each stage), or None."""
    try:
        validate_pipeline(cluster, spec)
        check_stage_roles(spec, stages)
    except (SchedulingError, JobModelError) as exc:
        return str(exc)
    return None


TOO_MANY_DIGITS = "a number has more digits than Python reads (4,300); write a shorter one"


def _unreadable(exc: ValueError) -> str:
    """What a parser's ValueError means to the user (the digit bound, or the value it could not read)."""
    if "integer string conversion" in str(exc):
        return TOO_MANY_DIGITS
    return f"a value cannot be read ({exc}); fix it"


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object or YAML mapping (the parsers keep the last one, silently)."""

    def __init__(self, key: object, line: int = 0) -> None:
        super().__init__(key)
        self.key, self.line = key, line


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping."""

    def flatten_mapping(self, node):
        """Check a mapping's own keys the first time it is seen, before merges (<<) put keys it may
        override in front of them (a mapping merged into another is flattened before it is built)."""
        checked = self.__dict__.setdefault("_checked", set())
        if id(node) not in checked:
            checked.add(id(node))
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # other keys the safe loader refuses itself
                key = self.construct_object(key_node)
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        super().flatten_mapping(node)


DUPLICATE_LINE_BYTES = 2_000_000  # a JSON text this long or longer is not read again for a duplicate key's line


def _json_duplicate_line(text: str) -> _DuplicateKey | None:
    """A key given twice in a JSON text, with its line: read as YAML (of which JSON is all but a
    subset), whose parser knows where each key stands; None where YAML cannot read it, or where the
    text is too long to read again in a few seconds (PyYAML's pure-Python parser)."""
    if len(text) >= DUPLICATE_LINE_BYTES:
        return None
    try:
        yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except _DuplicateKey as exc:
        return exc
    except (yaml.YAMLError, ValueError, RecursionError):
        pass
    return None


def read_document(path: str | Path, fmt: Literal["json", "yaml"], error: type[ValueError], what: str) -> object:
    """A JSON or YAML file's content; ``error`` with one line when it is missing or malformed.

    ``what`` names the expected file in the fix ("a trace JSON (see traces/)").
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: no such file; give the path of {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a file; give the path of {what}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text; give the path of {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror}); give the path of {what}") from None
    if fmt == "json":
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            exc = _json_duplicate_line(text) or exc
            where = f" line {exc.line}:" if exc.line else ""
            raise error(f"{path}:{where} '{exc.key}' is given twice in one object; keep one") from None
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        except RecursionError:
            raise error(f"{path}: nested too deep to read; flatten it") from None
        except ValueError as exc:  # Python's own bound on the digits of a whole number
            raise error(f"{path}: {_unreadable(exc)}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except _DuplicateKey as exc:
        raise error(f"{path}: line {exc.line}: '{exc.key}' is given twice in one mapping; keep one") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to read; flatten it") from None
    except ValueError as exc:  # a number of too many digits, or a value YAML reads but Python cannot hold
        raise error(f"{path}: {_unreadable(exc)}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{path}:{where}: not valid YAML; fix the syntax") from None


def unwritable(path: str | Path, *, folder: bool = False) -> str | None:
    """Why ``path`` could not be written, a file (or with ``folder`` a folder, made if missing), or None:
    asked before any work, so that no run's results are lost at its end."""
    if not str(path).strip():
        return "is empty; give a path"
    if not folder and str(path).endswith(("/", os.sep)):
        return "ends in a slash; give a file name"
    try:
        return _unwritable(Path(path), folder)
    except OSError as exc:  # a folder on the way that may not be searched
        return f"cannot be reached ({exc.strerror}); pick another path"
    except RuntimeError:  # pathlib's word for a symbolic link that leads back to itself
        return "cannot be reached (a symbolic link loop); pick another path"


def overwrites(path: str | Path, others: dict[str, str | Path | None]) -> str | None:
    """Which of ``others`` (what each names -> its path; None: not given) writing ``path`` would
    overwrite, as the end of a line; None if none (or where ``path`` cannot be reached: :func:`unwritable` says why)."""
    try:
        here = Path(path).resolve()
        for what, other in others.items():
            if other is not None and str(other).strip() and Path(other).resolve() == here:
                return f"is also {what}; write it to another path"
    except (OSError, RuntimeError):
        return None
    return None


def _unwritable(path: Path, folder: bool) -> str | None:
    if folder:
        if path.exists() and not path.is_dir():
            return "is a file; give a folder"
        existing = next(p for p in (path.resolve(), *path.resolve().parents) if p.exists())
        if not existing.is_dir():
            return f"{existing} is a file; give a folder path under a folder"
        if not os.access(existing, os.W_OK):
            return f"{existing} is not writable; pick another folder"
        try:  # access() says yes to root wherever the mode bits allow, even where nothing can be made (/proc, /sys)
            os.rmdir(tempfile.mkdtemp(dir=existing))
        except OSError as exc:
            return f"nothing can be made in {existing} ({exc.strerror}); pick another folder"
        return None
    parent = path.resolve().parent
    if parent.is_file():
        return f"{parent} is a file, not a folder; pick another path"
    if not parent.is_dir():
        return "its folder does not exist; create it or pick another path"
    if path.is_dir():
        return "is a folder; give a file name inside it"
    return None if os.access(parent, os.W_OK) else "its folder is not writable; pick another path"


_HINTS = {
    "extra_forbidden": "; remove it or check its spelling",
    "missing": "; add it",
    "greater_than": "; use a larger value",
    "greater_than_equal": "; use a larger value",
    "less_than": "; use a smaller value",
    "less_than_equal": "; use a smaller value",
    "int_parsing": "; write a whole number",
    "int_type": "; write a whole number",
    "float_type": "; write a number",
    "float_parsing": "; write a number",
    "finite_number": "; write a finite number",
    "literal_error": "; use one of the listed values",
    "too_short": "; give at least that many",
    "list_type": "; write a list ([a, b], or in YAML one '- item' line each)",
}
_BLOCK = "Input should be a block of fields ({\"key\": value}, or in YAML 'key: value' lines under it)"  # not "instance of X"


def one_line(exc: ValidationError) -> str:
    """The first validation error as ``field.path: problem (got X); fix`` on one line."""
    errors = exc.errors()
    err = errors[0]
    loc = _path(err["loc"])
    msg = _BLOCK if err["type"] in ("model_type", "dict_type") else err["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    if not loc:  # a cross-field check: its message names the field itself
        return msg + more
    got = err.get("input")
    whole = isinstance(got, (dict, list)) and err["type"] not in _SCALARS  # a block where one value goes is shown
    shown = "" if whole or got is None or err["type"] == "missing" else f" (got {_short(repr(got))})"
    return f"{loc}: {msg}{shown}{_hint(err)}{_misspelt(err, errors)}{more}"


_SCALARS = ("string_type", "int_type", "float_type", "bool_type")

# What a field's pattern allows, in words (the patterns the schemas use).
_PATTERNS = {
    "^[A-Za-z0-9_.-]+$": "use only letters, digits, '_', '.' and '-'",
    "^[A-Za-z0-9_]+$": "use only letters, digits and '_'",
}


def _hint(err: dict) -> str:
    """The fix for one validation error, where its kind says one."""
    if err["type"] == "string_pattern_mismatch":
        pattern = str(err.get("ctx", {}).get("pattern"))
        allowed = re.fullmatch(r"\^(\[[^]]+\])\+\$", pattern)  # one class of characters, repeated
        bad = next((c for c in str(err.get("input", "")) if allowed and not re.fullmatch(allowed[1], c)), "")
        return (f"; {bad!r} is not allowed" if bad else "") + f"; {_PATTERNS.get(pattern, 'see the field in the reference')}"
    if err["type"] == "string_type":
        return "; write one text value"
    if err["type"] == "bool_type":
        return "; write true or false"
    return _HINTS.get(err["type"], "")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _misspelt(err: dict, errors: list[dict]) -> str:
    """For a missing field: the unknown field beside it that looks like its misspelling (``job`` for ``jobs``)."""
    if err["type"] != "missing":
        return ""
    *parent, name = err["loc"]
    given = [e["loc"][-1] for e in errors if e["type"] == "extra_forbidden" and list(e["loc"][:-1]) == parent]
    close = difflib.get_close_matches(str(name), [str(g) for g in given], n=1, cutoff=0.6)
    return f" ('{close[0]}' is given: a misspelling of '{name}'?)" if close else ""
