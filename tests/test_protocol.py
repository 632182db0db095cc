"""The scheduler's protocol: typed requests answered by one call, a version checked at every call,
a client library that loads nothing of the executor, and a ready-made endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import subprocess
import sys
import time

import pytest
from helpers import spec

from rlix import protocol
from rlix.core import ClusterSpec, ReportDemand, SchedulerConfig, SchedulingError, Stage


def _actor(gpus: int):
    from rlix.exec.service.scheduler_actor import SchedulerActor

    cluster = ClusterSpec(nodes=1, gpus_per_node=gpus)
    return SchedulerActor.__ray_metadata__.modified_class(cluster, "rlix", SchedulerConfig(), time.time(), 60.0)


class _Endpoint:
    """A pipeline's endpoint that answers every call of the scheduler, doing nothing."""

    async def expand(self, gpus):
        pass

    async def shrink(self, gpus, reason):
        pass

    async def stop(self, why=None):
        pass

    async def __ray_ready__(self):
        pass


def _request_types() -> list[type]:
    calls = (protocol.PipelineCall, protocol.SubmitterCall, protocol.AdminCall)
    return [c for _, c in inspect.getmembers(protocol, inspect.isclass) if issubclass(c, calls) and c not in calls]


@pytest.mark.exec
def test_every_request_of_the_protocol_is_answered_by_the_scheduler_and_nothing_else_is():
    sched = _actor(2)
    assert set(sched._routes) == set(_request_types())
    assert len(_request_types()) >= 20
    for request in _request_types():
        assert dataclasses.is_dataclass(request) and request.__dataclass_params__.frozen, request

    with pytest.raises(TypeError, match="not a request of rlix protocol"):
        asyncio.run(sched.handle(spec("a", (0,), (0, 1)), protocol.PROTOCOL_VERSION))


@pytest.mark.exec
def test_a_client_of_another_protocol_version_is_refused_in_one_line_naming_both():
    sched = _actor(2)
    with pytest.raises(protocol.VersionMismatch) as refused:
        asyncio.run(sched.handle(protocol.Info(), protocol.PROTOCOL_VERSION + 1))
    message = str(refused.value)
    assert f"protocol {protocol.PROTOCOL_VERSION + 1}" in message and f"scheduler {protocol.PROTOCOL_VERSION}" in message
    assert "\n" not in message
    info = asyncio.run(sched.handle(protocol.Info(), protocol.PROTOCOL_VERSION))
    assert (info.nodes, info.gpus_per_node, info.policy) == (1, 2, "rlix")


@pytest.mark.exec
def test_pipeline_calls_through_handle_plan_as_the_calls_they_name():
    """Register, demand, a gang request and release, and unregister, all as requests: the grant
    comes back typed, and an unknown pipeline's call raises the protocol's own error."""

    class Remote:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args):
            return asyncio.ensure_future(self.fn(*args))

    calls: list = []

    async def expand(gpus):
        calls.append(("expand", tuple(gpus)))

    async def shrink(gpus, reason):
        calls.append(("shrink", tuple(gpus), reason))

    endpoint = type("Endpoint", (), {})()
    endpoint.expand, endpoint.shrink, endpoint.stop = Remote(expand), Remote(shrink), Remote(lambda why=None: asyncio.sleep(0))

    async def scenario():
        sched = _actor(2)
        v = protocol.PROTOCOL_VERSION
        await sched.handle(protocol.Start(), v)
        await sched.handle(protocol.Register(spec=spec("a", (0,), (0, 1)), endpoint=endpoint), v)
        grant = await sched.handle(protocol.RequestGang(pipeline_id="a", stage=Stage.INIT), v)
        demand = ReportDemand(pipeline_id="a", pending=8, batch_size=8)
        await sched.handle(protocol.ReleaseGang(pipeline_id="a", stage=Stage.INIT, demand=demand), v)
        for _ in range(20):
            await asyncio.sleep(0)
        held = await sched.handle(protocol.Holdings(), v)
        with pytest.raises(protocol.PipelineUnknown):
            await sched.handle(protocol.Report(demand=ReportDemand(pipeline_id="b", pending=1)), v)
        await sched.handle(protocol.Unregister(pipeline_id="a", status=protocol.Outcome.FINISHED), v)
        status = await sched.handle(protocol.Status(), v)
        await sched.handle(protocol.Stop(), v)
        return grant, held, status

    grant, held, status = asyncio.run(scenario())
    assert isinstance(grant, protocol.GrantReply) and grant.gpus == (0,)
    assert held == {"a": (0, 1)} and ("expand", (0,)) in calls and ("expand", (1,)) in calls
    assert [(r.name, r.state) for r in status.jobs] == [("a", "finished")]


