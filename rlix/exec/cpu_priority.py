"""Executor layer: a spare worker process starts on the host's idle CPU only.

A job warms a sleeping rollout process on every bundle outside its home once
its model is loaded (see :mod:`rlix.exec.rollout.lifecycle`). Such a start is
speculative: it holds no GPU and serves nobody yet, so it must not slow the
processes that are working meanwhile (on a CPU host, every job's rollouts and
training; on a GPU host, the engines' CPU-side schedulers). Its imports and
model build run under Linux's ``SCHED_IDLE`` policy, below any nice value
(Ray already runs its workers at nice 15, so a nice value alone would hardly
lower it), from the process's first instruction where ``chrt`` can launch it
so (:func:`idle_runtime_env`), and the process gets the normal policy back
once it is up, before it serves anything.

Linux keeps the policy per thread: every thread of the process (and of the
processes it started meanwhile) is lowered and raised back. Where a process
may not raise itself back (not root, and an ``RLIMIT_NICE`` that does not
cover its nice value) or the platform has no ``SCHED_IDLE``, the start runs
at normal priority.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

LOG = logging.getLogger("rlix.rollout")


def idle_runtime_env(runtime_env: dict) -> dict | None:
    """Ray ``runtime_env`` options that start a worker process under ``SCHED_IDLE`` from its first
    instruction (Python's and Ray's own start-up included), on top of the job's own ``py_executable``
    if it has one; None where the process could not leave ``SCHED_IDLE`` again, or there is no ``chrt``."""
    chrt = shutil.which("chrt")
    try:
        if chrt is None or not _may_return(os.getpriority(os.PRIO_PROCESS, 0)):
            return None
    except (OSError, AttributeError):  # not Linux
        return None
    return {"py_executable": f"{chrt} --idle 0 {runtime_env.get('py_executable') or sys.executable}"}


def yield_cpu() -> bool:
    """Put this process under ``SCHED_IDLE`` (if it was not started so); whether it is now (False: left as it is)."""
    try:
        if os.sched_getscheduler(0) == os.SCHED_IDLE:
            return True  # started so (idle_runtime_env)
        if not _may_return(os.getpriority(os.PRIO_PROCESS, 0)):
            return False
        _set_policy(_threads(os.getpid()), os.SCHED_IDLE)
    except (OSError, AttributeError):  # no /proc or no SCHED_IDLE: not Linux
        return False
    return True


def reclaim_cpu(lowered: bool) -> None:
    """Give this process (and the processes it started) the normal policy back, if it is under ``SCHED_IDLE``."""
    if not lowered:
        return
    try:
        _set_policy([t for pid in (os.getpid(), *_descendants(os.getpid())) for t in _threads(pid)], os.SCHED_OTHER)
    except PermissionError:  # a node whose limits differ from its coordinator's: it serves, slowly where CPU is short
        LOG.warning("a spare worker process could not leave SCHED_IDLE (RLIMIT_NICE); it stays at idle priority")


def _may_return(nice: int) -> bool:
    """Whether a thread at ``nice`` may go from ``SCHED_IDLE`` back to the normal policy (Linux >= 2.6.39)."""
    if os.geteuid() == 0:
        return True
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)  # the lowest nice value allowed is 20 - soft
    return soft == resource.RLIM_INFINITY or 20 - soft <= nice


def _set_policy(tids: list[int], policy: int) -> None:
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:  # the process ended meanwhile
        return []


def _descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state": the parent
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = sorted(parents.get(todo.pop(), []))
        found += kids
        todo += kids
    return found
