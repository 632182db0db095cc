"""Executor layer: find, start and stop the cluster's scheduler service (from a driver process).

The service is the scheduler actor, named ``rlix-scheduler`` in the ``rlix``
namespace, detached (it outlives the process that started it) and restarted
by Ray if it dies. ``rlix scheduler start`` starts it; so does the first
``rlix-run --address`` that finds none, with its config's policy and
scheduler block. Its cluster (nodes x GPUs per node) is given, or read from
the Ray cluster's alive GPU nodes. The service reserves those GPUs in Ray
(detached placement groups named ``rlix-gpus-<node>``, found again after a
restart) for every submitter's processes; stopping it gives them back.
"""

from __future__ import annotations

import time

from rlix import protocol
from rlix.core import ClusterSpec, SchedulingError
from rlix.exec.control.gpu_reservation import RESERVE_WAIT_S, release
from rlix.exec.service.history import DEFAULT_PATH as DEFAULT_HISTORY
from rlix.exec.service.history import KEEP_ENDED_S
from rlix.protocol import GpuMap
from rlix.transport import NAMESPACE, SCHEDULER_CALL_S, SERVICE_NAME, ClusterError, RayTransport

SHRINK_CALL_S = 300.0  # deadline of a scheduler's shrink and expand calls to a pipeline (s; a vLLM cold wake can take 100)
GPU_NAMES = "rlix-gpus"  # the service's GPU reservation: placement groups rlix-gpus-0, -1, ...
HEAD_NODE = "node:__internal_head__"  # the resource Ray gives the head node alone
REJOIN_S = 30.0  # a restarted service plans nothing until its pipelines rejoined, or for this long at most (s)


class ServiceError(ClusterError):
    """The service cannot be started or reached as asked (a one-line message with the fix)."""


def jobs(n: int) -> str:
    """``1 job``, ``2 jobs``."""
    return f"{n} job" if n == 1 else f"{n} jobs"


def ray_cluster() -> ClusterSpec:
    """The cluster as Ray sees it: its alive GPU nodes, each with the same number of GPUs."""
    import ray

    counts = sorted(int(n["Resources"]["GPU"]) for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0))
    if not counts:
        raise ServiceError("the Ray cluster has no GPUs; start its nodes with --num-gpus N, or give --nodes and --gpus")
    if counts[0] != counts[-1]:
        raise ServiceError(
            f"the Ray cluster's GPU nodes have {counts[0]} to {counts[-1]} GPUs; rlix needs the same on every node: "
            "give --gpus N (per node) and --nodes M explicitly"
        )
    return ClusterSpec(nodes=len(counts), gpus_per_node=counts[0])


def start(
    cluster: ClusterSpec,
    policy: str,
    knobs,
    metrics_port: int | None = None,
    history: str = DEFAULT_HISTORY,
    keep_ended_s: float = KEEP_ENDED_S,
) -> RayTransport:
    """Start the service on the Ray head node (or get the one a concurrent starter made); returns the
    transport to it. ``metrics_port``: where it serves Prometheus metrics (None: nowhere); ``history``: the
    SQLite file of its ended jobs, on the head node; ``keep_ended_s``: how long an ended job stays in the
    status once it is there.

    ``knobs``: a :class:`rlix.exec.config.SchedulerKnobs` (the config's scheduler block).
    """
    from rlix.exec.service.scheduler_actor import SchedulerActor

    handle = SchedulerActor.options(
        name=SERVICE_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=-1,
        get_if_exists=True,
        resources={HEAD_NODE: 0.001},  # its metrics and its records stay where operators look: the head node
    ).remote(
        cluster,
        policy,
        knobs.core(),
        time.time(),
        knobs.plan_interval_s,
        SHRINK_CALL_S,
        lease_s=15.0,
        rejoin_s=REJOIN_S,
        gpu_names=GPU_NAMES,
        metrics_port=metrics_port,
        history=history,
        pages=True,
        keep_ended_s=keep_ended_s,
    )
    return _started(handle)


def start_private(cluster: ClusterSpec, policy: str, knobs) -> RayTransport:
    """A scheduler for one script's own Ray cluster (a TRL job run without an address): it reserves the
    cluster's GPUs as the service does, but is not named, keeps no history, serves no pages and writes
    nothing under ``~/.rlix``; it ends with the cluster."""
    from rlix.exec.service.scheduler_actor import SchedulerActor

    handle = SchedulerActor.options(max_restarts=-1).remote(  # restarted, as the service is: its job rejoins
        cluster, policy, knobs.core(), time.time(), knobs.plan_interval_s, SHRINK_CALL_S, gpu_names=GPU_NAMES
    )
    return _started(handle)


def _started(handle) -> RayTransport:
    """The transport to a scheduler actor once it has started (reserved its GPUs); none is left half started."""
    import ray

    service = RayTransport(handle)
    try:
        service.call_sync(protocol.Start(), SCHEDULER_CALL_S + RESERVE_WAIT_S)
    except SchedulingError as exc:  # its GPUs could not be reserved, or its port is taken: no service
        ray.kill(handle, no_restart=True)
        raise ClusterError(str(exc)) from None
    except BaseException:  # nothing is left running half started
        ray.kill(handle, no_restart=True)
        raise
    return service


def stop(service: RayTransport, *, force: bool, wait_s: float = 60.0) -> str:
    """Stop the service: refused while jobs run (:class:`ServiceError`) unless ``force``, which
    cancels them and waits up to ``wait_s`` for them to leave first; jobs still there then are
    killed (their processes with them), so none runs on with nothing arbitrating its GPUs."""
    import ray

    busy = service.call_sync(protocol.Busy())
    if busy and not force:
        raise ServiceError(f"{jobs(len(busy))} not done ({', '.join(busy)}); wait, cancel them, or use --force")
    killed = []
    if busy:
        service.call_sync(protocol.CancelAll(by=protocol.asker()))
        deadline = time.time() + wait_s
        while time.time() < deadline and service.call_sync(protocol.Busy()):
            time.sleep(0.5)
        killed = service.call_sync(protocol.KillAll(), SCHEDULER_CALL_S + SHRINK_CALL_S)
    try:
        gpus = service.call_sync(protocol.Info()).gpus
    except SchedulingError:  # it has no reservation to give back
        gpus = GpuMap()
    service.call_sync(protocol.Stop())
    release(gpus)  # the GPUs go back to Ray (before the service goes: nothing left reserved if this process dies)
    ray.kill(service.actor, no_restart=True)
    if not busy:
        return "rlix scheduler stopped"
    late = f"; killed after {wait_s:g} s: {', '.join(killed)}" if killed else ""
    return f"rlix scheduler stopped ({jobs(len(busy))} cancelled{late})"
