"""The executor's control plane without Ray: the scheduler actor's per-GPU order of plans, and
one pipeline's rollout control (expand/shrink races, lost workers, weight catch-up).

The actor class and the rollout control run as themselves; fakes stand only at the process
boundary: the pipeline coordinators and rollout worker processes they call as
``handle.method.remote(...)``, and (for the rollout control) killing a process and the
runtime's error types.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from boundary import Remote
from helpers import spec

from rlix.core import ClusterSpec, ReportDemand, SchedulerConfig, Stage
from rlix.exec.messages import GenRequest, GenResult, SwitchTiming
from rlix.metrics import Activity


class _Coordinator:
    """A pipeline coordinator: notes every call; a shrink waits while ``hold`` is clear (a worker finishing its wake)."""

    def __init__(self, name: str, calls: list) -> None:
        self.hold = asyncio.Event()
        self.hold.set()

        async def shrink(gpus, reason):
            calls.append((name, "shrink", tuple(gpus)))
            await self.hold.wait()
            calls.append((name, "shrunk", tuple(gpus)))

        async def expand(gpus):
            calls.append((name, "expand", tuple(gpus)))

        async def stop(why=None):
            calls.append((name, "stop"))

        self.shrink, self.expand, self.stop = Remote(shrink), Remote(expand), Remote(stop)


def _actor(gpus: int):
    from rlix.exec.service.scheduler_actor import SchedulerActor

    cluster = ClusterSpec(nodes=1, gpus_per_node=gpus)
    return SchedulerActor.__ray_metadata__.modified_class(cluster, "rlix", SchedulerConfig(), time.time(), 60.0)


async def _settle() -> None:
    for _ in range(20):  # let every ready task run (fakes answer at once)
        await asyncio.sleep(0)


async def _two_jobs_with_rollout(calls: list):
    """Jobs a (GPUs 0-1) and b (GPUs 2-3) on 4 GPUs, each training and rolling out on its own
    two GPUs with one 2-GPU worker; a's worker is up, b has not asked for rollout yet."""
    sched = _actor(4)
    await sched.start()
    coords = {"a": _Coordinator("a", calls), "b": _Coordinator("b", calls)}
    await sched.register(spec("a", (0, 1), (0, 1), tp=2), coords["a"])
    await sched.register(spec("b", (2, 3), (2, 3), tp=2), coords["b"])
    for pid in ("a", "b"):
        await sched.request(pid, Stage.INIT)
        await sched.release(pid, Stage.INIT)
    await sched.report(ReportDemand(pipeline_id="a", pending=8, batch_size=8))
    await _settle()
    assert ("a", "expand", (0, 1)) in calls
    return sched, coords


def test_a_slow_shrink_delays_only_the_actions_on_its_own_gpus():
    """a's rollout worker on GPUs 0-1 is slow to shrink for a's training. Meanwhile b's expand and
    b's training grant on GPUs 2-3 (a shrink of b's own worker first) go through at once; a's
    grant on GPUs 0-1 waits for the shrink that frees them, and comes once it does."""

    async def scenario():
        calls: list = []
        sched, coords = await _two_jobs_with_rollout(calls)
        coords["a"].hold.clear()  # a's worker is still waking: its shrink waits
        a_train = asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN))
        await _settle()
        assert ("a", "shrink", (0, 1)) in calls and not a_train.done()

        await sched.report(ReportDemand(pipeline_id="b", pending=8, batch_size=8))
        await _settle()
        assert ("b", "expand", (2, 3)) in calls  # not behind a's shrink
        b_reply = await asyncio.wait_for(sched.request("b", Stage.ACTOR_TRAIN), 1.0)  # b's worker shrinks at once
        assert b_reply.gpus == (2, 3) and calls[-2:] == [("b", "shrink", (2, 3)), ("b", "shrunk", (2, 3))]
        assert not a_train.done()  # still behind the shrink on its own GPUs

        coords["a"].hold.set()
        a_reply = await asyncio.wait_for(a_train, 1.0)
        assert a_reply.gpus == (0, 1)
        assert calls.index(("a", "shrunk", (0, 1))) > calls.index(("b", "shrunk", (2, 3)))
        stats = await sched.stats()
        await sched.stop()
        return stats

    stats = asyncio.run(scenario())
    assert (stats.shrinks, stats.grants, stats.expands, stats.errors) == (2, 4, 2, ())


def test_an_expand_waits_for_the_slow_shrink_that_frees_its_gpus():
    """a's worker on GPUs 0-1 is shrunk (a leaves), slowly; b, whose rollout may use all 4 GPUs,
    gets an expand on 2-3 at once, and the one on 0-1 only after a's worker let them go."""

    async def scenario():
        calls: list = []
        sched = _actor(4)
        await sched.start()
        coords = {"a": _Coordinator("a", calls), "b": _Coordinator("b", calls)}
        await sched.register(spec("a", (0, 1), (0, 1), tp=2), coords["a"])
        await sched.register(spec("b", (2, 3), (0, 1, 2, 3), tp=2), coords["b"])
        for pid in ("a", "b"):
            await sched.request(pid, Stage.INIT)
            await sched.release(pid, Stage.INIT)
        await sched.report(ReportDemand(pipeline_id="a", pending=8, batch_size=8))
        await _settle()
        assert calls == [("a", "expand", (0, 1))]

        coords["a"].hold.clear()
        leaving = asyncio.ensure_future(sched.unregister("a"))  # shrinks a's worker, slowly
        await _settle()
        await sched.report(ReportDemand(pipeline_id="b", pending=8, batch_size=8))
        await _settle()
        assert ("b", "expand", (2, 3)) in calls and ("b", "expand", (0, 1)) not in calls
        assert not leaving.done()

        coords["a"].hold.set()
        await asyncio.wait_for(leaving, 1.0)
        await _settle()
        assert calls.index(("b", "expand", (0, 1))) > calls.index(("a", "shrunk", (0, 1)))
        await sched.stop()
        return await sched.holdings()

    assert asyncio.run(scenario()) == {"b": (0, 1, 2, 3)}


