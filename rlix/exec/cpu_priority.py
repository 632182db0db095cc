"""Executor layer: a spare worker process starts on the host's idle CPU only.

A job warms a sleeping rollout process on every bundle outside its home once
its model is loaded (see :mod:`rlix.exec.rollout.lifecycle`). Such a start is
speculative: it holds no GPU and serves nobody yet, so it must not slow the
processes that are working meanwhile (on a CPU host, every job's rollouts and
training; on a GPU host, the engines' CPU-side schedulers). Its imports and
model build run under Linux's ``SCHED_IDLE`` policy, below any nice value
(Ray already runs its workers at nice 15, so a nice value alone would hardly
lower it), and the process gets the normal policy back once it is up, before
it serves anything.

Linux keeps the policy per thread: every thread of the process (and of the
processes it started meanwhile) is lowered and raised back. Where a process
may not raise itself back (not root, and an ``RLIMIT_NICE`` that does not
cover its nice value) or the platform has no ``SCHED_IDLE``, the start runs
at normal priority.
"""

from __future__ import annotations

import os
from pathlib import Path


def yield_cpu() -> bool:
    """Put this process under ``SCHED_IDLE``; whether it was (False: left as it is)."""
    try:
        if not _may_return(os.getpriority(os.PRIO_PROCESS, 0)):
            return False
        _set_policy(_threads(os.getpid()), os.SCHED_IDLE)
    except (OSError, AttributeError):  # no /proc or no SCHED_IDLE: not Linux
        return False
    return True


def reclaim_cpu(lowered: bool) -> None:
    """Give this process (and the processes it started) the normal policy back, if :func:`yield_cpu` lowered it."""
    if lowered:
        _set_policy([t for pid in (os.getpid(), *_descendants(os.getpid())) for t in _threads(pid)], os.SCHED_OTHER)


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
