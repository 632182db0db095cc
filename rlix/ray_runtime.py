"""How rlix uses Ray wherever it runs: where Ray workers import rlix from, and the local cluster a run owns.

**Where workers import rlix from: the same place the driver did.** A worker
started by Ray on any node imports rlix from its own ``sys.path``. Installed
with pip on every node, that is enough; run from a source checkout, an
editable install or a worktree, the workers need the checkout's directory on
their ``PYTHONPATH`` (on other nodes too, where the path is shared or
copied). Every worker rlix starts carries this path, whether rlix started its
Ray or joined one (``--address``, ``ray job submit``).

**The local cluster a run owns, without Ray's start-up notice.** A new local
cluster gets Ray's default security: token authentication is on (Ray writes a
token to ``~/.ray/auth_token`` if there is none) unless the user set
``RAY_AUTH_MODE``. Ray then logs, on every start, that it turned token
authentication on; for a cluster rlix starts and stops itself that notice
says nothing the user needs, so it is dropped (that one message, during that
one start). Nothing about authentication changes, and joining a cluster
(``--address``) keeps every message Ray prints.

Used by both shells (the simulator's sweeps on Ray, the executor's runs), so it
sits below both and imports neither.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_ON_NOTICE = "Token authentication is enabled for this Ray cluster"


def worker_pythonpath() -> str:
    """The directory above the ``rlix`` package this process imported, then this process's ``PYTHONPATH``."""
    import rlix

    root = str(Path(rlix.__file__).resolve().parent.parent)
    return os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)


class _DropAuthOnNotice(logging.Filter):
    """Drops Ray's 'token authentication is enabled' notice; keeps every other record (warnings it is off included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(AUTH_ON_NOTICE)


def init_local_ray(**kwargs) -> None:
    """``ray.init(**kwargs)`` for a new local cluster, minus Ray's notice that token auth is on.

    Always a new one (``address="local"``): a plain ``ray.init()`` joins a cluster that
    ``ray start`` runs on this machine, and then refuses the run's CPU and GPU counts."""
    import ray

    logger = logging.getLogger(AUTH_LOGGER)
    quiet = _DropAuthOnNotice()
    logger.addFilter(quiet)
    try:
        ray.init(address="local", **kwargs)
    finally:
        logger.removeFilter(quiet)
