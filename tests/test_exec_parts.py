"""The executor's parts without Ray: worker pool lifecycle, rollout queue, step driver, recorder."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from rlix.core import Stage
from rlix.exec.config import load_config
from rlix.exec.data.recipe import Trajectory
from rlix.exec.data.sources import PromptItem
from rlix.exec.messages import GenRequest, GenResult
from rlix.exec.recorder import Recorder
from rlix.exec.records import JobStatus, SwitchKind
from rlix.exec.rollout.pool import WORKER_TRANSITIONS, LifecycleError, WorkerPool, WorkerState
from rlix.exec.rollout.queue import RolloutQueue
from rlix.job import warm_order
from rlix.lengths import LengthPredictor
from rlix.metrics import Activity
from rlix.rollout_book import RolloutBook, TrajectoryFailed
from rlix.step import StreamSpec, job_plan, rollout_book

# ------------------------------------------------------------------ worker pool


ROOT = Path(__file__).resolve().parent.parent


def test_worker_lifecycle_follows_the_table_and_illegal_moves_raise():
    pool = WorkerPool(slots_per_worker=2)
    w = pool.get((2, 3))
    for state in (
        WorkerState.STARTING,
        WorkerState.ASLEEP,
        WorkerState.WAKING,
        WorkerState.AWAKE,
        WorkerState.DRAINING,
        WorkerState.ASLEEP,
    ):
        pool.move(w, state)
    with pytest.raises(LifecycleError, match="cannot go from asleep to awake"):
        pool.move(w, WorkerState.AWAKE)  # a worker must wake before it runs trajectories
    w.handle = object()
    pool.move(w, WorkerState.DEAD)
    assert w.handle is None
    pool.move(w, WorkerState.STARTING)  # a replacement process
    with pytest.raises(LifecycleError):
        pool.get((2,))  # another bundle starting at the same GPU
    assert pool.get((2, 3)) is w


def test_every_state_can_die_except_from_absent_and_dead():
    for state, targets in WORKER_TRANSITIONS.items():
        if state not in (None, WorkerState.DEAD):
            assert WorkerState.DEAD in targets, state


def test_pool_reports_loads_of_awake_workers_and_free_slots():
    pool = WorkerPool(slots_per_worker=2)
    a, b = pool.get((0,)), pool.get((1,))
    for w in (a, b):
        for s in (WorkerState.STARTING, WorkerState.ASLEEP, WorkerState.WAKING, WorkerState.AWAKE):
            pool.move(w, s)
    a.inflight = {1: None, 2: None}
    b.granted = True
    assert [w.first for w in pool.free_slots()] == [1]
    assert [(x.first_gpu, x.active) for x in pool.loads()] == [(0, 2), (1, 0)]
    assert pool.held_gpus() == (1,)
    assert pool.leaving_trajectories() == 0
    pool.move(a, WorkerState.DRAINING)  # a shrink: its two trajectories come back to the queue
    assert [(x.first_gpu, x.active) for x in pool.loads()] == [(1, 0)] and pool.leaving_trajectories() == 2


# ------------------------------------------------------------------ rollout queue


def _traj(i: int, step: int = 0) -> Trajectory:
    req = GenRequest(traj_id=i, prompt_ids=(1, 2), max_new_tokens=8)
    return Trajectory(step=step, prompt=PromptItem(row=i, prompt="x", prompt_ids=(), columns=(("answer", "x"),)), request=req)


def _result(req: GenRequest, new: int, *, finished: bool, version: int = 0) -> GenResult:
    ids = req.prefix_ids + tuple(range(new))
    return GenResult(
        traj_id=req.traj_id,
        token_ids=ids,
        logprobs=tuple(-1.0 for _ in ids),
        finished=finished,
        aborted=not finished,
        weight_version=version,
        gen_s=0.5,
    )


class FakeWorker:
    """Stands in for a worker process: produces ``per_call`` tokens per call, then is aborted."""

    def __init__(self, per_call: int, version: int) -> None:
        self.per_call, self.version = per_call, version

    def run(self, req: GenRequest) -> GenResult:
        done = len(req.prefix_ids) + self.per_call >= req.max_new_tokens
        return _result(req, min(self.per_call, req.max_new_tokens - len(req.prefix_ids)), finished=done, version=self.version)


def _awake_pool(n: int, slots: int) -> WorkerPool:
    pool = WorkerPool(slots_per_worker=slots)
    for g in range(n):
        w = pool.get((g,))
        for s in (WorkerState.STARTING, WorkerState.ASLEEP, WorkerState.WAKING, WorkerState.AWAKE):
            pool.move(w, s)
    return pool


def test_bundles_in_the_home_warm_first_and_the_rest_once_the_model_is_loaded():
    bundles = ((2, 3), (0, 1), (4, 5), (1, 2))  # as the policy lists them: home first
    assert warm_order(bundles, (0, 1, 2, 3)) == (((2, 3), (0, 1), (1, 2)), ((4, 5),))
    assert warm_order(bundles, (6, 7)) == ((), bundles)  # nothing of it in the home: all later
    assert warm_order(bundles, ()) == (bundles, ())  # no home: every bundle at once


def _queue(max_tries: int) -> RolloutQueue:
    """A job's rollout queue over a book of its own (a job's is its step machine's)."""
    return RolloutQueue(RolloutBook(LengthPredictor(), max_tries=max_tries))


