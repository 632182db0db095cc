"""Core layer: rlix's pure scheduling policy.

The core decides and never acts: it imports nothing that does I/O, reads a
clock or draws random numbers. Time is a number passed in.

    from rlix.core import Scheduler, ClusterSpec
    sched = Scheduler(ClusterSpec(nodes=1, gpus_per_node=8), policy="rlix")
    plan = sched.step(now=0.0, events=[Register(spec=...), RequestStage(...)])
"""

from rlix.core.errors import InvariantViolation, SchedulingError
from rlix.core.policies import POLICIES, Policy, make_policy
from rlix.core.scheduler import Scheduler
from rlix.core.types import (
    DEFAULT_CONFIG,
    ClusterSpec,
    Event,
    Expand,
    GangHolder,
    Grant,
    JobKind,
    PipelineSpec,
    Plan,
    QueueSpec,
    Register,
    Rejoin,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    RoleSpec,
    RolloutWorker,
    SchedulerConfig,
    Shrink,
    ShrinkReason,
    Stage,
    TenantSpec,
    Unregister,
    WorkerLoad,
    WorkerLost,
)
from rlix.core.validate import check_ledger

__all__ = [
    "DEFAULT_CONFIG",
    "POLICIES",
    "ClusterSpec",
    "Event",
    "Expand",
    "GangHolder",
    "Grant",
    "InvariantViolation",
    "JobKind",
    "PipelineSpec",
    "Plan",
    "Policy",
    "Register",
    "Rejoin",
    "ReleaseStage",
    "ReportDemand",
    "RequestStage",
    "Role",
    "RoleSpec",
    "RolloutWorker",
    "Scheduler",
    "SchedulerConfig",
    "QueueSpec",
    "TenantSpec",
    "SchedulingError",
    "Shrink",
    "ShrinkReason",
    "Stage",
    "Unregister",
    "WorkerLoad",
    "WorkerLost",
    "check_ledger",
    "make_policy",
]
