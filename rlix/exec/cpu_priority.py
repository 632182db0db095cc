"""Executor layer: a spare worker process starts on the host's idle CPU only.

A job warms a sleeping rollout process on every bundle outside its home once
its model is loaded (see :mod:`rlix.exec.rollout.lifecycle`). Such a start is
speculative: it holds no GPU and serves nobody yet, so it must not slow the
processes that are working meanwhile (on a CPU host, every job's rollouts and
training; on a GPU host, the engines' CPU-side schedulers). Its imports and
model build run at the lowest CPU priority (``nice`` 19), and the process gets
its priority back once it is up, before it serves anything.

Linux keeps a nice value per thread: every thread of the process (and of the
processes it started meanwhile) is lowered and raised back. Where a process
may not raise its priority back (not root, and an ``RLIMIT_NICE`` that does
not allow it) or there is no ``/proc``, the start runs at normal priority.
"""

from __future__ import annotations

import os
from pathlib import Path

SPARE_NICE = 19  # the lowest priority: the start takes only CPU nobody else wants


def yield_cpu() -> int | None:
    """Lower this process to :data:`SPARE_NICE`; the nice value to restore, or None where it was left as is."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        if before >= SPARE_NICE or not _may_raise_to(before):
            return None
        _renice(_threads(os.getpid()), SPARE_NICE)
    except (OSError, AttributeError):  # no /proc, or a platform without per-thread priorities
        return None
    return before


def reclaim_cpu(nice: int | None) -> None:
    """Give this process (and the processes it started) back the nice value :func:`yield_cpu` returned."""
    if nice is None:
        return
    tids = [t for pid in (os.getpid(), *_descendants(os.getpid())) for t in _threads(pid)]
    _renice(tids, nice)


def _may_raise_to(nice: int) -> bool:
    """Whether this process may set its threads back to ``nice`` after lowering them."""
    if os.geteuid() == 0:
        return True
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)  # the lowest nice value allowed is 20 - soft
    return soft == resource.RLIM_INFINITY or 20 - soft <= nice


def _renice(tids: list[int], nice: int) -> None:
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
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
