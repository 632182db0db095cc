"""A spare rollout worker's process runs at the lowest CPU priority, every thread of it.

The options are checked as Ray gets them, then real processes are started with them in a local
Ray cluster: a spare's threads at the lowest priority, a normal worker's at the run's.
"""

from __future__ import annotations

import os
import shlex
import sys

import pytest

from rlix.core import ClusterSpec
from rlix.exec.host_priority import BACKGROUND_NICE, background_start
from rlix.exec.placement import actor_options
from rlix.protocol import GpuMap

SPEC = ClusterSpec(nodes=1, gpus_per_node=2)


def test_only_a_background_process_is_started_through_nice_with_this_interpreter():
    plain = actor_options(SPEC, (1,), GpuMap(), "p")
    spare = background_start(plain)
    assert "py_executable" not in plain["runtime_env"]
    assert shlex.split(spare["runtime_env"]["py_executable"]) == ["nice", "-n", str(BACKGROUND_NICE), sys.executable]
    behind = background_start({"runtime_env": {"py_executable": "uv run python"}})
    assert behind["runtime_env"]["py_executable"] == f"nice -n {BACKGROUND_NICE} uv run python"  # kept, behind nice
    assert spare["runtime_env"]["env_vars"] == plain["runtime_env"]["env_vars"]  # the placement is kept
    assert {k: v for k, v in spare.items() if k != "runtime_env"} == {k: v for k, v in plain.items() if k != "runtime_env"}


@pytest.mark.heavy
def test_every_thread_of_a_background_process_runs_at_the_lowest_priority():
    import ray

    from rlix.ray_runtime import worker_pythonpath

    @ray.remote(num_cpus=0, max_concurrency=4)  # a threaded actor, as a rollout worker is
    class Probe:
        def priorities(self) -> set[int]:
            return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}

    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    try:
        home = Probe.options(**actor_options(SPEC, (0,), GpuMap(), "home")).remote()
        run = ray.get(home.priorities.remote(), timeout=120)
        if BACKGROUND_NICE in run:
            pytest.skip("this test runs at the lowest priority already")
        spare = Probe.options(**background_start(actor_options(SPEC, (1,), GpuMap(), "spare"))).remote()
        assert ray.get(spare.priorities.remote(), timeout=120) == {BACKGROUND_NICE}
        assert max(run) < BACKGROUND_NICE  # a worker of the run (Ray gives its main thread nice 15)
    finally:
        ray.shutdown()