def test_a_rejoining_pipeline_keeps_the_admission_time_of_the_scheduler_before_its_restart():
    """The service keeps when each pipeline was first given GPUs beside its roster; a restarted
    service gives a rejoining pipeline that time back (who of two jobs sharing a home came first)."""
    from rlix.core import Rejoin

    async def scenario():
        calls: list = []
        first = _actor(2)
        await first.start()
        await first.register(spec("a", (0, 1), (0, 1)), _Coordinator("a", calls))
        await first.request("a", Stage.INIT)
        admitted = first.roster.pipelines["a"]
        await first.stop()
        again = _actor(2)  # the restarted life, with what the previous one kept
        again.roster.before = dict(first.roster.pipelines)
        await asyncio.sleep(0.05)
        await again.rejoin(Rejoin(spec=spec("a", (0, 1), (0, 1)), gangs=((Stage.INIT, (0, 1)),)), _Coordinator("a", calls))
        await again.stop()
        return admitted, again.core.admitted_at("a"), again.now()

    admitted, rejoined, now = asyncio.run(scenario())
    assert admitted is not None and rejoined == admitted < now - 0.04


def test_stop_cancels_every_background_task():
    async def scenario():
        calls: list = []
        sched, coords = await _two_jobs_with_rollout(calls)
        coords["a"].hold.clear()
        asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN))
        await _settle()
        tasks = set(sched.order.tasks)
        assert len(tasks) >= 2  # the ticker, a's slow shrink, the grant behind it
        await sched.stop()
        await asyncio.sleep(0)
        return tasks

    assert all(t.cancelled() or t.done() for t in asyncio.run(scenario()))


def test_what_a_background_task_raises_is_reported_and_a_cancel_not_delivered_is_recorded(monkeypatch):
    """Before: an exception in a spawned task (a cancel whose endpoint call raised) went only to the
    event loop's log, as 'Task exception was never retrieved', and the cancel's kill never came."""
    from rlix.exec.control.gpu_order import GpuOrder

    async def boom():
        raise KeyError("x")

    async def spawned():
        errors: list = []
        order = GpuOrder(on_error=errors.append)
        order.spawn(boom())
        order.spawn(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        return errors, order.tasks

    errors, left = asyncio.run(spawned())
    assert [type(e) for e in errors] == [KeyError] and not left

    from rlix import protocol
    from rlix.exec.service import scheduler_actor

    async def cancelled():
        calls: list = []
        sched, coords = await _two_jobs_with_rollout(calls)

        def refuse(why=None):
            raise RuntimeError("no route to the endpoint")

        coords["a"].stop = type("Call", (), {"remote": staticmethod(refuse)})()
        await sched._stop("a", protocol.Stopped(by="ann@h"))
        out = list(sched.errors), await sched.holdings()
        await sched.stop()
        return out

    monkeypatch.setattr(scheduler_actor, "CANCEL_GRACE_S", 0.01)
    errors, holdings = asyncio.run(cancelled())
    assert "cancel of 'a' not delivered: RuntimeError: no route to the endpoint" in errors
    assert "a" not in holdings  # killed at the grace's end all the same


def test_a_stage_asked_for_again_is_granted_to_the_retry_when_the_first_caller_gave_up():
    """Before: the second request replaced the first's future, the core refused it as a duplicate and
    dropped the entry, and the grant came to nobody while the ledger held the GPUs."""

    async def scenario():
        calls: list = []
        sched, coords = await _two_jobs_with_rollout(calls)
        coords["a"].hold.clear()  # a's worker on 0-1 is slow to let go: a's training waits for it
        first = asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN))
        await _settle()
        first.cancel()  # the caller gives up (an interrupted call) ...
        retry = asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN))  # ... and asks again
        await _settle()
        coords["a"].hold.set()
        granted = await asyncio.wait_for(retry, 5)
        holdings = await sched.holdings()
        await sched.stop()
        return granted, holdings

    granted, holdings = asyncio.run(scenario())
    assert granted.gpus == (0, 1) and holdings["a"] == (0, 1)


def test_a_stage_asked_again_after_its_grant_gets_it_and_a_refusal_reaches_every_asker():
    async def scenario():
        calls: list = []
        sched, _ = await _two_jobs_with_rollout(calls)
        first = await sched.request("b", Stage.ACTOR_TRAIN)
        again = await sched.request("b", Stage.ACTOR_TRAIN)  # its caller gave up before the grant came
        await sched.lock.acquire()  # a plan under way: both requests below wait for it
        refused = asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN, after=Stage.INIT))  # INIT is not held
        await asyncio.sleep(0.01)
        meanwhile = asyncio.ensure_future(sched.request("a", Stage.ACTOR_TRAIN))
        await asyncio.sleep(0.01)
        sched.lock.release()
        outcomes = await asyncio.gather(refused, meanwhile, return_exceptions=True)
        await sched.stop()
        return first, again, outcomes

    first, again, outcomes = asyncio.run(scenario())
    assert first.gpus == again.gpus == (2, 3)
    assert [type(o).__name__ for o in outcomes] == ["SchedulingError", "SchedulingError"]  # before: the second waited for ever


def test_a_cancelled_job_whose_endpoint_owns_no_process_keeps_its_gpus_until_it_leaves(monkeypatch):
    """A callback inbox (a TRL job's) cannot end its pipeline's process: killing it at the cancel's
    grace handed on GPUs its trainer still worked on. It keeps them until it leaves, or its process dies."""
    from rlix import protocol
    from rlix.exec.service import scheduler_actor

    monkeypatch.setattr(scheduler_actor, "CANCEL_GRACE_S", 0.01)

    async def scenario():
        calls: list = []
        sched = _actor(4)
        await sched.start()
        inbox = _Coordinator("t", calls)
        await sched.register(spec("t", (0, 1), (0, 1), tp=2), inbox, owns=False)
        await sched.request("t", Stage.INIT)
        await sched._stop("t", protocol.Stopped(by="ann@h"))
        kept = await sched.holdings(), list(sched.errors)
        await sched.unregister("t", protocol.Outcome.CANCELLED, caller=inbox)  # at its step's end
        out = kept, await sched.holdings(), calls
        await sched.stop()
        return out

    (kept, errors), after, calls = asyncio.run(scenario())
    assert kept == {"t": (0, 1)} and ("t", "stop") in calls
    assert errors == ["'t' did not stop within 0.01 s of its cancel; it keeps its GPUs until it leaves"]
    assert after == {}


