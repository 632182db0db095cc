"""The rlix client library: how a pipeline speaks with the cluster's rlix scheduler.

rlix's own job coordinator is built on it, and so can a pipeline written
outside rlix (its own loop, its own rollout engine). The protocol:

1. ``sched = connect()`` finds the cluster's scheduler service (a named Ray
   actor; ``rlix scheduler start`` or the first ``rlix-run --address`` starts it)
   and returns the transport to it (:class:`rlix.transport.RayTransport`).
2. ``client = Client(sched, "my-job", workers=...)``; ``await client.register(spec, endpoint)``
   registers the pipeline's GPU topology (a :class:`rlix.core.PipelineSpec`;
   its ``open_limit``, the most trajectories the pipeline can have open at once,
   ``total_trajectories``, those of all its steps, and ``batch_credit``, its
   batches open one after another, bound the demand the scheduler weighs:
   0 and False leave them undeclared; ``batch_credit`` needs an accurate
   ``finished`` in the reports, or new batches are credited only at releases)
   and the *endpoint* (:class:`rlix.protocol.Endpoint`): a Ray actor of the
   pipeline that the scheduler calls with three async methods, ``expand(gpus)``
   (start a rollout worker on these GPUs), ``shrink(gpus, reason)`` (stop the
   one there; return once its GPUs are free) and ``stop()`` (the job was
   cancelled: end the run). :class:`CallbackEndpoint` makes one of three
   coroutines of the pipeline's own process, with no actor class to write.
3. Gang stages: ``gpus = await client.request(Stage.ACTOR_TRAIN)`` waits until a
   plan grants the stage; ``await client.release(stage)`` gives it back.
   ``request(next, after=held)`` is a hand-over: ``held`` is released and
   ``next`` asked for in one plan, so no other job slips in between.
4. ``await client.report(ReportDemand(...))`` says how many trajectories wait
   (the scheduler sizes the pipeline's rollout workers from it) and how many
   finished so far (``finished``: a worker given to the pipeline after it
   starved is kept from other starving jobs until one more finishes, or for
   ``turn_limit_s``; a pipeline that leaves it at 0 keeps such turns that long);
   ``client.lost(first_gpu)`` reports a rollout worker that died;
   ``client.note(...)`` reports progress for ``rlix status``.
5. ``await client.unregister("finished")`` at the end (or failed, cancelled):
   every GPU it holds goes back.

A pipeline that starts its own actors on the GPUs an expand or a grant gave
it places them with ``client.actor_options(gpus)`` (:mod:`rlix.bundles`); its
rollout workers can be an :class:`rlix.elastic_pool.ElasticPool`; a loop that
is not asyncio makes the same calls through :class:`BlockingClient`.

A scheduler that restarts (its actor killed, its node lost) forgets its
pipelines. The client notices (a call fails, or its keep-alive does) and
rejoins: it registers again with what it holds (the gang stages it was
granted, its rollout workers from ``workers()``, its last demand), then
retries the call. Until the scheduler is back, the pipeline keeps what it
holds and waits. All calls are coroutines; run them in one event loop.

Every call is a request of :mod:`rlix.protocol`, stamped with its version;
:class:`Service` makes the submitter's and operator's calls (blocking), as
the ``rlix`` tool and ``rlix-run`` do. Importing this module loads no part of
rlix's executor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError

from rlix import protocol
from rlix.bundles import bundle_options
from rlix.core import ClusterSpec, Rejoin, ReportDemand, Role, SchedulingError, Stage, WorkerLost
from rlix.core.types import Gpus, PipelineSpec
from rlix.endpoint import CallbackEndpoint
from rlix.protocol import PipelineGone, PipelineUnknown
from rlix.transport import RayTransport, find, join, joined_elsewhere

__all__ = ["BlockingClient", "CallbackEndpoint", "Client", "SchedulerGone", "connect"]

RESTART_WAIT_S = 120.0  # how long a client waits for a restarting scheduler before giving up
KEEPALIVE_S = 1.0  # seconds between keep-alive calls: how soon a restart is noticed


class SchedulerGone(RuntimeError):
    """The scheduler did not come back (stopped, or restarting for longer than ``RESTART_WAIT_S``)."""


def connect(address: str | None = None, *, where: str = "address") -> RayTransport:
    """The transport to the cluster's scheduler service; joins Ray at ``address`` (default:
    ``RAY_ADDRESS``, else ``auto``) first if not joined; joined already, ``address`` must be that cluster's.
    ``where``: what the errors call the address.

    Raises :class:`rlix.transport.ClusterError` (one line) if no Ray cluster answers
    there, and :class:`SchedulerGone` if no scheduler service runs on it.
    """
    import os

    import ray

    if not ray.is_initialized():
        join(address or os.environ.get("RAY_ADDRESS") or "auto", 0, where, quiet=True)
    elif address is not None:
        joined_elsewhere(address, where)
    service = find()
    if service is None:
        raise SchedulerGone("no rlix scheduler runs on this Ray cluster; start one with 'rlix scheduler start'")
    return service


class Client:
    """One pipeline's calls to the scheduler, surviving the scheduler's restarts.

    ``workers``: returns the bundles (GPU tuples) of the rollout workers the
    pipeline holds now (asked only when rejoining a restarted scheduler).
    ``timeout_s``: the deadline of every call except a gang request, which
    waits for GPUs as long as the plan needs. ``on_gone``: called once if the
    scheduler dropped the pipeline (cancelled, unreachable, its holdings refused
    after a restart) or did not come back. ``submitter``: the ``rlix-run``
    submission that claimed the job's name ("" for a pipeline that claimed none).
    """

    def __init__(
        self,
        scheduler: RayTransport,
        pipeline_id: str,
        *,
        workers: Callable[[], tuple[Gpus, ...]] = tuple,
        timeout_s: float = 60.0,
        keepalive_s: float = KEEPALIVE_S,
        on_gone: Callable[[BaseException], None] | None = None,
        submitter: str = "",
    ) -> None:
        self.sched = scheduler
        self.submitter = submitter  # the rlix-run that claimed the job's name ("" for none)
        self.pipeline_id = pipeline_id
        self.workers = workers
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s  # seconds between keep-alive calls (how soon a restart is noticed)
        self.on_gone = on_gone  # called if the keep-alive finds the pipeline unregistered or the scheduler gone
        self.held: dict[Stage, Gpus] = {}  # gang stages granted and not released
        self.rejoins = 0  # times this pipeline rejoined a restarted scheduler
        self.admitted = False  # it was granted GPUs once (its home stays taken under a partitioning policy)
        self.info: protocol.ServiceInfo | None = None  # what the scheduler manages, once registered
        self._spec: PipelineSpec | None = None
        self._endpoint = None
        self._callbacks: CallbackEndpoint | None = None  # a ready-made endpoint the client started
        self._owns = True  # killing its endpoint ends the pipeline's processes (Register.endpoint_owns)
        self._demand: ReportDemand | None = None
        self._note = None  # the latest progress note (sent again after a rejoin)
        self._life = ""  # the id of the scheduler's life this pipeline last (re)joined
        self._keepalive: asyncio.Task | None = None
        self._rejoining: asyncio.Lock | None = None
        self._joined = False  # the scheduler accepted its registration (a refused one has nothing to rejoin with)

    # ------------------------------------------------------------ the protocol

    async def register(self, spec: PipelineSpec, endpoint, *, owns: bool | None = None) -> None:
        """Register the pipeline's topology and its endpoint (an actor, or a :class:`CallbackEndpoint`,
        started here and closed at :meth:`unregister`); starts the keep-alive. ``owns``: killing the
        endpoint ends the pipeline's processes (default: an actor does, a callback endpoint does not)."""
        if isinstance(endpoint, CallbackEndpoint):
            self._callbacks, endpoint = endpoint, await endpoint.start()
        self._spec, self._endpoint = spec, endpoint
        self._rejoining = asyncio.Lock()
        self.info = await self.sched.call(protocol.Info(), self.timeout_s)
        self._life = self.info.life
        self._owns = self._callbacks is None if owns is None else owns  # a callback inbox owns none of its processes
        hello = protocol.Register(
            spec=spec, endpoint=endpoint, submitter=self.submitter, user=protocol.asker(), endpoint_owns=self._owns
        )
        await self._call(hello, again=None)
        self._joined = True
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    def actor_options(self, gpus: Gpus, env: dict[str, str] | None = None) -> dict:
        """Ray's ``.options(...)`` for one of the pipeline's own actors on ``gpus`` (an expand's or a grant's):
        placed in the bundle rlix reserved for their first GPU, asking Ray for none, seeing exactly their
        devices (:mod:`rlix.bundles`); ``env``: more environment variables. After :meth:`register`."""
        if self.info is None:
            raise RuntimeError(f"pipeline '{self.pipeline_id}': actor_options needs the scheduler's answer; register first")
        cluster = ClusterSpec(nodes=self.info.nodes, gpus_per_node=self.info.gpus_per_node)
        return bundle_options(cluster, gpus, self.info.gpus, name=self.pipeline_id, env=env)

    async def rollout_bundles(self) -> tuple[Gpus, ...]:
        """The bundles the policy may ever give this pipeline's rollout workers (to start them early)."""
        return await self._call(protocol.RolloutBundles(pipeline_id=self.pipeline_id))

    async def request(self, stage: Stage, role: Role | None = None, *, after: Stage | None = None):
        """Ask for ``stage``'s gang on ``role``'s GPUs (None: the stage's default role, or the model
        load's GPUs for INIT); returns the :class:`rlix.protocol.GrantReply` once granted.
        ``after``: a held stage released in the same plan (a hand-over)."""
        if after is not None:
            self.held.pop(after)
        ask = protocol.RequestGang(pipeline_id=self.pipeline_id, stage=stage, role=role, after=after)
        # After a rejoin the new scheduler never knew ``after`` (it is no longer held): a plain request.
        reply = await self._call(ask, wait=True, again=dataclasses.replace(ask, after=None))
        self.held[stage] = reply.gpus
        self.admitted = True
        return reply

    async def release(self, stage: Stage, report: ReportDemand | None = None) -> None:
        """Give ``stage``'s GPUs back; ``report``: the demand from now on, planned with the release."""
        self.held.pop(stage)
        if report is not None:
            self._demand = report
        # After a rejoin the stage is already free (the pipeline rejoined without it); only the demand is news.
        again = protocol.Report(demand=report) if report is not None else None
        await self._call(protocol.ReleaseGang(pipeline_id=self.pipeline_id, stage=stage, demand=report), again=again)

    async def report(self, report: ReportDemand) -> None:
        self._demand = report
        await self._call(protocol.Report(demand=report))

    async def lost(self, first_gpu: int, failed: bool = True) -> None:
        """A rollout worker of the pipeline is gone without a plan's shrink: its GPUs are free. ``failed``:
        it died or did not wake (no worker of the pipeline goes there for ``lost_cooldown_s``)."""
        await self._call(protocol.Lost(event=WorkerLost(pipeline_id=self.pipeline_id, first_gpu=first_gpu, failed=failed)))

    async def note(self, note: protocol.JobNote) -> None:
        """Progress for ``rlix status``."""
        self._note = note
        await self._call(protocol.Note(note=note))

    async def unregister(self, status: protocol.Outcome | str = "finished", error: str = "") -> None:
        """Leave, saying how the job ended (finished, failed or cancelled): every GPU the pipeline holds
        goes back (its rollout workers are shrunk first). A word that is none of the three is refused, once
        the pipeline has left as failed: a typo never keeps GPUs held. The leave carries the endpoint it
        registered with: a registration refused (the name another job's) ends nothing."""
        try:
            outcome = protocol.Outcome.of(status)
        except ValueError as exc:
            try:
                await self.unregister(protocol.Outcome.FAILED, f"{error} (it left saying '{status}')".lstrip())
            except Exception as gone:  # noqa: BLE001 -- the typo is what the caller must hear; why leaving failed goes with it
                raise ValueError(f"{exc} (and leaving as failed raised {type(gone).__name__}: {gone})") from None
            raise exc from None
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.held.clear()
        try:
            # Sent whatever became of the registration (its reply may have been lost): one refused, or
            # another run's under the name, is not this endpoint's, and the scheduler ends nothing then.
            gone = protocol.Unregister(pipeline_id=self.pipeline_id, status=outcome, error=error, endpoint=self._endpoint)
            try:
                await self.sched.call(gone, self.timeout_s)
            except PipelineUnknown:  # a restarted scheduler it has not rejoined yet: it rejoins, then leaves
                if not self._joined:  # refused (the name another job's) or never sent: it has nothing to end
                    return
                try:
                    await self._rejoin()
                except PipelineGone:  # told it was dropped: it still holds its GPUs if the scheduler took them back
                    if not await self.sched.call(protocol.Knows(pipeline_id=self.pipeline_id), self.timeout_s):
                        raise
                await self.sched.call(gone, self.timeout_s)
        finally:
            if self._callbacks is not None:  # its workers are shrunk (or the scheduler is gone): nothing calls it any more
                await self._callbacks.close()

    # ------------------------------------------------------------ restarts

    async def _call(self, request: protocol.PipelineCall, *, wait: bool = False, again=True):
        """Send ``request``; if the scheduler restarted meanwhile, rejoin and send again.

        ``again``: what to send after a rejoin: True the same, None nothing,
        or another request (the pipeline's state already moved on).
        """
        from ray.exceptions import RayActorError

        while True:
            life = self._life  # the scheduler's life the call is sent to
            try:
                return await self.sched.call(request, None if wait else self.timeout_s)
            except PipelineUnknown:
                if self._spec is None:  # never registered: nothing to rejoin with
                    raise
                await self._rejoin()
            except RayActorError:  # died under the call: Ray restarts it, and the call is asked again
                if not await self._restarted(life):
                    raise  # unreachable for a moment, not restarted: the call may have run; not guessed at
                await self._rejoin()
            if again is None:
                return None
            if again is not True:
                request, again = again, True

    async def _restarted(self, life: str) -> bool:
        """Wait for the scheduler's actor to answer again; whether it has restarted since its life
        ``life`` (:class:`SchedulerGone` after ``RESTART_WAIT_S``)."""
        from ray.exceptions import RayActorError

        loop = asyncio.get_running_loop()
        give_up = loop.time() + RESTART_WAIT_S
        while True:
            try:
                info = await self.sched.call(protocol.Info(), self.timeout_s)
                return info.life != life
            except (RayActorError, asyncio.TimeoutError):
                if loop.time() > give_up:
                    raise SchedulerGone(f"the rlix scheduler did not come back within {RESTART_WAIT_S:g} s") from None
                await asyncio.sleep(0.5)

    async def _rejoin(self) -> None:
        """Register again with what the pipeline holds (once, however many calls noticed the restart)."""
        async with self._rejoining:
            if await self.sched.call(protocol.Knows(pipeline_id=self.pipeline_id), self.timeout_s):
                return  # another call rejoined meanwhile
            event = Rejoin(
                spec=self._spec,
                gangs=tuple(sorted(self.held.items(), key=lambda kv: kv[0].value)),
                workers=tuple(sorted(self.workers())),
                demand=self._demand,
                admitted=self.admitted,
            )
            try:
                owns = self._owns
                back = protocol.RejoinPipeline(event=event, endpoint=self._endpoint, user=protocol.asker(), endpoint_owns=owns)
                await self.sched.call(back, self.timeout_s)
            except (SchedulingError, PipelineGone) as exc:  # its holdings clash with the new ledger: it must stop
                raise PipelineGone(f"the restarted rlix scheduler refused pipeline '{self.pipeline_id}': {exc}") from None
            self.info = await self.sched.call(protocol.Info(), self.timeout_s)
            self._life = self.info.life
            self.rejoins += 1
            if self._note is not None:  # the restarted scheduler lost what the pipeline said of its progress
                await self.sched.call(protocol.Note(note=self._note), self.timeout_s)

    async def _keep_alive(self) -> None:
        """Ask every ``keepalive_s`` whether the scheduler still knows the pipeline (rejoins if not)."""
        while True:
            await asyncio.sleep(self.keepalive_s)
            try:
                await self._call(protocol.Alive(pipeline_id=self.pipeline_id))
            except (PipelineGone, SchedulerGone) as exc:
                if self.on_gone is not None:
                    self.on_gone(exc)
                return
            except Exception:  # noqa: BLE001 -- a slow or refused call: the next keep-alive tries again
                continue


