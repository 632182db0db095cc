"""Executor layer: a spare worker process starts on the host's idle CPU only.

A job warms a sleeping rollout process on every bundle outside its home once
its model is loaded (see :mod:`rlix.exec.rollout.lifecycle`). Such a start is
speculative: it holds no GPU and serves nobody yet, so it must not slow the
processes that are working meanwhile (on a CPU host, every job's rollouts and
training; on a GPU host, the engines' CPU-side schedulers). Its imports and
model build run under Linux's ``SCHED_IDLE`` policy, below any nice value
(Ray already runs its workers at nice 15, so a nice value alone would hardly
lower it), from the process's first instruction where ``chrt`` can launch it
so (:func:`idle_launch`), and the process gets the normal policy back
once it is up, before it serves anything.

Linux keeps the policy per thread: every thread of the process (and of the
processes it started meanwhile) is lowered and raised back. Where a thread
may not leave ``SCHED_IDLE`` (without ``CAP_SYS_NICE`` and an ``RLIMIT_NICE``
that allows it: tried, not guessed) or the platform has no ``SCHED_IDLE``,
the start runs at normal priority.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import threading
from pathlib import Path

LOG = logging.getLogger("rlix.rollout")


def idle_launch(options: dict, job_env: dict) -> dict:
    """A spare worker's Ray actor ``options`` that start its process under ``SCHED_IDLE`` from its first
    instruction (Python's and Ray's own start-up included): ``chrt`` on top of the job's own
    ``py_executable``, the worker's other runtime-env fields kept. Unchanged where the job's runtime
    env picks the interpreter itself (conda, a container, pip or uv), there is no ``chrt``, or a
    process here could not leave ``SCHED_IDLE`` again (the worker then lowers itself, or not)."""
    chrt = shutil.which("chrt")
    if chrt is None or any(job_env.get(k) for k in ("conda", "container", "image_uri", "pip", "uv")) or not _may_return():
        return options
    python = job_env.get("py_executable") or shlex.quote(sys.executable)
    env = options.get("runtime_env") or {}
    return {**options, "runtime_env": {**env, "py_executable": f"{shlex.quote(chrt)} --idle 0 {python}"}}


def yield_cpu() -> bool:
    """Put this process under ``SCHED_IDLE`` (if it was not started so); whether it is now (False: left as it is)."""
    try:
        if os.sched_getscheduler(0) == os.SCHED_IDLE:
            return True  # started so (idle_launch)
        if not _may_return():
            return False
        _set_policy(_threads(os.getpid()), os.SCHED_IDLE)
    except (OSError, AttributeError):  # no /proc or no SCHED_IDLE: not Linux
        return False
    return True


def reclaim_cpu(lowered: bool) -> None:
    """Give this process (and the processes it started) the normal policy back, if it is under ``SCHED_IDLE``."""
    if not lowered:
        return
    tids = [t for pid in (os.getpid(), *_descendants(os.getpid())) for t in _threads(pid)]
    if refused := _set_policy(tids, os.SCHED_OTHER):  # a node whose limits differ from its coordinator's
        LOG.warning(
            "%d of %d threads of a spare worker could not leave SCHED_IDLE; they stay at idle priority", refused, len(tids)
        )


def _may_return() -> bool:
    """Whether a thread here may leave ``SCHED_IDLE`` again, tried on a short-lived thread (root without
    ``CAP_SYS_NICE``, as in a default container, may not; nor may a user whose ``RLIMIT_NICE`` is 0)."""
    result: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            result.append(True)
        except (OSError, AttributeError):  # refused, or not Linux
            result.append(False)

    thread = threading.Thread(target=probe, name="rlix-sched-probe")
    thread.start()
    thread.join()
    return result == [True]


def _set_policy(tids: list[int], policy: int) -> int:
    """Set every thread's policy; how many refused (a thread that ended meanwhile is not one)."""
    refused = 0
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            pass
        except PermissionError:
            refused += 1
    return refused


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