@pytest.mark.parametrize("owns, ends", [(True, "killed"), (False, "leaves"), (False, "dies")])
def test_a_job_dropped_for_a_missed_shrink_keeps_those_gpus_until_it_has_left_when_nothing_can_stop_it(owns, ends):
    """Before: a TRL job (a callback inbox owns none of its processes) dropped for a missed shrink had every
    GPU handed on at once, while its rollout workers and trainer still ran there. Now it is told (its calls
    are refused) and the GPUs wait for its leave. A job whose endpoint owns its processes is killed, and
    its GPUs go on at once, as before."""
    from rlix import protocol
    from rlix.protocol import PipelineGone

    async def scenario():
        calls: list = []
        sched = _actor(4)
        await sched.start()
        t = _Coordinator("t", calls)

        async def refuse(gpus, reason):
            raise RuntimeError("its process did not answer")

        t.shrink = Remote(refuse)
        await sched.register(spec("t", (0, 1), (0, 1, 2, 3), tp=2), t, owns=owns)
        await sched.register(spec("b", (2, 3), (2, 3), tp=2), _Coordinator("b", calls))
        await sched.request("t", Stage.INIT)
        await sched.release("t", Stage.INIT, ReportDemand(pipeline_id="t", pending=16, batch_size=16))
        await _settle()
        assert ("t", "expand", (2, 3)) in calls
        b_load = asyncio.ensure_future(sched.request("b", Stage.INIT))  # t's worker on 2-3 must go: its shrink fails
        await asyncio.sleep(0.2)
        waited = not b_load.done()
        with pytest.raises(PipelineGone):
            await sched.alive("t")  # t hears it was dropped at its next call
        if ends == "leaves":
            await sched.unregister("t", protocol.Outcome.FAILED, "dropped", caller=t)  # it stopped, and leaves
        elif ends == "dies":
            await sched._unreachable("t", dead=True)  # as the liveness watch finds its endpoint gone
        granted = await asyncio.wait_for(b_load, 5)
        jobs = {r.name: r.state for r in (await sched.status()).jobs}
        await sched.stop()
        return waited, granted, jobs, list(sched.errors)

    waited, granted, jobs, errors = asyncio.run(scenario())
    assert granted.gpus == (2, 3) and jobs["t"] == "failed"
    assert waited is not owns  # killed, its GPUs go on at once; not, they wait for its leave
    if not owns:
        assert "pipeline 't' unreachable; it keeps its GPUs until it leaves (rlix cancel --force frees them)" in errors


def test_a_dropped_job_that_has_not_left_gets_nothing_more_and_a_forced_cancel_frees_what_it_holds():
    """t (nothing can stop its process) misses a shrink while its training waits for b's: its request is
    withdrawn and fails, b's release gives it nothing, and `rlix cancel --force` frees what it held."""
    from rlix.protocol import Stopped

    async def scenario():
        calls: list = []
        sched = _actor(4)
        await sched.start()
        t = _Coordinator("t", calls)
        shrink = t.shrink

        async def refuse_23(gpus, reason):
            if tuple(gpus) == (2, 3):
                raise RuntimeError("its process did not answer")
            await shrink.remote(gpus, reason)

        t.shrink = Remote(refuse_23)
        await sched.register(spec("t", (0, 1), (0, 1, 2, 3), tp=2), t, owns=False)
        await sched.register(spec("b", (0, 1), (0, 1), tp=2), _Coordinator("b", calls))
        await sched.register(spec("c", (2, 3), (2, 3), tp=2), _Coordinator("c", calls))
        await sched.request("t", Stage.INIT)
        await sched.release("t", Stage.INIT, ReportDemand(pipeline_id="t", pending=16, batch_size=16))
        await _settle()
        await sched.request("b", Stage.INIT)  # t's worker on 0-1 lets go
        await sched.request("b", Stage.ACTOR_TRAIN, after=Stage.INIT)
        t_train = asyncio.ensure_future(sched.request("t", Stage.ACTOR_TRAIN))  # waits for b's training
        c_load = asyncio.ensure_future(sched.request("c", Stage.INIT))  # t's worker on 2-3 does not let go
        await asyncio.sleep(0.2)
        refused = await asyncio.gather(t_train, return_exceptions=True)
        await sched.release("b", Stage.ACTOR_TRAIN)
        await _settle()
        after_release = await sched.holdings()
        held = c_load.done()
        reply = await sched.cancel("t", Stopped(by="ops@h"), force=True)
        granted = await asyncio.wait_for(c_load, 5)
        await sched.stop()
        return refused, after_release, held, reply.message, granted

    refused, after_release, held, message, granted = asyncio.run(scenario())
    assert [type(r).__name__ for r in refused] == ["SchedulingError"]  # withdrawn: never granted to it
    assert "t" not in after_release and not held  # nothing new for t; c still waits for the GPUs t may use
    assert message == "job t#1 (failed) gave its GPUs back" and granted.gpus == (2, 3)


@pytest.mark.parametrize("leaves", [True, False])
def test_a_job_dropped_before_a_restart_rejoins_with_its_gpus_and_is_told_again(leaves):
    """Before: a job dropped while it still ran (nothing can stop its process) rejoined a restarted scheduler
    as a new job, running on and asking for more. Now it gets back only what it holds, its job stays
    ended, its calls are refused, and its GPUs go on once it leaves."""
    from rlix import protocol
    from rlix.core import Rejoin
    from rlix.protocol import PipelineGone, Stopped

    async def scenario():
        calls: list = []
        first = _actor(4)
        await first.start()
        t = _Coordinator("t", calls)
        await first.register(spec("t", (0, 1), (0, 1, 2, 3), tp=2), t, owns=False)
        await first.request("t", Stage.INIT)
        await first.release("t", Stage.INIT, ReportDemand(pipeline_id="t", pending=16, batch_size=16))
        await _settle()
        await first._dropped_alive("t", "unreachable")
        await first.stop()
        dropped = set(first.roster.dropped)

        again = _actor(4)  # the restarted life, with what the previous one kept
        again.roster.before, again.roster.dropped_before = dict(first.roster.pipelines), dropped
        await again.start()
        await again.register(spec("b", (2, 3), (2, 3), tp=2), _Coordinator("b", calls))
        back = Rejoin(
            spec=spec("t", (0, 1), (0, 1, 2, 3), tp=2),
            workers=((0, 1), (2, 3)),
            demand=ReportDemand(pipeline_id="t", pending=16, batch_size=16),
        )
        with pytest.raises(PipelineGone, match="before its restart"):
            await again.rejoin(back, t, owns=False)
        rejoined = await again.holdings()

        async def refuse(gpus, reason):
            raise RuntimeError("its process did not answer")

        t.shrink = Remote(refuse)
        b_load = asyncio.ensure_future(again.request("b", Stage.INIT))  # t's worker on 2-3 must go: it does not answer
        await asyncio.sleep(0.2)
        waited = not b_load.done()
        with pytest.raises(PipelineGone):
            await again.alive("t")
        listed = {r.name for r in (await again.status()).jobs}
        if leaves:
            await again.unregister("t", protocol.Outcome.FAILED, "dropped", caller=t)  # it stopped, and leaves
        else:  # the restarted service has no record of its job, ended before: the forced cancel still frees it
            reply = await again.cancel("t", Stopped(by="ops@h"), force=True)
            assert reply.message == "job t (failed) gave its GPUs back"
        granted = await asyncio.wait_for(b_load, 5)
        await again.stop()
        return dropped, rejoined, waited, listed, granted, again.roster.dropped

    dropped, rejoined, waited, listed, granted, dropped_after = asyncio.run(scenario())
    assert dropped == {"t"}
    assert rejoined == {"t": (0, 1, 2, 3)} and waited  # its GPUs stay its own while it may work there
    assert "t" not in listed  # not a new job
    assert granted.gpus == (2, 3) and dropped_after == set()


