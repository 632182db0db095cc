"""A spare rollout worker's process is born at background CPU priority and returns to the run's once up.

The options are checked as Ray gets them, then a real process is started with them in a local Ray
cluster: its priority while it starts, and after :func:`return_to` (what a worker's ``prepare`` calls).
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from rlix.core import ClusterSpec
from rlix.exec.control.actor_placement import actor_options
from rlix.exec.host_priority import BACKGROUND_NICE, background_start, return_to, run_priority
from rlix.exec.messages import GpuMap

SPEC = ClusterSpec(nodes=1, gpus_per_node=2)


def test_only_a_background_process_is_started_through_nice_with_this_interpreter():
    plain = actor_options(SPEC, (1,), GpuMap(), "p")
    spare = background_start(plain)
    assert "py_executable" not in plain["runtime_env"]
    command = spare["runtime_env"]["py_executable"].split()
    assert command[-3:] == ["-n", str(BACKGROUND_NICE), sys.executable] and command[0] == shutil.which("nice")
    assert spare["runtime_env"]["env_vars"] == plain["runtime_env"]["env_vars"]  # the placement is kept
    assert {k: v for k, v in spare.items() if k != "runtime_env"} == {k: v for k, v in plain.items() if k != "runtime_env"}


def test_a_refused_return_leaves_the_priority_and_says_so(monkeypatch):
    def refuse(which, who, value):
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    assert return_to(run_priority()) is True  # already there: nothing to ask
    assert return_to(run_priority() - 1) is False
    assert return_to(None) is True


@pytest.mark.heavy
def test_a_background_process_starts_at_the_lowest_priority_and_returns_to_the_runs():
    import ray

    from rlix.import_path import worker_pythonpath

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self) -> None:
            self.born = run_priority()

        def up(self, priority: int | None) -> tuple[int, int, bool]:
            returned = return_to(priority)
            return self.born, run_priority(), returned

    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    try:
        home = Probe.options(**actor_options(SPEC, (0,), GpuMap(), "home")).remote()
        base, _, _ = ray.get(home.up.remote(None), timeout=120)
        assert base < BACKGROUND_NICE  # a process of the run (Ray's workers run at nice 15)
        spare = Probe.options(**background_start(actor_options(SPEC, (1,), GpuMap(), "spare"))).remote()
        born, now, returned = ray.get(spare.up.remote(base), timeout=120)
        assert born == BACKGROUND_NICE
        if os.geteuid() == 0:  # root may return (CAP_SYS_NICE); otherwise RLIMIT_NICE decides
            assert (now, returned) == (base, True)
        else:
            assert now == (base if returned else BACKGROUND_NICE)
    finally:
        ray.shutdown()