def test_the_client_library_loads_no_part_of_the_executor_nor_ray():
    code = "import sys, rlix.client; print(sorted(m for m in sys.modules if m.startswith(('rlix.exec', 'ray'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.heavy
def test_a_callback_endpoint_answers_the_schedulers_calls_with_the_pipelines_coroutines(tmp_path):
    """A pipeline with no actor class of its own: the scheduler's expands reach its coroutines, a
    shrink for its training returns only once its coroutine did (the grant comes after), and the
    endpoint's actor is gone once it unregistered."""
    import ray

    from rlix.client import CallbackEndpoint, Client
    from rlix.exec.service.scheduler_actor import SchedulerActor
    from rlix.ray_runtime import worker_pythonpath
    from rlix.transport import RayTransport

    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    try:
        actor = SchedulerActor.remote(ClusterSpec(nodes=1, gpus_per_node=2), "rlix", SchedulerConfig(), time.time(), 60.0)
        sched = RayTransport(actor)
        sched.call_sync(protocol.Start())
        events: list = []

        async def expand(gpus):
            events.append(("expand", gpus))

        async def shrink(gpus, reason):
            await asyncio.sleep(0.3)  # a worker taking its time to let go
            events.append(("shrunk", gpus, reason))

        async def pipeline():
            endpoint = CallbackEndpoint(expand=expand, shrink=shrink)
            client = Client(sched, "a")
            await client.register(spec("a", (0,), (0, 1)), endpoint)
            await client.request(Stage.INIT)
            await client.release(Stage.INIT, ReportDemand(pipeline_id="a", pending=8, batch_size=8))
            for _ in range(100):
                if len([e for e in events if e[0] == "expand"]) == 2:
                    break
                await asyncio.sleep(0.05)
            await client.request(Stage.ACTOR_TRAIN)
            events.append(("granted",))
            await client.release(Stage.ACTOR_TRAIN)
            inbox = endpoint.actor
            await client.unregister("finished")
            return inbox

        inbox = asyncio.run(pipeline())
        granted = events.index(("granted",))
        assert {e[1] for e in events[:granted] if e[0] == "expand"} == {(0,), (1,)}
        assert any(e[:2] == ("shrunk", (0,)) for e in events[:granted])  # its GPU was free before the grant
        with pytest.raises(ray.exceptions.RayActorError):  # its inbox actor is gone (ray.kill returns before it is)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ray.get(inbox.__ray_ready__.remote(), timeout=30)
                time.sleep(0.2)
        status = sched.call_sync(protocol.Status())
        assert [(r.name, r.state) for r in status.jobs] == [("a", "finished")]
    finally:
        ray.shutdown()


@pytest.mark.exec
def test_a_register_the_core_refuses_ends_the_job_it_queued_saying_why():
    from rlix.core import SchedulingError

    async def scenario():
        sched = _actor(2)
        v = protocol.PROTOCOL_VERSION
        endpoint = type("Endpoint", (), {"expand": 1, "shrink": 1, "stop": 1})()  # never called: it is refused
        with pytest.raises(SchedulingError):  # GPU 5 is not on a 2-GPU cluster
            await sched.handle(protocol.Register(spec=spec("z", (0,), (0, 5)), endpoint=endpoint, user="ann@h"), v)
        with pytest.raises(SchedulingError, match="'y': its endpoint has no stop; register a Ray actor"):
            await sched.handle(protocol.Register(spec=spec("y", (0,), (0, 1)), endpoint=Endpointless(), user="ann@h"), v)
        return await sched.handle(protocol.Status(), v), await sched.handle(protocol.Holdings(), v)

    class Endpointless:  # a handle without the cancel every endpoint answers: refused before anything is kept of it
        expand = shrink = 1

    status, holdings = asyncio.run(scenario())
    (row,) = status.jobs
    assert (row.name, row.state, row.user) == ("z", "failed", "ann@h") and "5" in row.error
    assert holdings == {}


@pytest.mark.exec
def test_a_cancel_reaches_a_registered_jobs_endpoint_with_who_asked_and_another_users_needs_force():
    stops: list = []

    class Remote:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args):
            return asyncio.ensure_future(self.fn(*args))

    async def stop(why):
        stops.append(why)

    async def nothing(*args):
        return None

    endpoint = type("Endpoint", (), {})()
    endpoint.stop, endpoint.expand, endpoint.shrink = Remote(stop), Remote(nothing), Remote(nothing)

    async def scenario():
        sched = _actor(2)
        v = protocol.PROTOCOL_VERSION
        await sched.handle(protocol.Register(spec=spec("a", (0,), (0, 1)), endpoint=endpoint, user="ann@h1"), v)
        refused = await sched.handle(protocol.Cancel(job="a", by="bob@h2"), v)
        mine = await sched.handle(protocol.Cancel(job="a#1", by="ann@h2"), v)  # by id, the same user elsewhere
        for _ in range(20):
            await asyncio.sleep(0)
        sched.order.cancel()
        return refused, mine

    refused, mine = asyncio.run(scenario())
    assert refused.refused and "a#1 is ann's" in refused.message and "--force" in refused.message
    assert not mine.refused and mine.message == "job a#1 asked to stop"
    assert stops == [protocol.Stopped(by="ann@h2")]