# ------------------------------------------------------------------ rollout control


class _Died(RuntimeError):
    """The runtime's error for a call whose worker process is gone (Ray: RayActorError)."""


class _Refused(RuntimeError):
    """The runtime's error for an application error inside a live worker (Ray: RayTaskError)."""


class _Gate:
    """A call that waits until opened (``never``: it hangs)."""

    def __init__(self, open_: bool = True) -> None:
        self.event = asyncio.Event()
        if open_:
            self.event.set()


class _Worker:
    """A rollout worker process: notes its calls; ``wake_gate``, ``sync_gate`` and ``gen_gate`` hold wake,
    weight sync and generate."""

    def __init__(self, gpus, prepare_gate: _Gate) -> None:
        self.gpus = tuple(gpus)
        self.calls: list[tuple] = []
        self.handoffs: list[tuple] = []  # (weights, the hand-off's handles sent with them)
        self.wake_gate, self.sleep_gate, self.gen_gate, self.sync_gate = _Gate(), _Gate(), _Gate(), _Gate()
        self.dies_in_rollout = False
        self.cold = False  # its next wake builds the engine (as a vLLM worker's first wake on a GPU)
        self.refuse_wake: Exception | None = None  # raised by its next wake (as a device short of memory does)

        async def prepare(model_dir):
            self.calls.append(("prepare",))
            await prepare_gate.event.wait()

        async def wake(full, *adapters, handoff=None):
            self.calls.append(("wake", full))
            self.handoffs.append((full, handoff))
            await self.wake_gate.event.wait()
            refused, self.refuse_wake = self.refuse_wake, None
            if refused is not None:
                raise refused
            cold, self.cold = self.cold, False
            return SwitchTiming(seconds=0.0, synced_bytes=10, version=int(full[1:]), cold=cold)

        async def update_weights(full, handoff=None):
            self.calls.append(("update_weights", full))
            self.handoffs.append((full, handoff))
            await self.sync_gate.event.wait()
            return SwitchTiming(seconds=0.0, synced_bytes=10, version=int(full[1:]))

        async def sleep():
            self.calls.append(("sleep",))
            await self.sleep_gate.event.wait()

        async def generate(req):
            self.calls.append(("generate", req.traj_id))
            await self.gen_gate.event.wait()
            if self.dies_in_rollout:
                raise _Died("the worker process exited")
            ids = req.prefix_ids + (7,) * (req.max_new_tokens - len(req.prefix_ids))
            return GenResult(
                traj_id=req.traj_id,
                token_ids=ids,
                logprobs=(-1.0,) * len(ids),
                finished=True,
                aborted=False,
                weight_version=0,
                gen_s=0.1,
            )

        methods = {"prepare": prepare, "wake": wake, "update_weights": update_weights, "sleep": sleep, "generate": generate}
        for name, fn in methods.items():
            setattr(self, name, Remote(fn))


class _Job:
    """The coordinator's side of one pipeline's rollout control: its hooks, and what they were told."""

    def __init__(self, *, slots: int = 1, wake_s: float = 5.0, rule=None, longest_held: bool = False) -> None:
        from rlix.exec.recorder import Recorder
        from rlix.exec.rollout.control import RolloutControl
        from rlix.exec.rollout.hooks import Deadlines, Hooks, Processes, WeightRule
        from rlix.exec.rollout.pool import WorkerPool
        from rlix.exec.rollout.queue import RolloutQueue
        from rlix.lengths import LengthPredictor
        from rlix.rollout_book import RolloutBook

        self.version = 0  # newest trained weights, cached as "w<version>"
        self.prepare_gate = _Gate()  # process start-up (spawned processes wait on it)
        self.workers: list[_Worker] = []
        self.killed: list[_Worker] = []
        self.lost: list[tuple] = []
        self.finished: list[int] = []
        self.fatal: list[BaseException] = []
        self.changes = 0  # demand changes signalled (each sends a demand report)
        self.spawn_fails = False  # creating a worker process raises (as the runtime refusing its options)
        self.spawned: list[int] = []  # first GPU of each process started, in order
        self.background: list[tuple[int, bool]] = []  # (first GPU, born at background CPU priority) per process
        hooks = Hooks(
            now=lambda: 0.0,
            spawn=self._spawn,
            weights=lambda: (f"w{self.version}", self.version, ()),
            finished=lambda q, result: self.finished.append(q.traj_id),
            fatal=self.fatal.append,
            lost=lambda gpus, failed: self.lost.append(tuple(gpus) if failed else ("drained", *gpus)),
            changed=self._changed,
            handoff=lambda version: f"h{version}" if version in self.handles else None,
        )
        self.handles: set[int] = {0, 1}  # versions whose buckets the trainer still keeps on its GPU
        procs = Processes(kill=self.killed.append, died=(_Died,), refused=(_Refused,))
        book = RolloutBook(LengthPredictor(), longest_held=longest_held, max_tries=2)
        self.pool, self.queue = WorkerPool(slots), RolloutQueue(book)
        self.ctl = RolloutControl(
            pool=self.pool,
            queue=self.queue,
            recorder=Recorder("p"),
            hooks=hooks,
            deadlines=Deadlines(wake_s=wake_s, call_s=5.0, rollout_s=5.0),
            model_dir="/model",
            procs=procs,
            rule=rule or WeightRule(),
        )

    def _changed(self) -> None:
        self.changes += 1

    def _spawn(self, gpus, first, background):
        self.background.append((gpus[0], background))
        if self.spawn_fails:
            raise RuntimeError("no process could be created")
        self.spawned.append(gpus[0])
        self.workers.append(_Worker(gpus, self.prepare_gate))
        return self.workers[-1]

    def worker(self, gpus) -> _Worker:
        return self.pool.workers[gpus[0]].handle

    def marks(self, gpu: int) -> list[Activity]:
        return [e.activity for e in self.ctl.rec.events if gpu in e.gpus]

    def add(self, n: int, *, step: int = 0, version: int = 0) -> None:
        """Queue ``n`` trajectories of ``step`` (ids on from ``n * step``), a batch that needs weights ``version``."""
        from rlix.exec.data.recipe import Trajectory
        from rlix.exec.data.sources import PromptItem

        reqs = [GenRequest(traj_id=n * step + i, prompt_ids=(1, 2), max_new_tokens=4) for i in range(n)]
        self.queue.add(
            [
                Trajectory(
                    step=step, prompt=PromptItem(row=r.traj_id, prompt="x", prompt_ids=(), columns=(("answer", "x"),)), request=r
                )
                for r in reqs
            ],
            version,
        )


