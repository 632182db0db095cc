"""Where Ray workers import rlix from: the same place the driver did.

A worker started by Ray on any node imports rlix from its own ``sys.path``.
Installed with pip on every node, that is enough; run from a source checkout,
an editable install or a worktree, the workers need the checkout's directory
on their ``PYTHONPATH`` (on other nodes too, where the path is shared or
copied). Every worker rlix starts carries this path, whether rlix started
its Ray or joined one (``--address``, ``ray job submit``).
"""

from __future__ import annotations

import os
from pathlib import Path


def worker_pythonpath() -> str:
    """The directory above the ``rlix`` package this process imported, then this process's ``PYTHONPATH``."""
    import rlix

    root = str(Path(rlix.__file__).resolve().parent.parent)
    return os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