def test_queue_fills_slots_lowest_gpu_first():
    q = _queue(2)
    q.add([_traj(i) for i in range(5)])
    pool = _awake_pool(2, slots=2)
    got = q.assign(pool)
    assert [(w.first, item.traj_id) for w, item in got] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert len(q) == 1 and q.assign(pool) == []  # every slot taken


def test_a_job_placed_longest_held_fills_the_workers_it_got_first_where_its_queue_fills_every_slot():
    """The rollout book's placement (the simulator's too): the plan gave the job GPU 2, then 0, then 1."""
    q = RolloutQueue(RolloutBook(LengthPredictor(), longest_held=True))
    pool = _awake_pool(3, slots=2)
    for g in (2, 0, 1):
        pool.grant(pool.workers[g])
    assert [pool.workers[g].grant_seq for g in range(3)] == [2, 3, 1]
    q.add([_traj(i) for i in range(7)])
    got = q.assign(pool)  # 7 waiting for 6 slots: each worker gets 2 either way, the front goes to GPU 2
    assert [(w.first, item.traj_id) for w, item in got] == [(2, 0), (2, 1), (0, 2), (0, 3), (1, 4), (1, 5)]
    for w, item in got[:4]:
        w.inflight.pop(item.traj_id)
    got = q.assign(pool)  # 1 waiting for 4 free slots: lowest GPU first, as by default
    assert [(w.first, item.traj_id) for w, item in got] == [(0, 6)]


def test_placement_counts_only_the_workers_a_trajectory_could_start_on():
    """GPU 2, granted first, is leaving (a shrink waits for its lock): it is no free worker. The 4 waiting
    fill GPUs 1 and 0 (granted in that order), so the front goes to GPU 1; counting GPU 2's slots too,
    4 would not fill 6, and GPU 0 would take it."""
    q = RolloutQueue(RolloutBook(LengthPredictor(), longest_held=True))
    pool = _awake_pool(3, slots=2)
    for g in (2, 1, 0):
        pool.grant(pool.workers[g])
    pool.workers[2].leaving = 1
    q.add([_traj(i) for i in range(4)])
    got = q.assign(pool, lambda w, item: not w.leaving, startable=lambda w: not w.leaving)
    assert [(w.first, item.traj_id) for w, item in got] == [(1, 0), (1, 1), (0, 2), (0, 3)]


def test_aborted_trajectories_continue_from_their_tokens_and_nothing_is_lost():
    q = _queue(2)
    q.add([_traj(i) for i in range(3)])
    pool = _awake_pool(1, slots=4)
    workers = [FakeWorker(per_call=3, version=v) for v in (0, 1, 2)]  # each call is cut short after 3 tokens
    records = {}
    for fake in workers:
        for w, item in q.assign(pool):
            res = fake.run(item.request)
            w.inflight.pop(item.traj_id)
            if res.finished:
                records[item.traj_id], _ = q.finished(item, res)
            else:
                q.aborted(item, res)
    assert sorted(records) == [0, 1, 2]
    for r in records.values():
        assert r.tokens == 8 and r.segments == 3 and r.weight_version == 0 and r.gen_s == pytest.approx(1.5)
    assert q.book.requeued == 6


