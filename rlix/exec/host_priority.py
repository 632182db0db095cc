"""Executor layer: a spare rollout worker's process starts at the lowest CPU priority.

A spare is a warm process on a bundle outside its job's home, started in case the
job borrows that bundle later. Its start costs host CPU (the interpreter, torch,
the engine's build), and on a host whose CPUs are busy (logical GPUs on a CPU
host, or a GPU node short of cores) that start slows the jobs whose home it is:
on the two-job CPU example the short job's first rollout took 1.1 s (15%) longer
while the spares started. So a spare's process is born at the lowest ``nice``
(Ray's ``py_executable``, with the same interpreter as this process: the cluster's
nodes already share this install), below the nice 15 Ray gives its workers: where
the CPUs are contended it gets about a third of what one of the run's processes
gets, so it yields to them but never starves (the idle scheduling class did: on a
host whose CPUs are never idle a spare never came up, and its job could not
borrow). Once up it returns to the run's priority, where the OS allows it (root,
``CAP_SYS_NICE`` or a large enough ``RLIMIT_NICE``). Where it does not, it stays
there: it only ever runs on GPUs it borrows, and the owners' processes come first.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

BACKGROUND_NICE = 19  # the lowest CPU priority


def run_priority() -> int:
    """The nice value of this process: the one a spare returns to once up (Ray runs its workers at 15)."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def background_start(options: dict) -> dict:
    """Ray ``options`` for an actor whose process is born at :data:`BACKGROUND_NICE` (unchanged where there is no ``nice``)."""
    nice = shutil.which("nice")
    if nice is None:
        return options
    command = f"{shlex.quote(nice)} -n {BACKGROUND_NICE} {shlex.quote(sys.executable)}"
    return {**options, "runtime_env": {**options.get("runtime_env", {}), "py_executable": command}}


def return_to(priority: int | None) -> bool:
    """Back to nice ``priority`` (None: stay as is); False where the OS refuses."""
    if priority is None or run_priority() == priority:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    except PermissionError:
        return False
    return True
