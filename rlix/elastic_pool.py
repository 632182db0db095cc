"""An elastic rollout pool for a pipeline written outside rlix: its batch dealt out to whatever rollout
workers the scheduler gives it, as the scheduler expands and shrinks them.

The pipeline brings its own engine: ``start(gpus)`` starts a worker on the
GPUs of an expand (a Ray actor placed with :meth:`rlix.client.Client.actor_options`,
say), ``run(worker, item)`` plays one item of a batch on it (a coroutine),
and ``stop(worker)`` ends one. The pool does the rest:

- :meth:`expand` and :meth:`shrink` are the scheduler's calls, ready to be a
  :class:`rlix.endpoint.CallbackEndpoint`'s (:meth:`endpoint`);
- :meth:`play` deals a batch's items out, ``slots`` at a time per worker
  (one by default; an engine that batches, such as vLLM, takes more), and
  returns their results in the batch's order, whichever worker played each;
  it sends ``report(demand)`` whenever the demand changed;
- an item whose worker is shrunk goes back to the front of the queue; one
  whose worker died (``died``: Ray's ``RayActorError`` by default) too, and
  ``lost(first_gpu)`` tells the scheduler; any other error fails the batch;
- :meth:`demand` is the :class:`rlix.core.ReportDemand` the scheduler sizes
  the pipeline's workers from.

So a trajectory's outcome must depend on its item alone, never on the
worker that played it: then sharing never changes what a pipeline learns.
Every method runs in the pipeline's event loop. Nothing here imports the executor.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rlix.core import ReportDemand, WorkerLoad
from rlix.core.types import Gpus
from rlix.endpoint import CallbackEndpoint

REPORT_S = 0.25  # seconds between demand checks while a batch is played


class ElasticPool:
    """A batch's items dealt out to the pipeline's rollout workers, ``slots`` at a time each."""

    def __init__(
        self,
        pipeline_id: str,
        *,
        start: Callable[[Gpus], Any],
        run: Callable[[Any, Any], Awaitable[Any]],
        stop: Callable[[Any], Any] = lambda worker: None,
        lost: Callable[[int], Awaitable[None]] | None = None,
        died: tuple[type[BaseException], ...] | None = None,
        report_s: float = REPORT_S,
        slots: int = 1,
    ) -> None:
        if slots < 1:
            raise ValueError(f"ElasticPool: slots={slots}; a worker plays at least one item at a time")
        if died is None:
            from ray.exceptions import RayActorError

            died = (RayActorError,)
        self.pid, self.start, self.run, self.stop, self.lost = pipeline_id, start, run, stop, lost
        self.died, self.report_s, self.slots = died, report_s, slots
        self._workers: dict[Gpus, Any] = {}
        self._serving: dict[Gpus, list[asyncio.Task]] = {}  # worker -> one task per slot
        self._running: dict[tuple[Gpus, int], int] = {}  # (worker, slot) -> the index of the item it plays
        self._queue: list[int] = []  # indices of the batch's items not yet dealt out
        self._items: Sequence = ()
        self._results: dict[int, Any] = {}
        self.finished = 0  # items finished, all batches (reported: it ends the turn a starving pipeline got)
        self._batch = 0  # the number of the batch being played (an item's result counts for its own batch only)
        self._failure: BaseException | None = None
        self._changed = asyncio.Event()

    @property
    def workers(self) -> tuple[Gpus, ...]:
        """The bundles of the workers held now (what a rejoining :class:`rlix.client.Client` reports)."""
        return tuple(sorted(self._workers))

    def endpoint(self, stop: Callable[..., Awaitable[None]] | None = None) -> CallbackEndpoint:
        """The scheduler's calls answered by this pool; ``stop(why)``: the pipeline's own answer to a cancel."""
        return CallbackEndpoint(expand=self.expand, shrink=self.shrink, **({"stop": stop} if stop else {}))

    # ------------------------------------------------------------ the scheduler's calls

    async def expand(self, gpus: Gpus) -> None:
        """Start a worker on ``gpus``; it takes items as soon as a batch has some."""
        gpus = tuple(gpus)
        if gpus in self._workers:
            return  # it holds them already
        self._workers[gpus] = self.start(gpus)
        loop = asyncio.get_running_loop()
        self._serving[gpus] = [loop.create_task(self._serve(gpus, slot)) for slot in range(self.slots)]

    async def shrink(self, gpus: Gpus, reason: str = "") -> None:
        """Stop the worker on ``gpus`` (its items in flight go back to the queue); returns once it is gone."""
        tasks = self._serving.pop(tuple(gpus), None)
        if tasks is None:
            return  # it died meanwhile: nothing runs there
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _maybe(self.stop(self._workers.pop(tuple(gpus))))

    async def close(self) -> None:
        """Stop every worker (the pipeline is leaving)."""
        for gpus in self.workers:
            await self.shrink(gpus)

    # ------------------------------------------------------------ batches

    async def play(self, items: Sequence, report: Callable[[ReportDemand], Awaitable[None]] | None = None) -> list:
        """Each item's result, in the batch's order; ``report(demand)`` is sent whenever the demand changed.
        A batch cancelled or failed leaves nothing behind: what its workers still play is dropped."""
        self._items, self._queue, self._results, self._failure = items, list(range(len(items))), {}, None
        self._changed.set()
        played = asyncio.Event()
        reporter = asyncio.get_running_loop().create_task(self._report(report, len(items), played)) if report else None
        try:
            await self._until(lambda: len(self._results) == len(items) or self._failure is not None)
        finally:
            played.set()  # ends the reporter even where its cancel is lost (asyncio.wait_for before 3.12 can drop one)
            if reporter is not None:
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)
            self._batch += 1  # items of this batch still in flight are dropped when they end
            self._queue = []
        if self._failure is not None:
            raise self._failure
        return [self._results[i] for i in range(len(items))]

    def demand(self, batch_size: int, announce: int = 0) -> ReportDemand:
        """Items waiting (``announce``: those of a batch about to start), and the running ones per worker."""
        active = Counter(gpus for gpus, _ in self._running)
        loads = tuple(WorkerLoad(first_gpu=gpus[0], active=n) for gpus, n in sorted(active.items()))
        pending = len(self._queue) + announce
        return ReportDemand(pipeline_id=self.pid, pending=pending, loads=loads, batch_size=batch_size, finished=self.finished)

    # ------------------------------------------------------------ inside

    async def _serve(self, gpus: Gpus, slot: int) -> None:
        while True:
            await self._until(lambda: bool(self._queue))
            batch, idx = self._batch, self._queue.pop(0)
            self._running[(gpus, slot)] = idx
            try:
                result = await self.run(self._workers[gpus], self._items[idx])
            except asyncio.CancelledError:  # shrunk: played again by another worker (same outcome)
                self._again(batch, idx)
                raise
            except self.died:  # its process died: likewise, and the scheduler is told
                self._again(batch, idx)
                self._running.pop((gpus, slot))  # its load ends now, not once the scheduler has heard
                self._changed.set()
                return await self._gone(gpus)
            except Exception as exc:  # noqa: BLE001 -- not a dead worker: its batch fails
                if batch == self._batch:
                    self._failure = exc
            else:
                if batch == self._batch:
                    self._results[idx] = result
                    self.finished += 1
            finally:
                self._running.pop((gpus, slot), None)
                self._changed.set()

    def _again(self, batch: int, idx: int) -> None:
        """Item ``idx`` goes back to the front of the queue, if its batch is still being played."""
        if batch == self._batch:
            self._queue.insert(0, idx)

    async def _gone(self, gpus: Gpus) -> None:
        """The worker on ``gpus`` died: its other slots stop (their items go back) and the scheduler is told, once."""
        me = asyncio.current_task()
        for task in self._serving.pop(gpus, ()):
            if task is not me:
                task.cancel()
        if self._workers.pop(gpus, None) is None:
            return  # another slot of it saw it die first
        if self.lost is not None:
            try:
                await self.lost(gpus[0])
            except Exception as exc:  # noqa: BLE001 -- the scheduler was not told: the batch fails, and says why
                self._failure = exc
                self._changed.set()

    async def _report(self, report: Callable[[ReportDemand], Awaitable[None]], size: int, played: asyncio.Event) -> None:
        last = None
        while not played.is_set():
            now = self.demand(size)
            if now != last:
                await report(now)
                last = now
            await asyncio.sleep(self.report_s)

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._changed.clear()
            await self._changed.wait()


async def _maybe(value) -> None:
    """Await ``value`` if it is awaitable (a ``stop`` may be a plain function or a coroutine function)."""
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        await value