async def _warm(job: _Job, *bundles) -> None:
    job.ctl.warm(bundles)
    await _settle()


async def _cold_expand():
    """A job expanded onto GPU 0 with no process there yet, its start held open: (job, the expand)."""
    job = _Job()
    job.prepare_gate = _Gate(open_=False)
    expand = asyncio.ensure_future(job.ctl.expand((0,)))  # not warm: the expand starts the process
    await _settle()
    return job, expand


async def _waking(trajectories: int):
    """A job with ``trajectories`` queued whose worker on GPU 0 is waking (its wake held open): (job, worker, the expand)."""
    job = _Job()
    job.add(trajectories)
    await _warm(job, (0,))
    w = job.worker((0,))
    w.wake_gate = _Gate(open_=False)
    expand = asyncio.ensure_future(job.ctl.expand((0,)))
    await _settle()
    return job, w, expand


def test_a_shrink_during_a_wake_waits_for_it_and_the_wake_is_not_used():
    """The plan takes GPU 0 back while its worker wakes: the shrink waits for the wake, the woken
    worker runs nothing and is put to sleep, and GPU 0 is freed once."""
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job, w, expand = await _waking(2)
        assert job.pool.workers[0].state is WorkerState.WAKING
        shrink = asyncio.ensure_future(job.ctl.shrink((0,), "gang"))
        await _settle()
        assert not shrink.done()  # waits for the wake
        w.wake_gate.event.set()
        await asyncio.wait_for(asyncio.gather(expand, shrink), 1.0)
        return job, w

    job, w = asyncio.run(scenario())
    assert [c[0] for c in w.calls] == ["prepare", "wake", "sleep"]  # no trajectory ran on it
    assert job.pool.workers[0].state is WorkerState.ASLEEP and len(job.queue) == 2
    assert job.marks(0) == [Activity.SWITCH, Activity.SWITCH, Activity.FREE]  # never held for work; freed once
    assert job.lost == [] and job.killed == []


def test_an_expand_right_after_a_shrink_keeps_the_gpus_and_wakes_again():
    """A shrink is still draining GPU 0 when the next plan gives it back: the shrink's release is
    stale (the newer expand's generation keeps the GPUs), and the worker wakes again and works."""
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job()
        await _warm(job, (0,))
        await job.ctl.expand((0,))
        w = job.worker((0,))
        w.sleep_gate = _Gate(open_=False)
        shrink = asyncio.ensure_future(job.ctl.shrink((0,), "rebalance"))
        await _settle()
        assert job.pool.workers[0].state is WorkerState.DRAINING
        expand = asyncio.ensure_future(job.ctl.expand((0,)))
        await _settle()
        w.sleep_gate.event.set()
        await asyncio.wait_for(asyncio.gather(shrink, expand), 1.0)
        job.add(1)
        job.ctl.dispatch()
        await _settle()
        return job, w

    job, w = asyncio.run(scenario())
    assert [c[0] for c in w.calls] == ["prepare", "wake", "sleep", "wake", "generate"]
    assert job.pool.workers[0].state is WorkerState.AWAKE and job.pool.held_gpus() == (0,)
    assert Activity.FREE not in job.marks(0) and job.finished == [0]


@pytest.mark.parametrize("longest_held", [False, True])
def test_a_job_placed_longest_held_starts_its_front_on_the_worker_the_plan_gave_it_first(longest_held):
    """The plan gives the job GPU 2, then 0, then 1 (each expand stamps the worker's grant); three
    trajectories then fill the three slots, the first on GPU 2 under longest_held, on GPU 0 by default."""

    async def scenario():
        job = _Job(longest_held=longest_held)
        await _warm(job, (0,), (1,), (2,))
        for g in (2, 0, 1):
            await job.ctl.expand((g,))
        job.add(3)
        job.ctl.dispatch()
        await _settle()
        return job

    job = asyncio.run(scenario())
    assert job.ctl.runner.startable == job.ctl.startable  # the book's order is over the workers the control allows
    assert [job.pool.workers[g].grant_seq for g in range(3)] == [2, 3, 1]
    started = {c[1]: g for g in range(3) for c in job.worker((g,)).calls if c[0] == "generate"}
    assert started == ({0: 2, 1: 0, 2: 1} if longest_held else {0: 0, 1: 1, 2: 2})
    assert sorted(job.finished) == [0, 1, 2]


def test_a_rejoin_during_a_shrink_reports_the_worker_until_its_gpus_are_free():
    """The scheduler restarts while a shrink drains GPU 0: the rejoin reports the worker (it is still
    on the GPU, so the restarted scheduler gives it to no one), and once the drain is done the
    worker is reported lost, which frees it in the new ledger. On GPU 1 the restarted scheduler's
    own expand takes the worker over first: nothing is reported lost there."""
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job()
        await _warm(job, (0,), (1,))
        await job.ctl.expand((0,))
        await job.ctl.expand((1,))
        for gpus in ((0,), (1,)):
            job.worker(gpus).sleep_gate = _Gate(open_=False)
        shrinks = [asyncio.ensure_future(job.ctl.shrink(g, "rebalance")) for g in ((0,), (1,))]
        await _settle()
        assert job.pool.workers[0].state is WorkerState.DRAINING
        reported = job.pool.rejoin_bundles()
        expand = asyncio.ensure_future(job.ctl.expand((1,)))  # the new scheduler keeps GPU 1 for the job
        await _settle()
        assert job.lost == []  # still draining
        for gpus in ((0,), (1,)):
            job.worker(gpus).sleep_gate.event.set()
        await asyncio.wait_for(asyncio.gather(*shrinks, expand), 1.0)
        return job, reported

    job, reported = asyncio.run(scenario())
    assert reported == ((0,), (1,))
    assert job.lost == [("drained", 0)]  # freed without a cooldown: it did not fail
    assert job.pool.bundles() == ((1,),)


