"""The client library for pipelines written outside rlix: the elastic rollout pool, the blocking client,
and where a pipeline's own actors are placed. Without Ray: the scheduler is the real scheduler-actor
class in this process; fakes stand only at the process boundary (the endpoint's Ray handle)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from concurrent.futures import CancelledError

import pytest
from boundary import InProcessTransport, Remote
from helpers import spec

from rlix.bundles import PlacementError, bundle_options, pinning
from rlix.client import BlockingClient
from rlix.core import ClusterSpec, ReportDemand, SchedulerConfig, Stage
from rlix.elastic_pool import ElasticPool
from rlix.endpoint import CallbackEndpoint
from rlix.protocol import GpuMap


class Dead(Exception):
    """Stands for Ray's ``RayActorError``: the worker's process is gone."""


class Engine:
    """A worker's engine: an item's outcome depends on the item alone; it says which GPUs played it."""

    def __init__(self, gpus, item_s: float = 0.01) -> None:
        self.gpus, self.item_s = gpus, item_s

    async def play(self, item: int) -> tuple[int, float, int]:
        await asyncio.sleep(self.item_s)
        return item, random.Random(item).random(), self.gpus[0]


def outcome(item: int) -> tuple[int, float]:
    return item, random.Random(item).random()


def pool_of(start=Engine, **kw) -> ElasticPool:
    return ElasticPool("p", start=start, run=lambda worker, item: worker.play(item), died=(Dead,), **kw)


def test_a_batch_is_dealt_across_expands_and_shrinks_and_comes_back_in_order():
    reports: list[ReportDemand] = []

    async def report(demand):
        reports.append(demand)

    async def run():
        pool = pool_of(report_s=0.005)
        await pool.expand((0,))
        batch = asyncio.get_running_loop().create_task(pool.play(list(range(24)), report=report))
        await asyncio.sleep(0.035)
        await pool.expand((1,))
        await pool.expand([2])
        await asyncio.sleep(0.035)
        await pool.shrink((0,), "stage")  # its item in flight is played again elsewhere
        return pool, await batch

    pool, results = asyncio.run(run())
    assert [(i, r) for i, r, _ in results] == [outcome(i) for i in range(24)]  # every item once, same outcome
    assert set(Counter(gpu for _, _, gpu in results)) == {0, 1, 2}
    assert pool.workers == ((1,), (2,))
    first = reports[0]
    assert first.pipeline_id == "p" and first.batch_size == 24
    assert first.pending + sum(w.active for w in first.loads) == 24  # reported before anything finished
    assert any({w.first_gpu for w in r.loads} == {1, 2} for r in reports)  # the new workers' loads were reported
    assert all(a != b for a, b in zip(reports, reports[1:]))  # sent when the demand changed only
    assert pool.demand(24) == ReportDemand(pipeline_id="p", pending=0, batch_size=24, finished=24)
    assert pool.demand(8, announce=8).pending == 8


def test_a_dead_worker_is_reported_lost_and_its_item_played_again():
    class Dies(Engine):
        async def play(self, item):
            await asyncio.sleep(self.item_s)
            raise Dead

    lost, stopped = [], []

    async def on_lost(first_gpu):
        lost.append(first_gpu)

    async def run():
        pool = pool_of(lambda gpus: (Dies if gpus == (0,) else Engine)(gpus), lost=on_lost, stop=stopped.append)
        await pool.expand((0,))
        await pool.expand((1,))
        results = await pool.play(list(range(8)))
        await pool.close()
        return pool, results

    pool, results = asyncio.run(run())
    assert lost == [0]
    assert [(i, r) for i, r, _ in results] == [outcome(i) for i in range(8)]
    assert {gpu for _, _, gpu in results} == {1}
    assert pool.workers == () and [w.gpus for w in stopped] == [(1,)]  # the dead one was not stopped again


def test_a_worker_with_slots_plays_that_many_items_at_once_and_dies_once():
    """slots=3: a worker plays three items at a time (its load says 3); when it dies, each of its slots'
    items is played again elsewhere, and the scheduler hears of the loss once."""
    playing, most = Counter(), Counter()
    reports: list[ReportDemand] = []

    class Counted(Engine):
        async def play(self, item):
            playing[self.gpus] += 1
            most[self.gpus] = max(most[self.gpus], playing[self.gpus])
            try:
                await asyncio.sleep(self.item_s)
                if self.gpus == (0,) and item >= 6:
                    raise Dead
                return item, random.Random(item).random(), self.gpus[0]
            finally:
                playing[self.gpus] -= 1

    lost = []

    async def on_lost(first_gpu):
        lost.append(first_gpu)

    async def report(demand):
        reports.append(demand)

    async def run():
        pool = pool_of(Counted, slots=3, lost=on_lost, report_s=0.002)
        await pool.expand((0,))
        await pool.expand((1,))
        return await pool.play(list(range(18)), report=report)

    results = asyncio.run(run())
    assert [(i, r) for i, r, _ in results] == [outcome(i) for i in range(18)]
    assert most == {(0,): 3, (1,): 3}
    assert lost == [0]
    assert {gpu for i, _, gpu in results if i >= 6} == {1}
    assert max(w.active for r in reports for w in r.loads) == 3
    with pytest.raises(ValueError, match="slots=0; a worker plays at least one item at a time"):
        pool_of(slots=0)


def test_a_worker_error_fails_its_batch_only():
    class Broken(Engine):
        async def play(self, item):
            if item == 2:
                raise ValueError("bad item")
            return await super().play(item)

    async def run():
        pool = pool_of(Broken)
        await pool.expand((0,))
        with pytest.raises(ValueError, match="bad item"):
            await pool.play([1, 2, 3])
        assert pool.demand(3).pending == 0  # nothing left for the workers
        return await pool.play([4, 5])

    assert [(i, r) for i, r, _ in asyncio.run(run())] == [outcome(4), outcome(5)]


def test_a_cancelled_batch_leaves_nothing_behind():
    async def run():
        pool = pool_of(lambda gpus: Engine(gpus, item_s=0.05))
        await pool.expand((0,))
        await pool.expand((1,))
        old = asyncio.get_running_loop().create_task(pool.play([100, 101, 102, 103]))
        await asyncio.sleep(0.02)  # both workers are playing an old item
        old.cancel()
        await asyncio.gather(old, return_exceptions=True)
        await pool.shrink((1,))  # its old item does not come back
        assert pool.demand(0).pending == 0
        return await pool.play([7, 8, 9])  # the old items still in flight end meanwhile: dropped

    assert [(i, r) for i, r, _ in asyncio.run(run())] == [outcome(7), outcome(8), outcome(9)]


def test_the_pools_endpoint_answers_the_schedulers_calls_with_it():
    pool = pool_of()

    async def mine(why):
        return None

    end = pool.endpoint(stop=mine)
    assert isinstance(end, CallbackEndpoint)
    assert end.callbacks == {"expand": pool.expand, "shrink": pool.shrink, "stop": mine}
    assert pool.endpoint().callbacks["stop"] is not mine


# ------------------------------------------------------------------ the blocking client


def test_interrupt_cancels_the_wait_in_progress_or_else_the_next_call_only():
    with BlockingClient(None, "p") as client:
        assert client.run(asyncio.sleep(0, result=7)) == 7
        waiting = threading.Event()

        async def wait_long():
            waiting.set()
            await asyncio.sleep(30)

        def interrupt_once_waiting():
            waiting.wait(10)
            time.sleep(0.05)
            client.interrupt()

        threading.Thread(target=interrupt_once_waiting).start()
        t = time.monotonic()
        with pytest.raises(CancelledError):
            client.run(wait_long())
        assert time.monotonic() - t < 10
        assert client.run(asyncio.sleep(0, result=8)) == 8  # the interrupt was spent on the wait
        client.interrupt()  # nothing waits: the next call takes it
        with pytest.raises(CancelledError, match="'p' interrupted"):
            client.run(asyncio.sleep(0, result=9))
        assert client.run(asyncio.sleep(0, result=10)) == 10
        client.interrupt()
        assert client.run(asyncio.sleep(0, result=11), interruptible=False) == 11  # a cleanup call is not interrupted
        with pytest.raises(CancelledError):  # and does not spend it
            client.run(asyncio.sleep(0))

        async def from_its_loop():
            return client.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="on its own loop"):
            client.run(from_its_loop())
        with pytest.raises(RuntimeError, match="register first"):
            client.actor_options((0,))
    assert client.loop.is_closed()


class _Endpoint:
    """The pool's endpoint as the scheduler sees it (a Ray actor handle, here in-process)."""

    def __init__(self, pool: ElasticPool) -> None:
        self.expand, self.shrink = Remote(pool.expand), Remote(pool.shrink)
        self.stop = Remote(lambda why=None: asyncio.sleep(0))