def test_a_shrinks_aborts_wait_in_the_order_they_started_whatever_order_they_come_back_in():
    """The rollout book's put-back order (the simulator's too): a drained worker's trajectories come back one
    by one, in any order, and wait at the front as they were dispatched, ahead of those never started."""
    q = _queue(1)
    q.add([_traj(i) for i in range(6)])
    pool = _awake_pool(2, slots=2)
    started = q.assign(pool)
    assert [item.traj_id for _, item in started] == [0, 1, 2, 3]
    for w, item in (started[i] for i in (1, 3, 0, 2)):  # both workers shrunk: their aborts come back as they may
        w.inflight.pop(item.traj_id)
        q.aborted(item, _result(item.request, 1, finished=False))
    assert [q.queue.popleft().traj_id for _ in range(6)] == [0, 1, 2, 3, 4, 5]


def test_an_untouched_handback_keeps_its_version_and_a_lost_worker_requeues_as_is():
    q = _queue(1)
    q.add([_traj(0)])
    item = q.queue.popleft()  # as a worker took it
    q.aborted(item, _result(item.request, 0, finished=False, version=-1))  # a sleeping worker handed it back
    assert item.segments == 0 and item.min_version == 1 << 30
    assert (q.book.requeued, q.book.orphaned) == (1, 0)
    q.queue.popleft()
    q.aborted(item, None)  # its worker died
    assert q.queue[0] is item and item.request.prefix_ids == ()
    assert (q.book.requeued, q.book.orphaned) == (2, 1)  # counted apart: continued because its worker died


