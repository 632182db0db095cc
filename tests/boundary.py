"""Stand-ins at the process boundary, for tests that run rlix's parts in one process without Ray:
a remote method, an actor handle, and the transport to a scheduler actor."""

from __future__ import annotations

import asyncio


class Remote:
    """A remote method: ``.remote(...)`` starts the call and gives an awaitable, as a Ray object ref does."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args, **kwargs):
        return asyncio.ensure_future(self.fn(*args, **kwargs))


class Handle:
    """An actor handle on an object in this process: every async method is callable as ``.remote``."""

    def __init__(self, obj) -> None:
        self.obj = obj

    def __getattr__(self, name):
        return Remote(getattr(self.obj, name))


class InProcessTransport:
    """The transport to a scheduler actor in this process: a request is handled by the actor's one call,
    stamped with this protocol version."""

    def __init__(self, actor) -> None:
        self.actor = actor

    async def call(self, request, timeout_s=None):
        from rlix.protocol import PROTOCOL_VERSION

        reply = self.actor.handle(request, PROTOCOL_VERSION)
        return await (reply if timeout_s is None else asyncio.wait_for(reply, timeout_s))