def test_a_blocking_pipeline_borrows_the_idle_gpus_for_its_rollouts_and_gives_them_back():
    from rlix.exec.service.scheduler_actor import SchedulerActor

    actor = SchedulerActor.__ray_metadata__.modified_class(
        ClusterSpec(nodes=1, gpus_per_node=2), "rlix", SchedulerConfig(), time.time(), 0.05
    )
    client = BlockingClient(InProcessTransport(actor), "p", keepalive_s=0.2)
    client.run(actor.start())
    pool = ElasticPool(
        "p", start=Engine, run=lambda worker, item: worker.play(item), died=(Dead,), lost=client.client.lost, report_s=0.02
    )
    try:
        client.register(spec("p", (0,), (0, 1), slots=1), _Endpoint(pool))
        assert client.actor_options((1,))["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "1"
        client.request(Stage.INIT)
        client.release(Stage.INIT, pool.demand(16, announce=16))
        results = client.run(pool.play(list(range(16)), report=client.client.report), timeout_s=15)
        assert [(i, r) for i, r, _ in results] == [outcome(i) for i in range(16)]
        assert {gpu for _, _, gpu in results} == {0, 1}  # a worker on each GPU: the idle one was lent
        client.report(pool.demand(16))
        assert client.request(Stage.ACTOR_TRAIN).gpus == (0,)
        client.release(Stage.ACTOR_TRAIN, pool.demand(0))
        client.interrupt()  # a cancel that came too late for any wait: the leaving calls still run
        client.unregister("finished")
        assert pool.workers == ()  # the scheduler shrank them before it forgot the pipeline
        assert [row.phases[-1][0] for row in client.run(actor.status()).jobs] == ["finished"]
        client.interrupt()  # after unregister: nothing to interrupt
        assert client.run(asyncio.sleep(0, result=1)) == 1
    finally:
        client.run(actor.stop())
        client.close()


def test_a_pipeline_that_leaves_saying_a_word_that_is_no_ending_leaves_as_failed_and_is_told():
    from rlix.exec.service.scheduler_actor import SchedulerActor

    actor = SchedulerActor.__ray_metadata__.modified_class(
        ClusterSpec(nodes=1, gpus_per_node=2), "rlix", SchedulerConfig(), time.time(), 0.05
    )
    client = BlockingClient(InProcessTransport(actor), "p", keepalive_s=0.2)
    client.run(actor.start())
    try:
        client.register(spec("p", (0,), (0, 1), slots=1), _Endpoint(ElasticPool("p", start=Engine, run=None)))
        client.request(Stage.INIT)
        with pytest.raises(ValueError, match="a job ends finished, failed or cancelled, not 'done'"):
            client.unregister("done")
        row = client.run(actor.status()).jobs[0]
        assert (row.phases[-1][0], row.error) == ("failed", "(it left saying 'done')")  # its GPUs went back all the same
        assert client.run(actor.holdings()) == {}
    finally:
        client.run(actor.stop())
        client.close()


# ------------------------------------------------------------------ placing a pipeline's own actors


def test_an_actor_is_placed_in_the_bundle_of_its_first_gpu_and_sees_its_devices():
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    two = ClusterSpec(nodes=2, gpus_per_node=4)
    assert pinning(two, (6, 7)).node == 1 and pinning(two, (6, 7)).local_gpus == (2, 3)
    with pytest.raises(ValueError, match="span nodes"):
        pinning(two, (3, 4))
    reserved = GpuMap(groups=("group0", "group1"), devices=(("0", "1", "2", "3"), ("4", "5", "GPU-a", "GPU-b")))
    opts = bundle_options(two, (6, 7), reserved, name="p", env={"X": "1"})
    assert opts["num_cpus"] == 0 and opts["num_gpus"] == 0
    assert opts["runtime_env"]["env_vars"] == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "X": "1"}
    strategy = opts["scheduling_strategy"]
    assert isinstance(strategy, PlacementGroupSchedulingStrategy)
    assert strategy.placement_group == "group1" and strategy.placement_group_bundle_index == 2
    one = bundle_options(ClusterSpec(nodes=1, gpus_per_node=4), (2,), GpuMap(), name="p")
    assert "scheduling_strategy" not in one and one["runtime_env"]["env_vars"] == {"CUDA_VISIBLE_DEVICES": "2"}
    with pytest.raises(PlacementError, match="p: no GPU reservation for a 2-node cluster"):
        bundle_options(two, (6,), GpuMap(), name="p")


def test_rlix_places_its_own_workers_the_same_way_and_says_a_cluster_error():
    from rlix.exec.placement import EXPECTED_DEVICES, actor_options
    from rlix.transport import ClusterError

    two = ClusterSpec(nodes=2, gpus_per_node=4)
    reserved = GpuMap(groups=("group0", "group1"), devices=(("0", "1", "2", "3"), ("4", "5", "GPU-a", "GPU-b")))
    opts = actor_options(two, (6, 7), reserved, "w")
    env = opts["runtime_env"]["env_vars"]
    assert env["CUDA_VISIBLE_DEVICES"] == env[EXPECTED_DEVICES] == "GPU-a,GPU-b" and env["RLIX_WORKER"] == "w"
    assert opts["scheduling_strategy"].placement_group_bundle_index == 2
    with pytest.raises(ClusterError, match="w: no GPU reservation for a 2-node cluster"):  # rlix-run says it in one line
        actor_options(two, (6,), GpuMap(), "w")
