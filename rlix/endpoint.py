"""A ready-made endpoint: the scheduler's calls to a pipeline, answered by three coroutines of the
pipeline's own process, with no Ray actor class of the pipeline's to write.

    endpoint = CallbackEndpoint(expand=start_worker, shrink=stop_worker, stop=end_run)
    await client.register(spec, endpoint)    # the client starts it, and closes it at unregister

The scheduler calls Ray actors, so the endpoint is one: a small inbox actor
(no CPU, owned by the pipeline's process, so it dies with it and the
scheduler's liveness check sees the pipeline gone). Each call the scheduler
makes waits in the inbox until the pipeline's process has run the matching
coroutine, and returns its outcome: a ``shrink`` returns only once the
pipeline's ``shrink`` did, so the GPUs are free when the scheduler hands them
on. Calls run concurrently, as on an actor of the pipeline's own.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable

from rlix.core.types import Gpus
from rlix.protocol import Stopped


class EndpointCallFailed(RuntimeError):
    """The pipeline's coroutine for a scheduler call raised (its type and message)."""


class Inbox:
    """The actor the scheduler calls (:class:`rlix.protocol.Endpoint`): each call queued for the pipeline's
    process, answered once that process reports its coroutine done."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue = asyncio.Queue()
        self.answers: dict[int, asyncio.Future] = {}
        self.numbers = itertools.count()

    async def expand(self, gpus: Gpus) -> None:
        await self._ask("expand", (tuple(gpus),))

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        await self._ask("shrink", (tuple(gpus), reason))

    async def stop(self, why: Stopped | None = None) -> None:
        await self._ask("stop", (why,))

    async def next_call(self) -> tuple[int, str, tuple]:
        """The oldest call not yet taken by the pipeline's process: (number, method, arguments)."""
        return await self.calls.get()

    async def answer(self, number: int, error: str = "") -> None:
        """The pipeline ran call ``number``; ``error``: what its coroutine raised ("": nothing)."""
        fut = self.answers.pop(number, None)
        if fut is not None and not fut.done():
            fut.set_exception(EndpointCallFailed(error)) if error else fut.set_result(None)

    async def _ask(self, method: str, args: tuple) -> None:
        number = next(self.numbers)
        fut = self.answers[number] = asyncio.get_running_loop().create_future()
        self.calls.put_nowait((number, method, args))
        await fut


@functools.cache
def _inbox_actor():
    import ray

    return ray.remote(num_cpus=0, max_concurrency=1000)(Inbox)


async def _nothing(why: Stopped | None) -> None:
    return None


class CallbackEndpoint:
    """An endpoint made of the pipeline's coroutines: ``expand(gpus)``, ``shrink(gpus, reason)`` and
    ``stop(why)`` (``why``: a :class:`rlix.protocol.Stopped`, who asked; default: nothing, and the
    pipeline learns of a cancel when its next call fails)."""

    def __init__(
        self,
        *,
        expand: Callable[[Gpus], Awaitable[None]],
        shrink: Callable[[Gpus, str], Awaitable[None]],
        stop: Callable[[Stopped | None], Awaitable[None]] = _nothing,
    ) -> None:
        self.callbacks = {"expand": expand, "shrink": shrink, "stop": stop}
        self.actor = None  # the inbox actor's handle, once started
        self._serving: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    async def start(self):
        """Start the inbox actor and serve its calls from this event loop; returns the actor's handle."""

        if self.actor is None:
            self.actor = _inbox_actor().remote()
            await self.actor.__ray_ready__.remote()
            self._serving = asyncio.get_running_loop().create_task(self._serve())
        return self.actor

    async def close(self) -> None:
        """Stop serving, and the inbox actor with it."""
        import ray

        me = asyncio.current_task()  # a stop() that unregisters closes the endpoint from one of its own calls
        if self._serving is not None:
            self._serving.cancel()
        for task in list(self._running):
            if task is not me:
                task.cancel()
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self.actor = self._serving = None

    async def _serve(self) -> None:
        while True:
            number, method, args = await self.actor.next_call.remote()
            task = asyncio.get_running_loop().create_task(self._run(number, method, args))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, number: int, method: str, args: tuple) -> None:
        error = ""
        try:
            await self.callbacks[method](*args)
        except Exception as exc:  # noqa: BLE001 -- the scheduler is told, as an actor's call would fail
            error = f"{type(exc).__name__}: {exc}"
        await self.actor.answer.remote(number, error)
