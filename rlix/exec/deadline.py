"""Executor layer: a deadline on every call to another process.

A worker, trainer or scheduler call that never returns must not hold its
caller forever: each is awaited with a deadline, and missing it raises
:class:`WorkerTimeout`, which the caller treats as the callee being gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable


class WorkerTimeout(RuntimeError):
    """A call to another process missed its deadline."""


class Interrupted(Exception):
    """The person running the job asked to stop (Ctrl-C) while it was waited for."""


def wait_result(fut: concurrent.futures.Future, timeout_s: float, stop: Callable[[], bool] | None = None, every_s: float = 0.2):
    """``fut.result()`` within ``timeout_s`` (:class:`concurrent.futures.TimeoutError` past it), or
    :class:`Interrupted` as soon as ``stop()`` says so (asked every ``every_s``)."""
    if stop is None:
        return fut.result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        if stop():
            raise Interrupted
        try:
            return fut.result(timeout=max(min(every_s, deadline - time.monotonic()), 0.0))
        except concurrent.futures.TimeoutError:
            if fut.done() or time.monotonic() >= deadline:  # done: what it raised was a TimeoutError of its own
                raise


async def call(ref, timeout_s: float, what: str):
    """Await a remote call (a Ray object ref, or any awaitable) with a deadline of ``timeout_s`` seconds.

    Raises :class:`WorkerTimeout` naming ``what`` when the deadline passes.
    """
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except asyncio.TimeoutError:
        raise WorkerTimeout(f"{what} took longer than {timeout_s:g} s") from None


def on_daemon_thread(fn: Callable[[], object], name: str) -> concurrent.futures.Future:
    """Start ``fn()`` on a daemon thread of its own and return its future, to wait on with a deadline
    (``.result(timeout)``, or ``asyncio.wrap_future``): a call of the user's code that never returns then
    holds neither its caller past the deadline nor the process at exit, as a pool's thread would."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 -- raised again where the future is awaited
            fut.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut
