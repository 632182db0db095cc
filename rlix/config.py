"""Shared layer: the config pieces both CLIs validate the same way.

``rlix-sim`` traces and ``rlix-run`` configs describe clusters, role
mappings and scheduler knobs with these models, so a mapping is written, and
refused, identically in both. Errors come out as one line:
``field.path: what is wrong; how to fix it``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlix.core import ClusterSpec, SchedulerConfig


class StrictModel(BaseModel):
    """Frozen, and unknown keys are errors (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_gpus(value: object) -> object:
    """Accept ``[0, 1, 2]`` or ``"0-7"`` / ``"0-3,8-11"`` (inclusive ranges)."""
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


class ClusterModel(StrictModel):
    nodes: int = Field(ge=1, description="machines")
    gpus_per_node: int = Field(ge=1, description="GPUs per machine")

    def spec(self) -> ClusterSpec:
        return ClusterSpec(nodes=self.nodes, gpus_per_node=self.gpus_per_node)


class RoleModel(StrictModel):
    gpus: list[int] = Field(min_length=1, description="GPU ids this role may use: a list or a range string like '0-7'")
    gpus_per_worker: int = Field(default=1, ge=1, description="tensor-parallel size: GPUs per worker bundle")

    _split_gpus = field_validator("gpus", mode="before")(parse_gpus)


class SchedulerModel(StrictModel):
    """The core's :class:`rlix.core.SchedulerConfig`, field for field."""

    report_ttl_s: float = Field(default=600.0, gt=0, description="demand reports older than this are stale (s)")
    protect_fraction: float = Field(default=0.1, ge=0, le=1, description="batch fraction left below which busy workers are kept")
    min_residency_s: float = Field(default=30.0, ge=0, description="seconds a worker keeps its GPUs before a rebalance may take them")
    rebalance_margin_workers: float = Field(default=0.5, ge=0, description="hysteresis of the rollout split, in workers")
    backlog_weight: float = Field(default=0.0, ge=0, description="weight of not-yet-started trajectories in the rollout split")
    weight_by_duration: bool = Field(default=False, description="split rollout capacity by remaining work (trajectories x mean seconds), not counts")
    home_floor: bool = Field(default=False, description="a pipeline's share never drops below its home partition's rollout workers while it can use them")
    priority_weight: float = Field(default=2.0, ge=1, le=100, description="a job's rollout share weight is multiplied by priority_weight ** priority")
    small_first: float = Field(default=3.0, ge=0, le=10, description="favour jobs with little work left: weight x (most work left / own work left) ** small_first (0: off)")
    path_halving_s: float = Field(default=350.0, ge=0, description="favour the job with the longest chain of steps ahead: weight halves per this many seconds of shorter chain (0: off)")

    def to_config(self) -> SchedulerConfig:
        return SchedulerConfig(**{name: getattr(self, name) for name in SchedulerModel.model_fields})


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


def one_line(exc: ValidationError) -> str:
    """The first validation error as ``field.path: problem (got X); fix`` on one line."""
    err = exc.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    msg = err["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    if not loc:  # a cross-field check: its message names the field itself
        return msg + more
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None or err["type"] == "missing" else f" (got {got!r})"
    return f"{loc}: {msg}{shown}{_HINTS.get(err['type'], '')}{more}"
