"""Executor layer: pinning worker processes to the GPUs a plan gives them.

Every worker actor asks Ray for no GPU resource (the rlix scheduler, not
Ray, decides who uses a GPU when; Ray accounts the GPUs as the run's through
their reservation, :mod:`rlix.exec.control.gpu_reservation`). It is placed in
the reserved bundle of its first GPU, so on the node that holds them, and
started with ``CUDA_VISIBLE_DEVICES`` set to its GPUs' device ids there, which
it checks at start (:func:`check_devices`). On a CPU host the ids are logical
but the code path is the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlix.core import ClusterSpec
from rlix.core.types import Gpus
from rlix.protocol import GpuMap
from rlix.ray_runtime import worker_pythonpath
from rlix.transport import ClusterError

EXPECTED_DEVICES = "RLIX_DEVICES"  # the devices a worker's bundle was given, checked against what it sees


class DeviceMismatchError(RuntimeError):
    """A worker process sees other devices than the bundle it was placed for (one line)."""


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


def actor_options(cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap, name: str) -> dict:
    """``.options(...)`` for a worker actor pinned to ``gpus``: placed in the reserved bundle of its
    first GPU (so on the node that holds them), seeing exactly their device ids."""
    pin = pinning(cluster, gpus)
    if cluster.nodes > 1 and not gpu_map.groups:  # nothing would put it on the node holding its GPUs
        raise ClusterError(f"{name}: no GPU reservation for a {cluster.nodes}-node cluster; restart the run or the service")
    devices = gpu_map.devices[pin.node] if gpu_map.groups else None
    visible = ",".join(str(devices[g] if devices else g) for g in pin.local_gpus)
    opts: dict = {
        "num_cpus": 0,
        "num_gpus": 0,
        "runtime_env": {
            "env_vars": {
                "CUDA_VISIBLE_DEVICES": visible,
                EXPECTED_DEVICES: visible,
                "RLIX_WORKER": name,
                "PYTHONPATH": worker_pythonpath(),  # a joined cluster's workers import this rlix too
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
        },
    }
    if gpu_map.groups:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            gpu_map.groups[pin.node], placement_group_bundle_index=pin.local_gpus[0]
        )
    return opts


def check_devices() -> str:
    """Inside a worker process, at start: its visible devices, which must be the ones its bundle was
    given (:class:`DeviceMismatchError` if Ray changed them: a worker never falls back to the CPU unseen)."""
    import os

    expected = os.environ.get(EXPECTED_DEVICES)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if expected is not None and visible != expected:
        who = os.environ.get("RLIX_WORKER", "worker")
        raise DeviceMismatchError(
            f"{who}: CUDA_VISIBLE_DEVICES is '{visible}' but its bundle's GPUs are '{expected}'; something "
            "(Ray before 2.56 blanks it for actors that ask Ray for no GPU) changed it: upgrade Ray"
        )
    return visible


def device_for_worker() -> str:
    """Inside a pinned worker: the first visible CUDA device, else the CPU."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def require_readable(path: str, what: str) -> None:
    """A path the driver named that this worker's node cannot read: one line naming it and the node."""
    if not os.access(path, os.R_OK):
        import socket

        raise FileNotFoundError(
            f"{what} {path} cannot be read on node {socket.gethostname()}; "
            "put it on storage every node of the Ray cluster reads, under the same path"
        )


def setup_process() -> str:
    """A worker process's start: one torch thread, and its visible devices checked against its bundle's."""
    import torch

    torch.set_num_threads(1)
    return check_devices()
