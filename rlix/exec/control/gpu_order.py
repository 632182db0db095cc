"""Executor layer: carrying out plans in order per GPU, not for the whole cluster at once.

Each action of a plan (a shrink, a grant, an expand) touches a set of GPUs.
It may start once every earlier action on any of those GPUs has *handed the
GPUs on*: a shrink when its worker has let them go (the call returned), a
grant at once, an expand once its call is sent (the worker may take its time
to wake; a later shrink of it goes to the same coordinator, which waits for
the wake or cancels it). Actions on other GPUs never wait: a worker slow to
shrink on GPUs 0-1 delays no grant or expand on GPUs 2-3, while a grant on
GPU 0 still waits for the shrink that frees GPU 0.

Pure asyncio, no Ray: the scheduler actor owns one and feeds it each plan in
the order the core made them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable

# An action runs once the GPUs are handed to it; it returns when it hands them on, with what
# is left of its work (awaited after that, off the GPUs' order), or None.
Action = Callable[[], Awaitable[Awaitable[None] | None]]


class GpuOrder:
    """Runs actions in order per GPU; keeps a reference to every task it starts until it ends."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.on_error = on_error  # a bug in an action is reported, never raised into the event loop
        self.last: dict[int, asyncio.Future] = {}  # GPU -> hand-on of the latest action queued on it
        self.tasks: set[asyncio.Task] = set()

    def after(self, gpus: Iterable[int], action: Action) -> asyncio.Future:
        """Queue ``action`` behind the earlier actions on ``gpus``; returns a future done once it hands them on."""
        loop = asyncio.get_running_loop()
        gpus = tuple(gpus)
        before = {id(f): f for g in gpus if (f := self.last.get(g)) is not None and not f.done()}
        handed = loop.create_future()
        for g in gpus:
            self.last[g] = handed
        self.spawn(self._run(tuple(before.values()), action, handed))
        return handed

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """Run ``coro`` in the background, referenced until it ends (so it is neither lost nor left running at
        stop); what it raises goes to ``on_error``."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        """A background task ended: forgotten, and what it raised reported (never lost to the event loop's log)."""
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.on_error(exc)

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    async def _run(self, before: tuple[asyncio.Future, ...], action: Action, handed: asyncio.Future) -> None:
        rest = None
        try:
            if before:
                await asyncio.wait(before)
            rest = await action()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- one failed action must not hold its GPUs' queue forever
            self.on_error(exc)
        finally:
            if not handed.done():
                handed.set_result(None)
        if rest is not None:
            try:
                await rest
            except Exception as exc:  # noqa: BLE001
                self.on_error(exc)
