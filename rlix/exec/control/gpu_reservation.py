"""Executor layer: the cluster's GPUs reserved for rlix in Ray, with their physical ids read back.

rlix, not Ray, decides which job uses which GPU and when; but Ray must know
that those GPUs are taken, or it places other Ray work on them. So a run (or
the shared scheduler service) reserves them first: one placement group per
rlix node, one bundle per GPU, packed on one Ray node. Ray then accounts every
GPU as used, and each bundle's physical device id is read back from inside it
(``ray.get_gpu_ids``), so a node whose raylet sees devices 4-7 gets workers on
4-7, not 0-3. A run's own one-node Ray reserves every GPU that Ray has, so its ids
are known without asking (:func:`own_devices`): which bundle Ray gave which id does
not matter when all of them are the run's. Worker processes are placed in the bundle of their first GPU
(:func:`rlix.exec.placement.actor_options`) and see exactly their
bundle's devices. rlix node order is the groups' (node address, node id, first
device) order, so it is the same in every process that reads the reservation.
"""

from __future__ import annotations

from rlix.core import ClusterSpec
from rlix.protocol import GpuMap
from rlix.transport import ClusterError

RESERVE_WAIT_S = 60.0  # how long to wait for Ray to reserve the GPUs (s)


def _probe():
    """Inside a bundle: (node address, node id, the bundle's device id as Ray assigned it)."""
    import ray

    ctx = ray.get_runtime_context()
    return ray.util.get_node_ip_address(), ctx.get_node_id(), str(ray.get_gpu_ids()[0])


def reserve(
    cluster: ClusterSpec,
    *,
    names: str | None = None,
    wait_s: float = RESERVE_WAIT_S,
    devices: tuple[str, ...] | None = None,
) -> GpuMap:
    """Reserve the cluster's GPUs (``cluster.nodes`` groups of ``gpus_per_node``) and read their ids back.

    ``names``: the groups are named ``{names}-{i}`` and detached (they outlive this process, as the
    scheduler service's do; a restarted service finds its own); None: unnamed, gone with the job.
    ``devices``: the one node's ids when they are known already (:func:`own_devices`); None: each
    bundle is asked, in a process of its own.
    :class:`ClusterError` (one line) if Ray cannot reserve them within ``wait_s``.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups, made = [], []
    for i in range(cluster.nodes):
        found = _existing(f"{names}-{i}", cluster) if names else None
        if found is None:
            opts = {"name": f"{names}-{i}", "lifetime": "detached"} if names else {}
            found = placement_group([{"GPU": 1}] * cluster.gpus_per_node, strategy="STRICT_PACK", **opts)
            made.append(found)
        groups.append(found)
    try:
        ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=wait_s)
        if len(ready) < len(groups):
            raise ClusterError(
                f"Ray could not reserve {cluster.nodes} x {cluster.gpus_per_node} GPUs (one node's GPUs each) within "
                f"{wait_s:g} s: other Ray work holds some, or the nodes are smaller; free them or lower cluster.nodes / "
                "cluster.gpus_per_node"
            )
        if devices is not None and cluster.nodes == 1:
            return GpuMap(groups=tuple(groups), devices=(devices,))
        return _read_back(groups, cluster)
    except BaseException:
        for g in made:  # only what this call made: groups found (a restarted service's) hold running jobs' processes
            remove_placement_group(g)
        raise


def own_devices(num_gpus: int) -> tuple[str, ...] | None:
    """The device ids of a one-node Ray that this process started with ``num_gpus`` GPUs: the first
    ``num_gpus`` of ``CUDA_VISIBLE_DEVICES``, as Ray reads them, or 0..n-1 when it is unset. None when
    they cannot be told (fewer ids listed than GPUs): then each bundle is asked."""
    import os

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        ids = [str(i) for i in range(num_gpus)]
    else:
        ids = listed.split(",") if listed else []
    return tuple(ids[:num_gpus]) if len(ids) >= num_gpus else None


def _existing(name: str, cluster: ClusterSpec):
    """The group ``name`` a previous life of the service made (None if there is none); one of
    another shape is refused (:class:`ClusterError`: stop the old service's leftovers first)."""
    import ray

    try:
        group = ray.util.get_placement_group(name)
    except ValueError:
        return None
    if len(group.bundle_specs) != cluster.gpus_per_node:
        raise ClusterError(
            f"placement group {name} reserves {len(group.bundle_specs)} GPUs, not {cluster.gpus_per_node}: a service "
            "with another cluster left it; remove it (ray.util.remove_placement_group) and start again"
        )
    return group


def _read_back(groups: list, cluster: ClusterSpec) -> GpuMap:
    """The groups in rlix node order, with each bundle's device id."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probe = ray.remote(num_cpus=0, num_gpus=0.001)(_probe)
    n = cluster.gpus_per_node
    refs = [
        probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(g, placement_group_bundle_index=b)).remote()
        for g in groups
        for b in range(n)
    ]
    found = ray.get(refs)  # every bundle probed at once
    seen = []
    for i, g in enumerate(groups):
        where = found[i * n : (i + 1) * n]
        seen.append(((where[0][0], where[0][1], min(w[2] for w in where)), g, tuple(w[2] for w in where)))
    seen.sort(key=lambda s: s[0])
    return GpuMap(groups=tuple(g for _, g, _ in seen), devices=tuple(d for _, _, d in seen))


def release(gpu_map: GpuMap) -> None:
    """Give the reserved GPUs back to Ray (quiet if they are gone already)."""
    from ray.util.placement_group import remove_placement_group

    for g in gpu_map.groups:
        try:
            remove_placement_group(g)
        except Exception:  # noqa: BLE001 -- already removed
            pass