def test_a_shrink_before_the_process_is_up_cancels_the_expand():
    """Expanded onto a bundle whose process is still starting, then shrunk: it never wakes."""
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job, expand = await _cold_expand()
        assert job.workers[0].calls == [("prepare",)] and not expand.done()
        await job.ctl.shrink((0,), "rebalance")
        job.prepare_gate.event.set()
        await asyncio.wait_for(expand, 1.0)
        return job

    job = asyncio.run(scenario())
    assert [c[0] for c in job.workers[0].calls] == ["prepare"]
    assert job.pool.workers[0].state is WorkerState.ASLEEP and job.pool.held_gpus() == ()
    assert [(e.activity, e.stage) for e in job.ctl.rec.events] == [(Activity.SWITCH, "start"), (Activity.FREE, "")]
    assert job.ctl.rec.switches == []  # no cold start booked for GPUs given back before the process was up


def test_a_worker_that_does_not_wake_in_time_is_killed_and_reported_lost():
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job(wake_s=0.05)
        job.add(1)
        await _warm(job, (0,), (1,))
        hung = job.worker((0,))
        hung.wake_gate = _Gate(open_=False)  # its wake never returns
        await asyncio.wait_for(asyncio.gather(job.ctl.expand((0,)), job.ctl.expand((1,))), 1.0)
        await _settle()
        return job, hung

    job, hung = asyncio.run(scenario())
    assert job.killed == [hung] and job.lost == [(0,)]
    assert job.pool.workers[0].state is WorkerState.DEAD and job.ctl.rec.counters.workers_lost == 1
    assert job.marks(0)[-1] is Activity.FREE and job.pool.held_gpus() == (1,)
    assert job.finished == [0]  # the other worker took the work


def test_a_worker_dying_mid_rollout_has_its_trajectories_continue_elsewhere():
    async def scenario():
        job = _Job(slots=2)
        job.add(3)
        await _warm(job, (0,), (1,))
        job.worker((0,)).gen_gate = _Gate(open_=False)
        job.worker((1,)).gen_gate = _Gate(open_=False)
        await job.ctl.expand((0,))
        await job.ctl.expand((1,))
        await _settle()
        dying = job.worker((0,))
        running = [c[1] for c in dying.calls if c[0] == "generate"]
        dying.dies_in_rollout = True
        dying.gen_gate.event.set()
        await _settle()
        job.workers[1].gen_gate.event.set()
        await _settle()
        return job, dying, running

    job, dying, running = asyncio.run(scenario())
    assert running == [0, 1] and job.killed == [dying] and job.lost == [(0,)]
    assert sorted(job.finished) == [0, 1, 2] and job.queue.book.requeued == 2  # nothing lost
    assert [c[1] for c in job.workers[1].calls if c[0] == "generate"] == [2, 0, 1]


def test_a_wake_refused_for_memory_keeps_the_process_asleep_and_gives_the_gpus_back():
    """A device short of memory refuses the wake before anything loads: the worker is reported lost
    (the scheduler cools the bundle: a backoff), its process is not killed and stays asleep, and a
    later expand wakes that same process."""
    from rlix.exec.device_memory import NotEnoughMemoryError
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job()
        await _warm(job, (0,))
        worker = job.worker((0,))
        worker.refuse_wake = NotEnoughMemoryError("device cuda:0: 1.0 GiB free, 3.0 GiB needed")
        await job.ctl.expand((0,))
        state = job.pool.workers[0].state
        await job.ctl.expand((0,))
        return job, worker, state

    job, worker, state = asyncio.run(scenario())
    assert state is WorkerState.ASLEEP and job.killed == [] and job.lost == [(0,)]
    assert job.ctl.rec.counters.workers_lost == 1
    assert len(job.workers) == 1 and [c[0] for c in worker.calls] == ["prepare", "wake", "wake"]
    assert job.pool.workers[0].state is WorkerState.AWAKE


def test_a_wake_refused_while_a_shrink_and_a_new_expand_wait_reports_nothing_lost():
    """The plan takes GPU 0 back and gives it again while its worker's wake is under way; the wake
    is then refused for memory. The GPUs went back with the shrink and belong to the new expand, so
    nothing is reported lost, and the new expand wakes the same process."""
    from rlix.exec.device_memory import NotEnoughMemoryError
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job()
        await _warm(job, (0,))
        worker = job.worker((0,))
        worker.wake_gate = _Gate(open_=False)
        worker.refuse_wake = NotEnoughMemoryError("device cuda:0: 1.0 GiB free, 3.0 GiB needed")
        first = asyncio.ensure_future(job.ctl.expand((0,)))
        await _settle()
        shrink = asyncio.ensure_future(job.ctl.shrink((0,), "gang"))
        await _settle()
        again = asyncio.ensure_future(job.ctl.expand((0,)))
        await _settle()
        worker.wake_gate.event.set()
        await asyncio.wait_for(asyncio.gather(first, shrink, again), 1.0)
        return job

    job = asyncio.run(scenario())
    assert job.lost == [] and job.killed == []
    assert job.pool.workers[0].state is WorkerState.AWAKE and job.pool.workers[0].granted


def test_a_newer_weight_version_published_during_a_wake_is_synced_before_work():
    async def scenario():
        job = _Job()
        job.add(1)
        await _warm(job, (0,))
        w = job.worker((0,))
        w.wake_gate = _Gate(open_=False)
        expand = asyncio.ensure_future(job.ctl.expand((0,)))
        await _settle()
        job.version = 1  # the trainer published version 1 while the worker loads version 0
        w.wake_gate.event.set()
        await asyncio.wait_for(expand, 1.0)
        await _settle()
        return w

    w = asyncio.run(scenario())
    assert w.calls == [("prepare",), ("wake", "w0"), ("update_weights", "w1"), ("generate", 0)]
    assert w.handoffs == [("w0", "h0"), ("w1", "h1")]  # each version with its own handles


async def _published_while_busy(rule):
    """A worker with two slots runs trajectory 0 of step 0 on weights 0 (held open); version 1 is published
    and step 1's trajectory 1 (needs version 1) queued behind it. Returns (worker, its calls then, the job)."""
    job = _Job(slots=2, rule=rule)
    job.add(1)
    await _warm(job, (0,))
    w = job.worker((0,))
    w.gen_gate = _Gate(open_=False)
    await job.ctl.expand((0,))
    await _settle()
    job.version = 1
    await job.ctl.push("")
    job.add(1, step=1, version=1)
    job.ctl.dispatch()
    await _settle()
    return w, list(w.calls), job