@pytest.mark.exec
def test_a_leave_ends_only_the_registration_it_comes_from():
    """A run whose registration under a taken name was refused leaves without ending the job that
    holds the name; nor does a run dropped since, once the name runs again."""
    from boundary import Handle, InProcessTransport

    from rlix.client import Client

    async def scenario():
        sched = _actor(2)
        await sched.start()
        alice, bob = Client(InProcessTransport(sched), "job", keepalive_s=3600), Client(InProcessTransport(sched), "job")
        await alice.register(spec("job", (0,), (0, 1)), Handle(_Endpoint()))
        await alice.request(Stage.INIT)
        with pytest.raises(SchedulingError, match="already registered"):
            await bob.register(spec("job", (1,), (0, 1)), Handle(_Endpoint()))
        await bob.unregister("failed", "its register was refused")  # its exit handler: leave, whatever happened
        assert (await sched.holdings()) == {"job": (0,)}
        stale = protocol.Unregister(pipeline_id="job", status="failed", endpoint=Handle(_Endpoint()))
        await sched.handle(stale, protocol.PROTOCOL_VERSION)  # a run dropped since, leaving late
        assert [(r.name, r.state) for r in (await sched.status()).jobs] == [("job", "loading")]
        await alice.release(Stage.INIT)  # the job that holds the name goes on
        await alice.unregister("finished")
        assert [(r.name, r.state) for r in (await sched.status()).jobs] == [("job", "finished")]
        await sched.stop()

    asyncio.run(scenario())


@pytest.mark.exec
def test_a_pipeline_that_leaves_a_restarted_scheduler_before_rejoining_it_ends_as_it_says():
    """Before: the restarted scheduler ended nothing for a leave from a pipeline it had not heard from yet,
    and planned nothing for it until its rejoin window closed; then the job ended as failed, 'it did not
    rejoin', though it had finished."""
    from boundary import Handle, InProcessTransport

    from rlix.client import Client
    from rlix.exec.service.roster import Roster

    async def scenario():
        first = _actor(2)
        await first.start()
        transport = InProcessTransport(first)
        client, refused = Client(transport, "job", keepalive_s=3600), Client(transport, "job")
        await client.register(spec("job", (0,), (0, 1)), Handle(_Endpoint()))
        await client.request(Stage.INIT)
        with pytest.raises(SchedulingError, match="already registered"):
            await refused.register(spec("job", (1,), (0, 1)), Handle(_Endpoint()))
        await first.stop()
        again = _actor(2)  # its restart: the previous life's pipelines are to rejoin within 30 s
        again.roster = Roster(restarted=True, persist=False, now=again.now(), max_wait_s=30.0, before={"job": 0.0})
        await again.start()
        transport.actor = again
        await refused.unregister("failed", "its register was refused")  # it has nothing to rejoin with: nothing ends
        assert again.roster.waiting(again.now()) and (await again.status()).jobs == ()
        await client.unregister("finished")
        assert [(r.name, r.state) for r in (await again.status()).jobs] == [("job", "finished")]
        assert not again.roster.waiting(again.now()) and await again.holdings() == {}  # it plans again at once
        await again.stop()

    asyncio.run(scenario())


def test_a_job_dropped_before_a_restart_still_leaves_through_the_restarted_scheduler():
    """Before: its leave rejoined first, heard that it had been dropped, and raised before it was sent, so
    the job kept its name and GPUs until its process died."""
    from boundary import Handle, InProcessTransport

    from rlix.client import Client
    from rlix.exec.service.roster import Roster

    async def scenario():
        first = _actor(2)
        await first.start()
        transport = InProcessTransport(first)
        client = Client(transport, "job", keepalive_s=3600)
        await client.register(spec("job", (0,), (0, 1)), Handle(_Endpoint()), owns=False)
        await client.request(Stage.INIT)
        await first._dropped_alive("job", "unreachable")
        await first.stop()
        again = _actor(2)
        before = dict(first.roster.pipelines)
        again.roster = Roster(
            restarted=True, persist=False, now=again.now(), max_wait_s=30.0, before=before, dropped_before={"job"}
        )
        await again.start()
        transport.actor = again
        await client.unregister("failed", "dropped")
        left = await again.holdings(), await again.knows("job")
        await again.stop()
        return left

    assert asyncio.run(scenario()) == ({}, False)