@pytest.mark.parametrize(
    "dispatch, second_epoch",
    [
        ("predicted", [602, 603, 604, 605, 600, 601]),  # row 250 ran longest last epoch, then 40, then 7
        ("drawn", [600, 601, 602, 603, 604, 605]),  # the job asked for the drawn order
    ],
)
def test_once_lengths_repeat_with_their_prompts_the_queue_starts_the_predicted_longest_first(dispatch, second_epoch):
    job = load_config(ROOT / "examples" / "cpu_two_jobs.yaml").jobs[0].model_copy(update={"dispatch": dispatch})
    streams = [StreamSpec(name="", steps=2)]
    plan = job_plan(job, streams, stages=lambda i, k: (), size=lambda i, k: 600, prompts=True, tries=job.limits.rollout_tries)
    q = RolloutQueue(rollout_book(plan))  # as the job's step machine makes it

    def sampled(step: int, first: int, rows: list[int]) -> list[Trajectory]:  # GRPO: two samples of each row
        out = []
        for k, row in enumerate(r for r in rows for _ in range(2)):
            req = GenRequest(traj_id=first + k, prompt_ids=(1, 2), max_new_tokens=999)
            item = PromptItem(row=row, prompt="x", prompt_ids=(), columns=())
            out.append(Trajectory(step=step, prompt=item, request=req, group=k // 2))
        return out

    def run(n: int, tokens: dict[int, int]) -> list[int]:
        served = [q.queue.popleft() for _ in range(n)]
        for item in served:
            q.finished(item, _result(item.request, tokens[item.traj.prompt.row], finished=True))
        return [item.traj_id for item in served]

    lengths = {row: 10 + 3 * row for row in range(300)}  # each prompt's answers run to one length
    q.add(sampled(0, 0, list(range(300))))
    assert run(600, lengths) == list(range(600))  # as drawn until the lengths are seen to repeat
    assert q.book.predictor.trusted
    q.add(sampled(1, 600, [7, 250, 40]))
    assert run(6, lengths) == second_epoch


def test_eval_prompts_are_each_their_own_group_apart_from_the_trained_ones():
    q = _queue(1)
    item = lambda row: PromptItem(row=row, prompt="x", prompt_ids=(), columns=())  # noqa: E731
    trajs = [
        Trajectory(step=0, prompt=item(3), request=GenRequest(traj_id=0, prompt_ids=(1,), max_new_tokens=4), group=0),
        Trajectory(step=0, prompt=item(3), request=GenRequest(traj_id=1, prompt_ids=(1,), max_new_tokens=4), group=0),
        *(
            Trajectory(
                step=0, prompt=item(r), request=GenRequest(traj_id=2 + r, prompt_ids=(1,), max_new_tokens=4), eval=True, group=-1
            )
            for r in range(3)
        ),
    ]
    q.add(trajs)
    served = [q.queue.popleft() for _ in range(5)]
    groups = [x.group for x in served]
    assert groups[0] is groups[1] and len({id(g) for g in groups}) == 4  # the trained pair, and three eval rows alone
    assert [(g.stream, g.prompt) for g in groups[2:]] == [(("", True), 0), (("", True), 1), (("", True), 2)]


def test_a_row_drawn_twice_in_one_step_is_one_prompt_group_as_its_replay_groups_it():
    """Groups are keyed by dataset row, the prompt id ``trace.json`` records: two GRPO groups of one row
    (a step across an epoch's end) are one group, and the same row in the next step is another."""
    q = _queue(1)
    item = PromptItem(row=5, prompt="x", prompt_ids=(), columns=())
    trajs = [
        Trajectory(step=s, prompt=item, request=GenRequest(traj_id=i, prompt_ids=(1,), max_new_tokens=4), group=g)
        for i, (s, g) in enumerate([(0, 0), (0, 0), (0, 1), (0, 1), (1, 0)])
    ]
    q.add(trajs[:4])
    q.add(trajs[4:])
    groups = [q.queue.popleft().group for _ in range(5)]
    assert all(g is groups[0] for g in groups[:4]) and groups[0].size == 4
    assert groups[4] is not groups[0] and (groups[4].step, groups[4].prompt) == (1, 5)


def test_dropped_trajectories_leave_the_queue_and_are_never_put_back():
    q = _queue(3)
    q.add([_traj(i) for i in range(4)])
    pool = WorkerPool(slots_per_worker=1)
    w = pool.get((0,))
    (
        pool.move(w, WorkerState.STARTING),
        pool.move(w, WorkerState.ASLEEP),
        pool.move(w, WorkerState.WAKING),
        pool.move(w, WorkerState.AWAKE),
    )
    [(_, running)] = q.assign(pool)
    q.drop({running.traj_id, 2})
    assert q.waiting() == [1, 3] and len(q) == 2
    q.aborted(running, None)  # a shrink hands it back: its batch is gone, so it stays out
    q.failed(running, "EngineRefused: no")
    assert q.waiting() == [1, 3] and len(q) == 2 and q.book.requeued == 0


def test_application_errors_are_retried_a_bounded_number_of_times_then_fail_the_job():
    q = _queue(3)
    q.add([_traj(7, step=2)])
    item = q.queue.popleft()
    q.failed(item, "EngineRefused: no")
    q.queue.popleft()
    q.failed(item, "EngineRefused: no")
    q.queue.popleft()
    with pytest.raises(TrajectoryFailed, match=r"trajectory 7 \(step 2\) failed 3 times: EngineRefused: no"):
        q.failed(item, "EngineRefused: no")
    assert len(q) == 0


# ------------------------------------------------------------------ recorder


def test_recorder_measures_switch_cost_and_counts_lost_trajectories():
    r = Recorder("p")
    assert r.mean_switch_s() == 0.0
    r.switch(SwitchKind.WAKE, 1.0, 0.5)
    r.switch(SwitchKind.WAKE, 2.0, 1.5)
    r.switch(SwitchKind.SLEEP, 3.0, 9.0)
    assert r.mean_switch_s() == 1.0
    r.mark(0.0, (0, 1), Activity.WORK, "rollout")
    r.mark(1.0, (0, 1), Activity.FREE, "rollout")
    res = r.result(JobStatus.FINISHED, error="", arrival_s=0, init_s=0, finish_s=4, planned=3)
    assert res.lost == 3
    assert [e.pipeline_id for e in res.events] == ["p", ""] and res.events[1].stage == ""


def test_a_jobs_progress_carries_its_workers_lost_so_a_killed_job_still_reports_them():
    """A killed coordinator returns no result: the driver builds one from the last progress poll, which
    now carries the lost workers and the requeued trajectories as the result would."""
    r = Recorder("p")
    r.counters.workers_lost, r.counters.requeued = 2, 5
    progress = r.progress(JobStatus.RUNNING, steps=3, gpus_held=1)
    assert (progress.workers_lost, progress.requeued) == (2, 5)
    res = r.result(JobStatus.FINISHED, error="", arrival_s=0, init_s=0, finish_s=4, planned=3)
    assert (res.workers_lost, res.requeued) == (2, 5)


# ------------------------------------------------------------------ scheduler and trainer links


class _Remote:
    """A remote method at the process boundary: ``.remote(...)`` gives an awaitable."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class _Scheduler:
    """The transport to the scheduler (the process boundary): notes each request, grants at once."""

    def __init__(self, gpus, queued_s: float) -> None:
        self.calls: list[tuple] = []
        self.gpus, self.queued_s = gpus, queued_s

    async def call(self, request, timeout_s=None):
        from rlix import protocol

        if isinstance(request, protocol.RequestGang):
            after = (("after", request.after),) if request.after is not None else ()
            self.calls.append(("request", request.stage, request.role) + after)
            return protocol.GrantReply(gpus=self.gpus, queued_s=self.queued_s)
        assert isinstance(request, protocol.ReleaseGang)
        report = (("report", request.demand.pending),) if request.demand is not None else ()
        self.calls.append(("release", request.stage) + report)
        return None


class _Trainer:
    def __init__(self, work) -> None:
        self.calls: list[str] = []

        def note(name, value=None):
            def f(*args):  # like a Ray object ref: a future, done once the call returns
                self.calls.append(name)
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(value)
                return fut

            return _Remote(f)

        self.reload, self.offload = note("reload"), note("offload")
        self.weights, self.adapter_snapshot = note("weights", "w"), note("adapter_snapshot", "a")
        self.save_adapter, self.adapter_versions = note("save_adapter"), note("adapter_versions", {"x": 3})
        self.save_full, self.trained_steps = note("save_full"), note("trained_steps", 2)
        self.train = _Remote(work)


def _link(sched, **limits):
    from rlix.exec.config import LimitsConfig
    from rlix.exec.control.scheduler_link import SchedulerLink

    return SchedulerLink(
        pipeline_id="large", sched=sched, recorder=Recorder("large"), limits=LimitsConfig(**limits), now=lambda: 0.0
    )


def test_a_stage_takes_the_gpus_over_from_the_one_before_in_one_call():
    """The next stage's request carries the previous stage's release, so the scheduler plans
    with both at once and cannot lend the GPUs to another job in between."""
    from rlix.core import ReportDemand, Role

    sched = _Scheduler(gpus=(2,), queued_s=0.0)
    link = _link(sched)

    async def step():
        assert await link.acquire(Stage.OLD_LOGPROBS, Role.ACTOR_TRAIN) == (2,)
        await link.acquire(Stage.ACTOR_TRAIN, Role.ACTOR_TRAIN, after=Stage.OLD_LOGPROBS)
        assert link.gpus_held() == (2,)
        await link.release(Stage.ACTOR_TRAIN, ReportDemand(pipeline_id="large", pending=4))

    asyncio.run(step())
    assert sched.calls == [
        ("request", Stage.OLD_LOGPROBS, Role.ACTOR_TRAIN),
        ("request", Stage.ACTOR_TRAIN, Role.ACTOR_TRAIN, ("after", Stage.OLD_LOGPROBS)),
        ("release", Stage.ACTOR_TRAIN, ("report", 4)),
    ]
    assert link.gpus_held() == () and link.rec.counters.control_calls == 3


def test_a_stage_that_hangs_misses_its_deadline():
    from rlix.exec.config import LimitsConfig
    from rlix.exec.deadline import WorkerTimeout
    from rlix.exec.train.trainer_link import TrainerLink

    async def main():
        trainer = _Trainer(lambda samples, adapter: asyncio.Event().wait())  # never returns
        await TrainerLink(trainer, limits=LimitsConfig(stage_timeout_s=0.05)).work(Stage.ACTOR_TRAIN, [], "")

    with pytest.raises(WorkerTimeout, match="stage actor_train"):
        asyncio.run(main())


def test_trainer_link_caches_each_weight_version_and_resumes_adapters():
    from rlix.exec.config import LimitsConfig
    from rlix.exec.train.trainer_link import TrainerLink

    async def main():
        handle = _Trainer(lambda samples, adapter: None)
        link = TrainerLink(handle, limits=LimitsConfig(), checkpoint_dir="/ckpt", save_every=2)
        handle.adapter_versions = _Remote(lambda: asyncio.sleep(0, result={"x": 3, "y": 0}))
        assert await link.start(["x", "y"]) == {"x": 3, "y": 0}
        await link.publish("y", 1, last=False)
        assert "save_adapter" not in handle.calls  # version 1 is not a multiple of save_every
        await link.publish("y", 2, last=False)
        assert handle.calls.count("save_adapter") == 1  # an adapter update is checkpointed when due
        await link.publish("y", 3, last=True)
        assert handle.calls.count("save_adapter") == 2  # a stream stopping early is checkpointed at its last step
        await link.publish("", 3, last=False)
        assert "save_full" not in handle.calls  # version 3 is not a multiple of save_every, nor the last
        await link.publish("", 4, last=True)
        full, version, adapters = link.weights()
        assert version == 4 and [(n, v) for n, _, v in adapters] == [("x", 3), ("y", 3)]
        assert "save_full" in handle.calls  # the full model after its last step

    asyncio.run(main())


def test_hand_off_handles_go_with_their_version_and_are_withdrawn_before_a_stage_drops_them():
    """A worker woken between a stage's load (which frees the buckets on the trainer's GPU) and the next
    publish gets no handles to that freed memory: they are withdrawn before the load is sent."""
    from rlix.exec.config import LimitsConfig
    from rlix.exec.train.trainer_link import TrainerLink
    from rlix.weightsync.types import DeviceHandoff

    async def main():
        handle = _Trainer(lambda samples, adapter: None)
        handles = DeviceHandoff(host="h", device_uuid="GPU-1", buckets=())
        handle.handoff = _Remote(lambda: asyncio.sleep(0, result=handles))
        link = TrainerLink(handle, limits=LimitsConfig(), handoff=True)
        assert link.handoff_of(0) is None  # nothing published yet
        await link.publish("", 1, last=False)
        assert link.handoff_of(1) is handles and link.handoff_of(0) is None  # only for its own version
        seen = []
        handle.reload = _Remote(lambda parts: asyncio.sleep(0, result=seen.append(link.handoff_of(1))))
        await link.load(Stage.ACTOR_TRAIN)
        assert seen == [None] and link.handoff_of(1) is None  # gone before the trainer dropped them
        off = TrainerLink(handle, limits=LimitsConfig())  # the hand-off off: no handles asked for
        await off.publish("", 1, last=False)
        assert off.handoff_of(1) is None

    asyncio.run(main())


def test_every_call_the_trainer_link_makes_is_one_a_gang_sends_to_its_ranks():
    """The link's handle is a TrainerGang even for one rank: a trainer method missing from its calls fails
    the job the first time it is used (the fakes above accept any name)."""
    import re

    from rlix.exec.train import trainer_link
    from rlix.exec.train.actor import TrainerActor
    from rlix.exec.train.trainer_gang import GANG_CALLS

    called = set(re.findall(r"self\.handle\.(\w+)\.remote", Path(trainer_link.__file__).read_text()))
    assert "handoff" in called and called <= set(GANG_CALLS), called - set(GANG_CALLS)
    assert all(callable(getattr(TrainerActor.__ray_metadata__.modified_class, name, None)) for name in GANG_CALLS)


def test_trainer_link_resumes_a_full_finetune_from_its_checkpoint():
    from rlix.exec.config import LimitsConfig
    from rlix.exec.train.trainer_link import TrainerLink

    async def main():
        handle = _Trainer(lambda samples, adapter: None)
        handle.adapter_versions = _Remote(lambda: asyncio.sleep(0, result={}))
        assert await TrainerLink(handle, limits=LimitsConfig(), checkpoint_dir="/ckpt").start([""]) == {"": 2}
        assert await TrainerLink(handle, limits=LimitsConfig()).start([""]) == {}  # no checkpoint_dir: a fresh run


# ------------------------------------------------------------------ scheduler actor


class _Coordinator:
    """A pipeline coordinator at the process boundary: shrink, expand and stop calls succeed at once."""

    def __init__(self) -> None:
        async def ok(*args):
            return None

        self.shrink, self.expand, self.stop = _Remote(ok), _Remote(ok), _Remote(ok)


async def _a_training_while_b_waits(stage: Stage, min_residency_s: float, home_guarantee: bool = False):
    """A scheduler actor (the class itself: no Ray) on 2 GPUs: job a holds ``stage`` on GPU 0
    (its training GPU, which both jobs' rollout may use), job b reports 8 trajectories queued."""
    from helpers import spec

    from rlix.core import ClusterSpec, ReportDemand, SchedulerConfig
    from rlix.exec.service.scheduler_actor import SchedulerActor

    sched = SchedulerActor.__ray_metadata__.modified_class(
        ClusterSpec(nodes=1, gpus_per_node=2),
        "rlix",
        SchedulerConfig(min_residency_s=min_residency_s, home_guarantee=home_guarantee),
        time.time(),
        60.0,
    )
    await sched.start()
    for s in (spec("a", (0,), (0, 1)), spec("b", (1,), (0, 1))):
        await sched.register(s, _Coordinator())
    await sched.request("a", Stage.INIT)
    await sched.release("a", Stage.INIT)
    await sched.request("a", stage)
    await sched.report(ReportDemand(pipeline_id="b", pending=8, batch_size=8))
    return sched


@pytest.mark.parametrize("handover", [True, False])
def test_a_handover_never_lends_the_gpus_between_two_stages(handover):
    """Two stages of one step on GPU 0 while job b waits for rollout GPUs: handed over in one
    call, GPU 0 goes from one stage to the next; released and requested apart, the plan in
    between lends GPU 0 to b's rollout, and the next stage shrinks that worker again."""

    async def scenario():
        sched = await _a_training_while_b_waits(Stage.OLD_LOGPROBS, min_residency_s=5.0)
        if handover:
            reply = await sched.request("a", Stage.ACTOR_TRAIN, after=Stage.OLD_LOGPROBS)
        else:
            await sched.release("a", Stage.OLD_LOGPROBS)
            reply = await sched.request("a", Stage.ACTOR_TRAIN)
        await asyncio.sleep(0.05)  # the plans' expand calls run in the background
        stats = await sched.stats()
        await sched.stop()
        return reply.gpus, stats

    gpus, stats = asyncio.run(scenario())
    assert gpus == (0,)
    assert (stats.expands, stats.shrinks) == ((1, 0) if handover else (2, 1))  # b's worker on GPU 1 (and on 0, shrunk again)


@pytest.mark.parametrize("with_release", [True, False])
def test_the_batch_a_training_opens_is_planned_with_the_release(with_release):
    """Job a trains on GPU 0 while b waits for rollout GPUs. Released with the demand of the
    batch its training opens, GPU 0 goes to a's rollout at once; released first and reported
    after, the plan in between lends GPU 0 to b, and a gets nothing while b's worker there is busy
    and resident."""
    from rlix.core import ReportDemand, WorkerLoad

    opened = ReportDemand(pipeline_id="a", pending=4, batch_size=4, backlog=4)
    busy = ReportDemand(
        pipeline_id="b", pending=6, loads=(WorkerLoad(first_gpu=0, active=1), WorkerLoad(first_gpu=1, active=1)), batch_size=8
    )

    async def scenario():
        sched = await _a_training_while_b_waits(Stage.ACTOR_TRAIN, min_residency_s=60.0)
        if with_release:
            await sched.release("a", Stage.ACTOR_TRAIN, opened)
        else:
            await sched.release("a", Stage.ACTOR_TRAIN)
            await asyncio.sleep(0.05)  # the plan in between: b's worker on GPU 0, busy at once
            await sched.report(busy)
            await sched.report(opened)
        await asyncio.sleep(0.05)  # the plans' expand calls run in the background
        holdings = await sched.holdings()
        await sched.stop()
        return holdings

    assert asyncio.run(scenario()) == ({"a": (0,), "b": (1,)} if with_release else {"b": (0, 1)})


def test_with_the_home_guarantee_a_report_after_the_release_takes_the_home_back():
    """As above, released first and reported after, with ``home_guarantee`` on: a's report takes
    GPU 0 (its home) back from b at once, although b's worker is younger than its residency."""
    from rlix.core import ReportDemand

    async def scenario():
        sched = await _a_training_while_b_waits(Stage.ACTOR_TRAIN, min_residency_s=60.0, home_guarantee=True)
        await sched.release("a", Stage.ACTOR_TRAIN)
        await sched.report(ReportDemand(pipeline_id="a", pending=4, batch_size=4, backlog=4))
        await asyncio.sleep(0.05)  # the plans' expand calls run in the background
        holdings = await sched.holdings()
        await sched.stop()
        return holdings

    assert asyncio.run(scenario()) == {"a": (0,), "b": (1,)}