def test_new_full_weights_wait_for_a_busy_worker_to_drain_and_nothing_starts_on_old_ones():
    """Batch mode (and streaming without partial rollout): full weights change only on an idle worker
    (rlix.job.weight_gate, as in the simulator). The busy worker gets no sync at the publish, and
    step 1's trajectory does not start on its old weights: once trajectory 0 ends it syncs, then runs it."""
    from rlix.exec.rollout.hooks import WeightRule

    async def scenario(rule):
        w, before, job = await _published_while_busy(rule)
        w.gen_gate.event.set()
        await _settle()
        return w, before, job

    for rule in (WeightRule(), WeightRule(streaming=True)):
        w, before, job = asyncio.run(scenario(rule))
        assert before == [("prepare",), ("wake", "w0"), ("generate", 0)], rule
        assert w.calls[3:] == [("update_weights", "w1"), ("generate", 1)], rule
        assert sorted(job.finished) == [0, 1] and job.pool.workers[0].version == 1


def test_partial_rollout_syncs_under_running_trajectories_when_newer_weights_are_needed():
    """Streaming with partial rollout: the trajectory that needs version 1 has the busy worker sync under
    the one still running (it goes on under the new weights), and starts beside it."""
    from rlix.exec.rollout.hooks import WeightRule

    async def scenario():
        w, before, _ = await _published_while_busy(WeightRule(streaming=True, partial=True))
        w.gen_gate.event.set()
        await _settle()
        return before

    assert asyncio.run(scenario()) == [("prepare",), ("wake", "w0"), ("generate", 0), ("update_weights", "w1"), ("generate", 1)]


def test_an_idle_worker_moves_to_new_weights_at_the_publish_only_under_streaming():
    """Streaming: an idle worker takes the newest weights as they are published, before a trajectory
    needs them. Batch mode: it syncs when the next batch's first trajectory is to start on it."""
    from rlix.exec.rollout.hooks import WeightRule

    async def scenario(rule):
        job = _Job(rule=rule)
        await _warm(job, (0,))
        await job.ctl.expand((0,))
        job.version = 1
        await job.ctl.push("")
        await _settle()
        at_publish = list(job.worker((0,)).calls)
        job.add(1, step=1, version=1)
        job.ctl.dispatch()
        await _settle()
        return at_publish, job.worker((0,)).calls

    streaming, batch = asyncio.run(scenario(WeightRule(streaming=True))), asyncio.run(scenario(WeightRule()))
    assert streaming[0] == [("prepare",), ("wake", "w0"), ("update_weights", "w1")]
    assert streaming[1][3:] == [("generate", 1)]
    assert batch[0] == [("prepare",), ("wake", "w0")]
    assert batch[1][2:] == [("update_weights", "w1"), ("generate", 1)]


async def _syncing(rule):
    """An idle awake worker on GPU 0 whose sync to version 1 (started by the publish) is held open, and a
    trajectory of step 1 (needs version 1) queued: the job."""
    job = _Job(rule=rule)
    await _warm(job, (0,))
    await job.ctl.expand((0,))
    job.worker((0,)).sync_gate = _Gate(open_=False)
    job.version = 1
    job.add(1, step=1, version=1)
    job.ctl.dispatch()  # the gate starts the worker's sync
    await _settle()
    return job


def test_a_publish_beside_a_sync_already_under_way_sends_the_weights_once():
    """Streaming: the trajectory that needs version 1 started the idle worker's sync; the publish's own
    move of idle workers finds it syncing and sends nothing more; the trajectory starts once it is done."""
    from rlix.exec.rollout.hooks import WeightRule

    async def scenario():
        job = await _syncing(WeightRule(streaming=True))
        push = asyncio.ensure_future(job.ctl.push(""))
        await _settle()
        job.worker((0,)).sync_gate.event.set()
        await asyncio.wait_for(push, 1.0)
        await _settle()
        return job.worker((0,)).calls

    assert asyncio.run(scenario()) == [("prepare",), ("wake", "w0"), ("update_weights", "w1"), ("generate", 1)]


def test_a_shrink_behind_a_sync_runs_nothing_more_on_the_worker():
    """The plan takes GPU 0 back while its worker syncs: the shrink waits for the sync, and the
    trajectory the sync was for does not start on the leaving worker; it stays queued."""

    async def scenario():
        job = await _syncing(None)
        shrink = asyncio.ensure_future(job.ctl.shrink((0,), "gang"))
        await _settle()
        job.worker((0,)).sync_gate.event.set()
        await asyncio.wait_for(shrink, 1.0)
        await _settle()
        return job

    job = asyncio.run(scenario())
    assert job.worker((0,)).calls == [("prepare",), ("wake", "w0"), ("update_weights", "w1"), ("sleep",)]
    assert len(job.queue) == 1 and job.finished == []


def test_teardown_cancels_a_sync_and_nothing_starts_after_it():
    async def scenario():
        job = await _syncing(None)
        starts = job.ctl.starts()
        job.ctl.end()
        for task in starts:
            task.cancel()
        await _settle()
        return job, starts

    job, starts = asyncio.run(scenario())
    assert [t.cancelled() for t in starts] == [False, True] and job.ctl.syncs == {}  # the process start, the sync
    assert job.worker((0,)).calls == [("prepare",), ("wake", "w0"), ("update_weights", "w1")]


def test_a_worker_woken_once_the_handles_were_withdrawn_is_sent_none():
    async def scenario():
        job = _Job()
        job.add(1)
        job.handles = set()  # a stage's load withdrew them
        await _warm(job, (0,))
        await asyncio.wait_for(job.ctl.expand((0,)), 1.0)
        return job.worker((0,))

    assert asyncio.run(scenario()).handoffs == [("w0", None)]


def test_a_wake_that_builds_the_engine_is_booked_as_a_cold_start():
    """A worker whose first wake builds its engine on the GPUs: that wake is a cold start, later ones are wakes
    (and only wakes make the measured wake cost); the GPUs are switching in both."""
    from rlix.exec.records import SwitchKind

    async def scenario():
        job = _Job()
        await _warm(job, (0,))
        job.worker((0,)).cold = True
        await job.ctl.expand((0,))
        await job.ctl.shrink((0,), "gang")
        await job.ctl.expand((0,))
        return job

    job = asyncio.run(scenario())
    kinds = [s.kind for s in job.ctl.rec.switches]  # the warm-up was a start in the background, booked as one
    assert kinds == [SwitchKind.PROCESS_START, SwitchKind.COLD_START, SwitchKind.SLEEP, SwitchKind.WAKE]
    assert job.marks(0)[:2] == [Activity.SWITCH, Activity.HELD]  # built and loaded, then awake with nothing to run


