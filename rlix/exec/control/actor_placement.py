"""Executor layer: pinning worker processes to the GPUs a plan gives them.

Every worker actor asks Ray for no GPU resource (the rlix scheduler, not
Ray, owns GPUs) and is started with ``CUDA_VISIBLE_DEVICES`` set to its
plan's GPUs, local to its node, on the node that holds them. On a CPU host
the ids are logical but the code path is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlix.core import ClusterSpec
from rlix.core.types import Gpus


class ClusterError(RuntimeError):
    """The Ray cluster is unreachable or smaller than the config's cluster: one line, nothing started."""


@dataclass(frozen=True, kw_only=True)
class Pinning:
    """Where a worker process runs: node index and node-local GPU ids."""

    node: int
    local_gpus: tuple[int, ...]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.local_gpus)


def pinning(cluster: ClusterSpec, gpus: Gpus) -> Pinning:
    nodes = {cluster.node_of(g) for g in gpus}
    if len(nodes) != 1:
        raise ValueError(f"GPUs {gpus} span nodes {sorted(nodes)}; a worker lives on one node")
    node = nodes.pop()
    return Pinning(node=node, local_gpus=tuple(g - node * cluster.gpus_per_node for g in gpus))


def node_ids(cluster: ClusterSpec) -> list[str]:
    """Ray node ids for cluster node indexes 0.., ordered by (IP, node id).

    Single-node clusters need no affinity; with several nodes, the GPU
    nodes of the Ray cluster are matched to rlix node indexes in this order.
    """
    import ray

    if cluster.nodes == 1:
        return []
    alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
    alive.sort(key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
    if len(alive) < cluster.nodes:
        raise ClusterError(
            f"cluster.nodes={cluster.nodes} but Ray has {len(alive)} alive GPU nodes; join more nodes or lower cluster.nodes"
        )
    return [n["NodeID"] for n in alive[: cluster.nodes]]


def actor_options(cluster: ClusterSpec, gpus: Gpus, nodes: list[str], name: str) -> dict:
    """``.options(...)`` for a worker actor pinned to ``gpus``."""
    pin = pinning(cluster, gpus)
    opts: dict = {
        "num_cpus": 0,
        "num_gpus": 0,
        "runtime_env": {
            "env_vars": {
                "CUDA_VISIBLE_DEVICES": pin.cuda_visible_devices,
                "RLIX_WORKER": name,
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
        },
    }
    if nodes:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=nodes[pin.node], soft=False)
    return opts


def device_for_worker() -> str:
    """Inside a pinned worker: the first visible CUDA device, else the CPU."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"