@pytest.mark.exec
def test_one_endpoints_odd_liveness_answer_never_stops_the_checks_of_the_others(monkeypatch):
    """Job a's endpoint fails its liveness check in a way no actor should: recorded, a kept; job b's
    endpoint is dead: b is dropped and its GPUs go back, as if a were not there."""
    from boundary import Remote
    from ray.exceptions import RayActorError

    from rlix.exec.service import scheduler_actor

    monkeypatch.setattr(scheduler_actor, "LIVENESS_S", 0.02)

    def endpoint(ready):
        async def nothing(*args):
            return None

        handle = type("Endpoint", (), {})()
        handle.expand, handle.shrink, handle.stop, handle.__ray_ready__ = (
            Remote(nothing),
            Remote(nothing),
            Remote(nothing),
            Remote(ready),
        )
        return handle

    async def odd():
        raise ValueError("not an actor's answer")

    async def dead():
        raise RayActorError()

    async def scenario():
        sched = _actor(2)
        await sched.start()
        await sched.register(spec("a", (0,), (0, 1)), endpoint(odd))
        await sched.register(spec("b", (1,), (0, 1)), endpoint(dead))
        await asyncio.gather(sched.request("a", Stage.INIT), sched.request("b", Stage.INIT))
        for _ in range(200):
            if "b" not in await sched.holdings():
                break
            await asyncio.sleep(0.02)
        out = await sched.holdings(), [(r.name, r.state) for r in (await sched.status()).jobs], list(sched.errors)
        await sched.stop()
        return out

    holdings, jobs, errors = asyncio.run(scenario())
    assert holdings == {"a": (0,)} and jobs == [("a", "loading"), ("b", "failed")]
    assert any(e == "liveness check failed: ValueError: not an actor's answer" for e in errors)


@pytest.mark.exec
def test_a_request_whose_kept_values_are_of_another_type_is_refused_naming_the_field():
    """Before: a numpy number in a job's priority or a None in its progress was kept, and the job
    ledger's save, then every job's registration and rlix history, failed from then on."""
    import numpy as np

    good = spec("z", (0,), (0, 1))
    refused = {
        "Register.spec.priority: expected int, got numpy.int64": dataclasses.replace(good, priority=np.int64(1)),
        "Register.spec.roles: expected tuple, got builtins.NoneType": dataclasses.replace(good, roles=None),
        "Register.spec.home[0]: expected int, got numpy.int64": dataclasses.replace(good, home=(np.int64(0),)),
    }
    for message, bad in refused.items():
        with pytest.raises(TypeError, match=re.escape(message) + ".*; send plain Python values$"):
            protocol.check_request(protocol.Register(spec=bad, endpoint=None))
    with pytest.raises(TypeError, match=re.escape("Note.note.steps_done: expected int, got builtins.NoneType")):
        protocol.check_request(protocol.Note(note=protocol.JobNote(pipeline_id="z", loaded=True, steps_done=None, steps_total=3)))
    with pytest.raises(TypeError, match=re.escape("Note.note.loaded: expected bool, got builtins.int")):
        protocol.check_request(protocol.Note(note=protocol.JobNote(pipeline_id="z", loaded=1, steps_done=1, steps_total=3)))
    with pytest.raises(TypeError, match=re.escape("Claim.jobs: expected tuple, got builtins.list")):
        protocol.check_request(protocol.Claim(submitter="s", jobs=[protocol.JobClaim(name="x", priority=0, steps=3)]))
    protocol.check_request(protocol.Register(spec=dataclasses.replace(good, resident_gb=2), endpoint=None))  # an int is a number
    leave = protocol.Unregister(pipeline_id="z", status="failed", error=ValueError("bad"))
    assert leave.error == "bad"  # its text: an exception object broke the history's every later write

    class Endpoint:
        expand = shrink = stop = None

    async def scenario():
        sched = _actor(2)
        bad = protocol.Register(spec=refused["Register.spec.priority: expected int, got numpy.int64"], endpoint=Endpoint())
        with pytest.raises(TypeError):
            await sched.handle(bad, protocol.PROTOCOL_VERSION)
        return await sched.handle(protocol.Busy(), protocol.PROTOCOL_VERSION), sched.books.jobs.active("z")

    busy, record = asyncio.run(scenario())
    assert record is None and not busy  # refused before anything was kept: the name is free