class BlockingClient:
    """A :class:`Client` for a pipeline whose loop is not asyncio (a plain training loop, a trainer's
    callbacks): each call blocks until its reply. The client's event loop runs on a thread of its own
    (:attr:`loop`), and with it the keep-alive and a :class:`CallbackEndpoint`'s coroutines, so the
    scheduler's ``expand`` and ``shrink`` are answered while the pipeline computes. :meth:`run` runs any
    other coroutine there (an :class:`rlix.elastic_pool.ElasticPool`'s ``play``, say).

        with BlockingClient(connect(), "my-job") as client:
            client.register(spec, endpoint)
            client.request(Stage.ACTOR_TRAIN) ... client.release(Stage.ACTOR_TRAIN, demand)
            client.unregister("finished")
    """

    def __init__(self, scheduler: RayTransport, pipeline_id: str, **options) -> None:
        self.client = Client(scheduler, pipeline_id, **options)
        self.loop = asyncio.new_event_loop()
        self._waits: set = set()  # the calls the pipeline's thread waits on
        self._interrupt_next = False  # an interrupt for the next call (none waited when it came)
        self._leaving = False  # unregister has begun: nothing is interrupted any more
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"rlix-client-{pipeline_id}", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine, timeout_s: float | None = None, *, interruptible: bool = True):
        """``coro``'s result, run on the client's loop; interrupted (:meth:`interrupt`, Ctrl-C, a timeout), it
        is cancelled there. ``interruptible=False``: :meth:`interrupt` neither cancels it nor is spent on it
        (the calls that clean up)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BlockingClient.run called on its own loop (an endpoint callback?): await the call there")
        with self._lock:
            if interruptible and self._interrupt_next:  # an interrupt came while nothing waited: this call takes it
                self._interrupt_next = False
                coro.close()
                raise CancelledError(f"pipeline '{self.client.pipeline_id}' interrupted")
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            if interruptible:
                self._waits.add(fut)
        try:
            return fut.result(timeout_s)
        except BaseException:
            fut.cancel()
            raise
        finally:
            with self._lock:
                self._waits.discard(fut)

    def interrupt(self) -> None:
        """Make the pipeline's thread stop waiting: the call it waits on (a gang request, a batch) is
        cancelled, or, if it waits on none, its next call is; that call raises
        :class:`concurrent.futures.CancelledError`. Once :meth:`unregister` has begun, nothing is
        interrupted. For the endpoint's ``stop`` (a cancel) and the client's ``on_gone``; callable from
        any thread, the client's loop included."""
        with self._lock:
            if self._leaving:
                return
            cancelled = [fut.cancel() for fut in self._waits]
            self._interrupt_next = not any(cancelled)

    def register(self, spec: PipelineSpec, endpoint, *, owns: bool | None = None) -> None:
        self.run(self.client.register(spec, endpoint, owns=owns))

    def request(self, stage: Stage, role: Role | None = None, *, after: Stage | None = None):
        return self.run(self.client.request(stage, role, after=after))

    def release(self, stage: Stage, report: ReportDemand | None = None) -> None:
        self.run(self.client.release(stage, report))

    def report(self, report: ReportDemand) -> None:
        self.run(self.client.report(report))

    def lost(self, first_gpu: int, failed: bool = True) -> None:
        self.run(self.client.lost(first_gpu, failed))

    def note(self, note: protocol.JobNote) -> None:
        self.run(self.client.note(note))

    def unregister(self, status: protocol.Outcome | str = "finished", error: str = "") -> None:
        """Leave (:meth:`Client.unregister`); from here on :meth:`interrupt` cancels nothing."""
        with self._lock:
            self._leaving, self._interrupt_next = True, False
        self.run(self.client.unregister(status, error), interruptible=False)

    def actor_options(self, gpus: Gpus, env: dict[str, str] | None = None) -> dict:
        return self.client.actor_options(gpus, env)

    def close(self) -> None:
        """Stop the client's loop and its thread (after :meth:`unregister`)."""
        if self.loop.is_closed():
            return
        self.run(_cancel_all(), interruptible=False)  # the keep-alive, a pool's workers' tasks: nothing is left pending
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _cancel_all() -> None:
    """Cancel every other task of the running loop, and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
