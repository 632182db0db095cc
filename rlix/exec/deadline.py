"""Executor layer: a deadline on every call to another process.

A worker, trainer or scheduler call that never returns must not hold its
caller forever: each is awaited with a deadline, and missing it raises
:class:`WorkerTimeout`, which the caller treats as the callee being gone.
"""

from __future__ import annotations

import asyncio


class WorkerTimeout(RuntimeError):
    """A call to another process missed its deadline."""


async def call(ref, timeout_s: float, what: str):
    """Await a remote call (a Ray object ref, or any awaitable) with a deadline of ``timeout_s`` seconds.

    Raises :class:`WorkerTimeout` naming ``what`` when the deadline passes.
    """
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except asyncio.TimeoutError:
        raise WorkerTimeout(f"{what} took longer than {timeout_s:g} s") from None
