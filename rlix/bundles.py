"""Where a pipeline's processes run on the GPUs rlix reserved in Ray: the placement of one process.

rlix, not Ray, decides which job uses which GPU and when; Ray only knows
that the GPUs are taken (one placement group per rlix node, one bundle per
GPU: :class:`rlix.protocol.GpuMap`). A process given GPUs by a plan is
therefore placed in the reserved bundle of its first GPU, so on the node
that holds them, asks Ray for no GPU of its own, and is started with
``CUDA_VISIBLE_DEVICES`` set to its GPUs' device ids on that node.

rlix's own workers are placed so (:func:`rlix.exec.placement.actor_options`),
and so is a pipeline's own rollout actor, through
:meth:`rlix.client.Client.actor_options`::

    Engine.options(**client.actor_options(gpus)).remote(...)

Nothing here imports the executor.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlix.core import ClusterSpec
from rlix.core.types import Gpus
from rlix.protocol import GpuMap


class PlacementError(RuntimeError):
    """A process cannot be placed on the GPUs it was given (one line)."""


@dataclass(frozen=True, kw_only=True)
class Pinning:
    """Where a process runs: its node's index and its GPUs' node-local ids."""

    node: int
    local_gpus: tuple[int, ...]


def pinning(cluster: ClusterSpec, gpus: Gpus) -> Pinning:
    """The node holding ``gpus`` and their ids on it (:class:`ValueError` if they span nodes)."""
    nodes = {cluster.node_of(g) for g in gpus}
    if len(nodes) != 1:
        raise ValueError(f"GPUs {gpus} span nodes {sorted(nodes)}; a worker lives on one node")
    node = nodes.pop()
    return Pinning(node=node, local_gpus=tuple(g - node * cluster.gpus_per_node for g in gpus))


def visible_devices(cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process on ``gpus``: their device ids as Ray named them when it
    reserved them (the rlix ids on the node when nothing was reserved)."""
    pin = pinning(cluster, gpus)
    devices = gpu_map.devices[pin.node] if gpu_map.groups else None
    return ",".join(str(devices[g] if devices else g) for g in pin.local_gpus)


def bundle_options(cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap, *, name: str, env: dict[str, str] | None = None) -> dict:
    """Ray's ``.options(...)`` for an actor on ``gpus``: no CPU or GPU asked of Ray, placed in the bundle of
    its first GPU, seeing exactly their devices; ``env``: more environment variables for its process.
    :class:`PlacementError` on a cluster of several nodes with nothing reserved (nothing would put the
    process on the node holding its GPUs)."""
    pin = pinning(cluster, gpus)
    if cluster.nodes > 1 and not gpu_map.groups:
        raise PlacementError(f"{name}: no GPU reservation for a {cluster.nodes}-node cluster; restart the run or the service")
    opts: dict = {
        "num_cpus": 0,
        "num_gpus": 0,
        "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": visible_devices(cluster, gpus, gpu_map), **(env or {})}},
    }
    if gpu_map.groups:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = gpu_map.groups[pin.node]
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=pin.local_gpus[0])
    return opts
