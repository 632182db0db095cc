"""Executor layer: the endpoints of the pipelines registered with the scheduler service.

An endpoint (:class:`rlix.protocol.Endpoint`, a Ray actor) is what the
service calls back: ``expand``, ``shrink`` and ``stop``, and whether it is
alive at all. :class:`Endpoints` keeps which one answers for each pipeline
and makes those calls, each within its deadline; what to do when one fails
(drop the pipeline, plan again) is the actor's
(:mod:`rlix.exec.service.scheduler_actor`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable
from typing import Any

import ray

from rlix.core import SchedulingError
from rlix.protocol import Stopped

LIVENESS_DEADLINE_S = 10.0  # an endpoint that does not answer within this is gone (s)
CALLS = ("expand", "shrink", "stop")  # what the scheduler calls on a pipeline's endpoint (rlix.protocol.Endpoint)


def check_endpoint(endpoint, pipeline_id: str) -> None:
    """Refuse, as a pipeline registers, an endpoint the scheduler could not call back: every other job's
    liveness checks and plans go through the same calls."""
    missing = [name for name in CALLS if getattr(endpoint, name, None) is None]
    if missing:
        raise SchedulingError(
            f"pipeline '{pipeline_id}': its endpoint has no {', '.join(missing)}; register a Ray actor with "
            "async expand, shrink and stop (rlix.protocol.Endpoint), or a rlix.client.CallbackEndpoint"
        )


def same_actor(a, b) -> bool:
    """Whether two Ray actor handles name one actor (two objects that are not handles: whether they are one)."""
    return a is not None and b is not None and getattr(a, "_actor_id", a) == getattr(b, "_actor_id", b)


def kill_actor(handle) -> None:
    """Kill an actor (and what it owns), once and for all; quiet if it is gone already. Nothing else is
    handed to Ray: ``ray.kill`` would start a local Ray instance in a process that has none."""
    if not isinstance(handle, ray.actor.ActorHandle):
        return
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 -- already dead
        pass


class Endpoints:
    """Each registered pipeline's endpoint, and which of them may be killed; the calls made on them.

    A call that fails in a way that says nothing of the pipeline (an odd liveness answer, a cancel that
    could not be sent) is kept in ``errors``, the service's recent errors, and drops nobody.
    """

    def __init__(self, call_timeout_s: float, errors: collections.deque[str]) -> None:
        self.call_timeout_s = call_timeout_s  # deadline of a shrink or an expand (s)
        self.errors = errors
        self.of: dict[str, Any] = {}  # pipeline -> its endpoint
        self.unkillable: set[str] = set()  # pipelines whose endpoint owns none of their processes (callback inboxes)

    def joined(self, pipeline_id: str, endpoint, owns: bool) -> None:
        """``owns``: killing the endpoint ends the pipeline's processes (:class:`rlix.protocol.Register`)."""
        self.of[pipeline_id] = endpoint
        if not owns:
            self.unkillable.add(pipeline_id)

    def left(self, pipeline_id: str) -> None:
        self.of.pop(pipeline_id, None)
        self.unkillable.discard(pipeline_id)

    def registered_by(self, pipeline_id: str, endpoint) -> bool:
        """Whether ``endpoint`` is the one registered for the pipeline now."""
        return same_actor(self.of.get(pipeline_id), endpoint)

    def kill(self, pipeline_id: str) -> None:
        """Kill the pipeline's endpoint, with the processes it owns (none to kill: nothing happens)."""
        kill_actor(self.of.get(pipeline_id))

    async def shrink(self, pipeline_id: str, gpus: tuple[int, ...], reason: str) -> bool:
        """Ask the pipeline to let ``gpus`` go; False if it did not within the deadline (it died or hung).
        A pipeline gone already has nothing running there: True."""
        endpoint = self.of.get(pipeline_id)
        if endpoint is None:
            return True
        try:
            await asyncio.wait_for(endpoint.shrink.remote(gpus, reason), self.call_timeout_s)
        except Exception:  # noqa: BLE001 -- its GPUs are freed by dropping the pipeline
            return False
        return True

    def expand(self, pipeline_id: str, gpus: tuple[int, ...]) -> Awaitable | None:
        """Send an expand at once; returns its answer, to await (it raises if the pipeline did not answer
        within the deadline), or None if the pipeline is gone already."""
        endpoint = self.of.get(pipeline_id)
        if endpoint is None:
            return None
        return asyncio.wait_for(endpoint.expand.remote(gpus), self.call_timeout_s)

    def stop(self, pipeline_id: str, why: Stopped) -> None:
        """Tell the pipeline to stop (sent, not awaited: whether it obeys shows in whether it leaves)."""
        try:
            self.of[pipeline_id].stop.remote(why)
        except Exception as exc:  # noqa: BLE001 -- a job that did not hear its cancel is killed at the grace's end
            self.errors.append(f"cancel of '{pipeline_id}' not delivered: {type(exc).__name__}: {exc}")

    async def silent(self) -> list[str]:
        """The pipelines whose endpoint is gone: a dead one fails at once, a hung one within ``LIVENESS_DEADLINE_S``."""
        endpoints = list(self.of.items())
        answers = await asyncio.gather(*(self._answers(e) for _, e in endpoints))
        return [pid for (pid, _), alive in zip(endpoints, answers) if not alive]

    async def _answers(self, endpoint) -> bool:
        """Whether an endpoint is alive. Any failure of the check but death or silence is recorded and the
        endpoint taken as alive: one job's odd answer never stops the checks of the others, nor drops a
        job on a guess."""
        from ray.exceptions import RayActorError

        try:
            await asyncio.wait_for(endpoint.__ray_ready__.remote(), LIVENESS_DEADLINE_S)
        except (RayActorError, asyncio.TimeoutError):
            return False
        except Exception as exc:  # noqa: BLE001 -- recorded; the next round asks again
            self.errors.append(f"liveness check failed: {type(exc).__name__}: {exc}")
        return True
