"""Executor layer: gang-stage requests waiting for their grant, in the scheduler service.

A pipeline's ``request`` call returns once a plan grants its stage. Each
request is one future, keyed by pipeline and stage, that every caller of it
awaits: a retry (or a caller that gave up and asks again) waits on the first
request rather than losing its grant, and a refusal reaches them all.
"""

from __future__ import annotations

import asyncio

from rlix.core import Grant, SchedulingError, Stage
from rlix.protocol import GrantReply

Key = tuple[str, Stage]  # (pipeline, stage)


class StageRequests:
    """The requests not granted yet: each one's future and when it was asked (what its grant says it queued)."""

    def __init__(self) -> None:
        self.waiting: dict[Key, tuple[asyncio.Future, float]] = {}

    def asked(self, key: Key) -> asyncio.Future | None:
        """The future of the request for ``key`` waiting now, if any."""
        entry = self.waiting.get(key)
        return None if entry is None else entry[0]

    def stages_of(self, pipeline_id: str) -> list[Stage]:
        """The stages ``pipeline_id`` waits for, in a fixed order."""
        return sorted((stage for pid, stage in self.waiting if pid == pipeline_id), key=lambda s: s.value)

    def open(self, key: Key, now: float) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[key] = (fut, now)
        return fut

    def refused(self, key: Key, fut: asyncio.Future, exc: BaseException) -> None:
        """The request ``fut`` answers was refused (or its caller stopped): whoever waits on it hears why."""
        if self.asked(key) is fut:
            del self.waiting[key]
        if not fut.done():
            fut.set_exception(exc if isinstance(exc, Exception) else SchedulingError(f"request for {key[1].value} stopped"))
            fut.exception()  # retrieved here: a lone caller's own raise says it

    def granted(self, grant: Grant, now: float) -> None:
        entry = self.waiting.pop((grant.pipeline_id, grant.stage), None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(GrantReply(gpus=grant.gpus, queued_s=now - entry[1]))

    def fail(self, pipeline_id: str) -> None:
        """The requests ``pipeline_id`` still waits on fail: it was unregistered meanwhile."""
        for key in [k for k in self.waiting if k[0] == pipeline_id]:
            fut, _ = self.waiting.pop(key)
            if not fut.done():
                fut.set_exception(SchedulingError(f"pipeline '{pipeline_id}' was unregistered while waiting"))
