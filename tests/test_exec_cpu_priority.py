"""A spare worker start (rlix.exec.cpu_priority) runs under SCHED_IDLE, every thread and child
process of it, and gets the normal policy back once it is up; where it could not get it back,
it is never lowered. Each case runs in its own process, so the test runner keeps its priority."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")

LOWERED_AND_BACK = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    from rlix.exec.cpu_priority import reclaim_cpu, yield_cpu

    def policies(pid):
        return {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}

    early = threading.Event()
    threading.Thread(target=early.wait, daemon=True).start()  # a thread older than the lowering
    assert yield_cpu()
    late = threading.Event()
    threading.Thread(target=late.wait, daemon=True).start()  # one started while lowered
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert policies(os.getpid()) == {os.SCHED_IDLE}, policies(os.getpid())
    assert policies(child.pid) == {os.SCHED_IDLE}
    reclaim_cpu(True)
    assert policies(os.getpid()) == {os.SCHED_OTHER}, policies(os.getpid())
    assert policies(child.pid) == {os.SCHED_OTHER}
    child.stdin.close()
    child.wait()
    print("ok")
    """
)


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_spare_start_is_lowered_with_its_threads_and_children_then_gets_its_priority_back():
    import os
    import resource

    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20:
        pytest.skip("this user may not raise a priority back: the other case covers it")
    assert _run(LOWERED_AND_BACK) == "ok"


def test_a_process_that_could_not_get_its_priority_back_is_not_lowered():
    """At nice 5, a user other than root whose RLIMIT_NICE is 0 (the usual default) may not leave
    SCHED_IDLE once in it: the start is left at its priority. The user id is the one thing faked."""
    code = textwrap.dedent(
        """
        import os, resource
        from rlix.exec.cpu_priority import yield_cpu
        os.nice(5)
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
        os.geteuid = lambda: 1000
        print(yield_cpu(), os.sched_getscheduler(0) == os.SCHED_OTHER)
        """
    )
    assert _run(code) == "False True"


def test_a_spare_launched_by_the_idle_runtime_env_runs_under_sched_idle_from_its_first_instruction():
    """The ``py_executable`` Ray starts a spare worker with (chrt on top of the job's own, if any): the
    process is under SCHED_IDLE before Python runs a line, and the worker's yield_cpu reports it lowered."""
    import shlex
    import shutil

    from rlix.exec.cpu_priority import idle_runtime_env

    env = idle_runtime_env({})
    if env is None:
        assert shutil.which("chrt") is None or not _may_return_here()
        return
    assert idle_runtime_env({"py_executable": "uv run"})["py_executable"].endswith("--idle 0 uv run")
    code = (
        "import os; from rlix.exec.cpu_priority import yield_cpu; print(os.sched_getscheduler(0) == os.SCHED_IDLE, yield_cpu())"
    )
    out = subprocess.run([*shlex.split(env["py_executable"]), "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def _may_return_here() -> bool:
    import os

    from rlix.exec.cpu_priority import _may_return

    return _may_return(os.getpriority(os.PRIO_PROCESS, 0))