def test_an_expand_onto_a_starting_worker_books_the_start_then_the_wake():
    """GPUs given to a worker whose process is still starting are switching ("start") until it is up, then it wakes ("load")."""
    from rlix.exec.records import SwitchKind

    async def scenario():
        job, expand = await _cold_expand()
        job.prepare_gate.event.set()
        await asyncio.wait_for(expand, 1.0)
        return job

    job = asyncio.run(scenario())
    assert [(e.activity, e.stage) for e in job.ctl.rec.events] == [
        (Activity.SWITCH, "start"),
        (Activity.SWITCH, "load"),
        (Activity.HELD, "rollout"),
    ]
    assert [s.kind for s in job.ctl.rec.switches] == [SwitchKind.COLD_START, SwitchKind.WAKE]


def test_a_process_starting_in_the_background_is_reported_starting_until_it_is_up():
    """The demand report names the bundles whose process starts in the background (the scheduler places no
    worker there yet); once one is up, a change is signalled so the next report leaves it out."""

    async def scenario():
        job = _Job()
        job.prepare_gate = _Gate(open_=False)
        job.ctl.warm([(0,), (1,)])
        assert job.pool.starting() == [0, 1]  # at once: the report sent next already names them
        await _settle()
        before = job.changes
        job.prepare_gate.event.set()
        await _settle()
        return job, before

    job, before = asyncio.run(scenario())
    assert job.pool.starting() == []
    assert job.changes == before + 2  # one per process up


def test_spare_starts_wait_for_the_homes_processes_to_be_up():
    """A spare start never competes with the start-up of the processes the job will use: it begins once
    they are up (it is reported starting meanwhile, so no worker goes there)."""

    async def scenario():
        job = _Job()
        job.prepare_gate = _Gate(open_=False)
        job.ctl.warm([(0,), (1,)])
        job.ctl.warm([(2,)], spare=True)
        await _settle()
        spawned_while_home_started = list(job.spawned)
        assert job.pool.starting() == [0, 1, 2]  # the spare bundle is named starting all along
        job.prepare_gate.event.set()
        await _settle()
        return job, spawned_while_home_started

    job, early = asyncio.run(scenario())
    assert early == [0, 1]
    assert job.spawned == [0, 1, 2] and job.pool.starting() == []
    assert job.background == [(0, False), (1, False), (2, True)]  # only the spare is born at background CPU priority


def _waiting_spare() -> _Job:
    """(In a running loop) a job whose home process (GPU 0) is starting and whose spare start (GPU 1) waits for it."""
    job = _Job()
    job.prepare_gate = _Gate(open_=False)
    job.ctl.warm([(0,)])
    job.ctl.warm([(1,)], spare=True)
    return job


def test_a_spare_granted_while_it_waits_for_the_home_starts_at_once():
    """An expand onto a bundle whose spare start still waits for the home's processes (GPUs held) does
    not wait for them: the process starts at once, as a cold start's does."""

    async def scenario():
        job = _waiting_spare()
        await _settle()
        expand = asyncio.ensure_future(job.ctl.expand((1,)))
        await asyncio.sleep(0.4)  # longer than one look at the grant (GRANT_POLL_S)
        spawned = list(job.spawned)
        job.prepare_gate.event.set()
        await asyncio.wait_for(expand, 1.0)
        return job, spawned

    job, spawned = asyncio.run(scenario())
    assert spawned == [0, 1]
    assert job.background == [(0, False), (1, False)]  # a cold start for an expand: at the run's priority


def test_a_spare_start_still_waiting_when_the_job_ends_starts_no_process():
    """Teardown cancels the starts (RolloutControl.starts): a spare waiting for the home's processes
    never starts one after the job is gone."""

    async def scenario():
        job = _waiting_spare()
        await _settle()
        for task in job.ctl.starts():
            task.cancel()
        job.prepare_gate.event.set()
        await _settle()
        return job

    job = asyncio.run(scenario())
    assert job.spawned == [0]


def test_an_expand_waiting_for_its_process_when_the_job_ends_returns_quietly():
    """The job finishes while an expand waits for a cold start: teardown cancels the start, and the
    expand returns rather than raising (a raising expand makes the scheduler drop the job before its
    result is collected)."""

    async def scenario():
        job, expand = await _cold_expand()
        for task in job.ctl.starts():
            task.cancel()
        await asyncio.wait_for(expand, 1.0)
        return job, expand

    job, expand = asyncio.run(scenario())
    assert expand.exception() is None and job.workers[0].calls == [("prepare",)]
    assert job.lost == [] and job.ctl.rec.switches == []


def test_an_expand_cancelled_while_its_process_starts_raises_and_the_start_goes_on():
    """The expand's own cancellation is not the job ending: it propagates, and the shielded start is untouched."""

    async def scenario():
        job, expand = await _cold_expand()
        expand.cancel()
        await _settle()
        (start,) = job.ctl.starts()
        running = not start.done()
        job.prepare_gate.event.set()
        await asyncio.wait_for(start, 1.0)
        return expand, running, start

    expand, running, start = asyncio.run(scenario())
    assert expand.cancelled() and running and start.result() is True


def test_a_process_that_cannot_be_created_is_dead_not_starting_for_ever():
    from rlix.exec.rollout.pool import WorkerState

    async def scenario():
        job = _Job()
        job.spawn_fails = True
        await _warm(job, (0,))
        return job

    job = asyncio.run(scenario())
    assert job.pool.workers[0].state is WorkerState.DEAD and job.pool.starting() == []


def test_a_wake_failing_because_the_job_ended_loses_no_worker(caplog):
    """Teardown kills the job's processes while a wake is in flight: the wake's failure is the job's
    end, not a lost worker (no count, no report to the scheduler, no warning in the log)."""

    async def scenario():
        job, w, expand = await _waking(1)
        handles = job.ctl.end()
        w.refuse_wake = _Died("the actor was killed")  # the call in flight fails as a killed process's does
        w.wake_gate.event.set()
        await asyncio.wait_for(expand, 1.0)
        return job, handles, w

    with caplog.at_level("WARNING", logger="rlix.rollout"):
        job, handles, w = asyncio.run(scenario())
    assert handles == [w] and ("wake", "w0") in w.calls
    assert job.lost == [] and job.ctl.rec.counters.workers_lost == 0
    assert not [r for r in caplog.records if "lost" in r.getMessage()]


def test_killing_what_is_not_an_actor_hands_nothing_to_ray(monkeypatch):
    """ray.kill on anything else starts a local Ray instance first (in a test worker, it then stood in for
    the cluster a later test named by address)."""
    import ray

    from rlix.exec.service.endpoints import kill_actor

    asked = []
    monkeypatch.setattr(ray, "kill", lambda handle, **kw: asked.append(handle))
    kill_actor(object())
    kill_actor(None)
    assert asked == []
