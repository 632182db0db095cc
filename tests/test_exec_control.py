"""The executor's control plane without Ray: the scheduler actor's per-GPU order of plans.

The actor class runs as itself (its Ray decorator's class); fakes stand only at the
process boundary, the pipeline coordinators it calls as ``handle.method.remote(...)``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers import spec

from rlix.core import ClusterSpec, ReportDemand, SchedulerConfig, Stage


class _Remote:
    """A remote method at the process boundary: ``.remote(...)`` gives an awaitable, as a Ray object ref."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self.fn(*args))


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

        self.shrink, self.expand = _Remote(shrink), _Remote(expand)


def _actor(gpus: int):
    from rlix.exec.scheduler_actor import SchedulerActor

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


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
