"""Executor layer: start the local Ray cluster a run owns, without Ray's start-up notice.

A new local cluster gets Ray's default security: token authentication is on
(Ray writes a token to ``~/.ray/auth_token`` if there is none) unless the user
set ``RAY_AUTH_MODE``. Ray then logs, on every start, that it turned token
authentication on; for a cluster rlix starts and stops itself that notice says
nothing the user needs, so it is dropped (that one message, during that one
start). Nothing about authentication changes, and joining a cluster
(``--address``) keeps every message Ray prints.
"""

from __future__ import annotations

import logging

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_ON_NOTICE = "Token authentication is enabled for this Ray cluster"


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
