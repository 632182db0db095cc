"""Core layer: checks a pipeline's GPU topology against the cluster.

A role's mapping is cut into TP-sized bundles; each bundle must be a run of
consecutive GPU ids on one node, because a tensor-parallel worker cannot
straddle machines.
"""

from __future__ import annotations

from rlix.core.errors import SchedulingError
from rlix.core.types import DEFAULT_STAGE_ROLE, ClusterSpec, Gpus, PipelineSpec, RequestStage, Role, Stage

REQUIRED_ROLES = (Role.ACTOR_TRAIN, Role.ACTOR_INFER)


MAX_PRIORITY = 10  # job priorities lie in -10..10 (a share weight of priority_weight ** priority stays finite)


def validate_pipeline(cluster: ClusterSpec, spec: PipelineSpec) -> None:
    """Raise :class:`SchedulingError` naming the first thing wrong with ``spec``."""
    pid = spec.pipeline_id
    if not pid:
        raise SchedulingError("pipeline_id: must be a non-empty string")
    where = f"pipeline '{pid}'"
    if spec.slots_per_worker < 1:
        raise SchedulingError(f"{where}: slots_per_worker={spec.slots_per_worker}: must be >= 1")
    for name in ("open_limit", "total_trajectories"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SchedulingError(f"{where}: {name}={value!r}: must be an int >= 0 (0: undeclared)")
    if not isinstance(spec.batch_credit, bool) or (spec.batch_credit and not spec.open_limit):
        raise SchedulingError(f"{where}: batch_credit={spec.batch_credit!r}: must be a bool, and True only with an open_limit")
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        raise SchedulingError(f"{where}: priority={spec.priority}: must lie in -{MAX_PRIORITY}..{MAX_PRIORITY}")
    seen: set[Role] = set()
    for role_spec in spec.roles:
        if role_spec.role in seen:
            raise SchedulingError(f"{where}: role {role_spec.role.value} is mapped twice; give each role one mapping")
        seen.add(role_spec.role)
        _validate_role(cluster, where, role_spec.role.value, role_spec.gpus, role_spec.gpus_per_worker)
    for role in REQUIRED_ROLES:
        if role not in seen:
            raise SchedulingError(f"{where}: role {role.value} is missing; every pipeline maps actor_train and actor_infer")
    for gpu in spec.home:
        if not 0 <= gpu < cluster.num_gpus:
            raise SchedulingError(f"{where}: home GPU {gpu} is outside the cluster (0..{cluster.num_gpus - 1})")


def _validate_role(cluster: ClusterSpec, where: str, role: str, gpus: tuple[int, ...], tp: int) -> None:
    field = f"{where}: role {role}"
    if tp < 1:
        raise SchedulingError(f"{field}: gpus_per_worker={tp}: must be >= 1")
    if not gpus:
        raise SchedulingError(f"{field}: no GPUs mapped; list at least one bundle of {tp} GPU(s)")
    if list(gpus) != sorted(set(gpus)):
        shown = f"{list(gpus)}" if len(gpus) <= 8 else f"{list(gpus)[:8]}..."
        raise SchedulingError(
            f"{field}: GPU ids must be sorted and unique, got {shown}; list each GPU once, in order (or a range: 0-3)"
        )
    if gpus[0] < 0 or gpus[-1] >= cluster.num_gpus:
        raise SchedulingError(f"{field}: GPU ids must lie in 0..{cluster.num_gpus - 1}, got {gpus[0]}..{gpus[-1]}")
    if len(gpus) % tp:
        raise SchedulingError(f"{field}: {len(gpus)} GPUs is not a multiple of gpus_per_worker={tp}")
    for i in range(0, len(gpus), tp):
        bundle = gpus[i : i + tp]
        if bundle[-1] - bundle[0] != tp - 1:
            raise SchedulingError(f"{field}: bundle {bundle} is not contiguous; map runs of {tp} consecutive GPUs")
        if cluster.node_of(bundle[0]) != cluster.node_of(bundle[-1]):
            raise SchedulingError(
                f"{field}: bundle {bundle} spans nodes {cluster.node_of(bundle[0])} and "
                f"{cluster.node_of(bundle[-1])}; align bundles to nodes of {cluster.gpus_per_node} GPUs"
            )


def requested_gpus(spec: PipelineSpec, event: RequestStage) -> Gpus:
    """The GPUs a gang request asks for: the role it names (or the stage's default role), or the init GPUs."""
    if event.stage is Stage.INIT and event.role is None:
        return spec.init_gpus
    role = event.role or DEFAULT_STAGE_ROLE[event.stage]
    if not spec.has_role(role):
        raise SchedulingError(
            f"pipeline '{spec.pipeline_id}' stage {event.stage.value}: role {role.value} is not mapped; "
            f"add a {role.value} mapping or name another role in the request"
        )
    return spec.role(role).gpus
