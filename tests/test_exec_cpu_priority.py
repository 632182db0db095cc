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
    from rlix.exec.cpu_priority import _may_return

    if not _may_return():
        pytest.skip("a thread here may not leave SCHED_IDLE: the next case covers it")
    assert _run(LOWERED_AND_BACK) == "ok"


def test_a_process_that_could_not_leave_sched_idle_is_not_lowered():
    """Without CAP_SYS_NICE (dropped, as a default container drops it) and with an RLIMIT_NICE of 0, a
    thread may not leave SCHED_IDLE once in it: the probe finds that out, and the start is left as it is."""
    import shutil

    if shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        pytest.skip("needs util-linux's setpriv and prlimit")
    code = textwrap.dedent(
        """
        import os
        from rlix.exec.cpu_priority import idle_launch, yield_cpu
        print(yield_cpu(), os.sched_getscheduler(0) == os.SCHED_OTHER, idle_launch({"num_cpus": 0}, {}))
        """
    )
    jail = ["prlimit", "--nice=0:0", "setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"]
    out = subprocess.run([*jail, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "{'num_cpus':", "0}"]


def test_a_spare_launched_idle_runs_under_sched_idle_from_its_first_instruction_and_keeps_its_env():
    """The actor options of a spare worker: chrt on top of the job's own interpreter, the worker's
    env vars kept (its devices); the process is under SCHED_IDLE before Python runs a line."""
    import shlex
    import shutil

    from rlix.exec.cpu_priority import idle_launch

    if shutil.which("chrt") is None:
        pytest.skip("needs util-linux's chrt")
    worker = {"num_cpus": 0, "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": "3"}}}
    opts = idle_launch(worker, {})
    if opts is worker:
        pytest.skip("a thread here may not leave SCHED_IDLE: the case above covers it")
    assert opts["num_cpus"] == 0 and opts["runtime_env"]["env_vars"] == {"CUDA_VISIBLE_DEVICES": "3"}
    assert idle_launch(worker, {"py_executable": "uv run"})["runtime_env"]["py_executable"].endswith(" --idle 0 uv run")
    assert idle_launch(worker, {"conda": "env"}) is worker  # the interpreter is the conda env's: left alone
    code = (
        "import os; from rlix.exec.cpu_priority import yield_cpu; print(os.sched_getscheduler(0) == os.SCHED_IDLE, yield_cpu())"
    )
    cmd = [*shlex.split(opts["runtime_env"]["py_executable"]), "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
