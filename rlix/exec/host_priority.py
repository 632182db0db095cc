"""Executor layer: a spare rollout worker's process runs at the lowest CPU priority.

A spare is a warm process on a bundle outside its job's home, started in case the
job borrows that bundle later. Its start costs host CPU (the interpreter, torch,
the engine's build), and on a host whose CPUs are busy (logical GPUs on a CPU
host, or a GPU node short of cores) that start slows the jobs whose home it is:
on the two-job CPU example the short job's first rollout took 1.1 s (15%) longer
while the spares started. So a spare's process is born at the lowest ``nice``
(Ray's ``py_executable``: ``nice`` in front of this interpreter, or of the command
the options already name; the cluster's nodes already share this install), below
the nice 15 Ray gives its workers, and stays there: it only ever runs on GPUs it
borrows, so the homes' owners' processes come first on the host. Where the CPUs
are contended its weight is 15 against their 36 (about two-fifths), so it yields
to them but never starves (the idle scheduling class did: on a host whose CPUs
are never idle a spare never came up, and its job could not borrow). A spare
granted while it still starts starts at that priority too.
"""

from __future__ import annotations

import shlex
import shutil
import sys

BACKGROUND_NICE = 19  # the lowest CPU priority


def background_start(options: dict) -> dict:
    """Ray ``options`` for an actor whose process runs at :data:`BACKGROUND_NICE` (unchanged where there is
    no ``nice``); an interpreter command the options already name is kept, behind ``nice``."""
    if shutil.which("nice") is None:
        return options
    env = options.get("runtime_env", {})
    command = f"nice -n {BACKGROUND_NICE} {env.get('py_executable') or shlex.quote(sys.executable)}"
    return {**options, "runtime_env": {**env, "py_executable": command}}
