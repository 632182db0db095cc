"""Executor layer: pinning worker processes to the GPUs a plan gives them.

Every worker actor asks Ray for no GPU resource (the rlix scheduler, not
Ray, decides who uses a GPU when; Ray accounts the GPUs as the run's through
their reservation, :mod:`rlix.exec.control.gpu_reservation`). It is placed in
the reserved bundle of its first GPU, so on the node that holds them, and
started with ``CUDA_VISIBLE_DEVICES`` set to its GPUs' device ids there
(:mod:`rlix.bundles`, which outside pipelines use too), which it checks at
start (:func:`check_devices`). On a CPU host the ids are logical but the code
path is the same.
"""

from __future__ import annotations

import os

from rlix.bundles import PlacementError, bundle_options, visible_devices
from rlix.core import ClusterSpec
from rlix.core.types import Gpus
from rlix.protocol import GpuMap
from rlix.ray_runtime import worker_pythonpath
from rlix.transport import ClusterError

EXPECTED_DEVICES = "RLIX_DEVICES"  # the devices a worker's bundle was given, checked against what it sees


class DeviceMismatchError(RuntimeError):
    """A worker process sees other devices than the bundle it was placed for (one line)."""


def actor_options(cluster: ClusterSpec, gpus: Gpus, gpu_map: GpuMap, name: str) -> dict:
    """``.options(...)`` for a worker actor pinned to ``gpus`` (:func:`rlix.bundles.bundle_options`), with the
    environment an rlix worker checks at start and imports this rlix from."""
    env = {
        EXPECTED_DEVICES: visible_devices(cluster, gpus, gpu_map),
        "RLIX_WORKER": name,
        "PYTHONPATH": worker_pythonpath(),  # a joined cluster's workers import this rlix too
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    try:
        return bundle_options(cluster, gpus, gpu_map, name=name, env=env)
    except PlacementError as exc:  # a run's cluster error: one line, as rlix-run reports it
        raise ClusterError(str(exc)) from None


def check_devices() -> str:
    """Inside a worker process, at start: its visible devices, which must be the ones its bundle was
    given (:class:`DeviceMismatchError` if Ray changed them: a worker never falls back to the CPU unseen)."""
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
