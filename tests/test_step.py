"""The step machine (:mod:`rlix.step`) driven by hand, event by event: no simulator, no Ray, no SimPy.

Each test feeds the machine the events an interpreter would (a grant, a stage
loaded, worked, offloaded, a batch rolled out, weights published) and checks
the effects it asks for, in order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

import pytest

from rlix.core import Role, Stage
from rlix.job import STEP_STAGES, pipeline_spec, remaining_path_s, stage_gpus, stage_role, step_sequence
from rlix.metrics import Activity
from rlix.rollout_book import BatchTally
from rlix.step import (
    Book,
    DemandChanged,
    Driver,
    DropBatch,
    Effect,
    Finished,
    JobPlan,
    Load,
    Offload,
    Publish,
    QueueBatch,
    RegisterJob,
    ReleaseGang,
    RequestGang,
    Score,
    StepMachine,
    StreamSpec,
    Work,
    carry_out,
)

INIT, OLD, REF, TRAIN = Stage.INIT, Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS, Stage.ACTOR_TRAIN
FREE, SWITCH, WORK = Activity.FREE, Activity.SWITCH, Activity.WORK
ACTOR = (0, 1)  # actor_train GPUs (old log-probs and training)
REFERENCE = (6,)  # reference GPUs
INIT_GPUS = (0, 1, 6)  # model load: every non-rollout mapping


class R(NamedTuple):
    gpus: Sequence[int]
    gpus_per_worker: int = 1


def make_spec(roles: dict[str, Sequence[int]] | None = None):
    roles = roles if roles is not None else {"actor_train": ACTOR, "actor_infer": (2, 3), "reference": REFERENCE}
    return pipeline_spec(
        pipeline_id="job",
        roles={n: R(tuple(g)) for n, g in roles.items()},
        kind="full_finetune",
        slots_per_worker=2,
        resumable=True,
    )


def size_of(stream: int, step: int) -> int:
    return 4 + step + 10 * stream  # step k of stream 0 has 4 + k trajectories


def make_plan(
    steps: Sequence[int] = (2,),
    stages: Sequence[Stage] = (OLD, TRAIN),
    *,
    staleness: int = 0,
    streaming: bool = False,
    share_load: bool = False,
    stop_reward: float | None = None,
    size: Callable[[int, int], int] = size_of,
) -> JobPlan:
    return JobPlan(
        streams=tuple(StreamSpec(name=f"s{i}", steps=n, stop_reward=stop_reward) for i, n in enumerate(steps)),
        stages=lambda i, k: tuple(stages),
        size=size,
        staleness=staleness,
        streaming=streaming,
        share_load=share_load,
    )


def machine(spec=None, **plan) -> StepMachine:
    return StepMachine(spec or make_spec(), make_plan(**plan))


def load(m: StepMachine, now: float = 0.0) -> list[Effect]:
    """Registration and the model load, answered at once; the effects of its end."""
    m.start(now)
    m.registered(now)
    m.granted(INIT, stage_gpus(m.spec, INIT), now)
    return m.loaded(INIT, now)


def train(
    m: StepMachine, stream: int, step: int, *, reward: float = 0.0, seconds: Sequence[float] = (), now: float = 0.0
) -> list[Effect]:
    """Answer a tick whose Score was asked, stage after stage; the effects that end it (the Publish among them).

    ``seconds``: each stage's compute seconds (default 1.0).
    """
    effects = m.scored(stream, step, reward, now)
    worked = iter(seconds)
    while not any(isinstance(e, Publish) for e in effects):
        (e,) = [e for e in effects if isinstance(e, (RequestGang, Load, Work, Offload))]
        if isinstance(e, RequestGang):
            effects = m.granted(e.stage, stage_gpus(m.spec, e.stage), now)
        elif isinstance(e, Load):
            effects = m.loaded(e.stage, now)
        elif isinstance(e, Work):
            effects = m.worked(e.stage, next(worked, 1.0), now)
        else:
            effects = m.offloaded(e.stage, now)
    return effects


def of(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def release_of(effects: list[Effect]) -> ReleaseGang:
    (release,) = of(effects, ReleaseGang)
    return release


def demand(m: StepMachine, pending: int = 0, longest_s: float = 10.0):
    """The machine's report with ``pending`` trajectories waiting in its book (what the shell queued of its batches)."""
    m.book.queue.clear()
    m.book.queue.extend(range(pending))
    return m.demand(loads=(), trajectory_s=1.0, switch_s=1.0, longest_s=longest_s, finished=0)


def path_s(m: StepMachine, longest_s: float) -> float:
    return demand(m, longest_s=longest_s).path_s


# ------------------------------------------------------------------ model load


def test_model_load_requests_init_gang_books_switch_then_queues_step_0_and_frees_announcing_it():
    m = machine(steps=(3,))
    assert m.start(0.0) == [RegisterJob()]  # the job registers first
    assert m.registered(0.5) == [RequestGang(stage=INIT, role=None)]
    assert m.admitted_s is None
    assert m.granted(INIT, INIT_GPUS, 1.5) == [
        Book(gpus=INIT_GPUS, activity=SWITCH, stage="init"),
        Load(stage=INIT, gpus=INIT_GPUS),
    ]
    assert m.admitted_s == 1.5  # admitted: the job holds GPUs from its grant on
    assert m.loaded(INIT, 9.0) == [
        Book(gpus=INIT_GPUS, activity=FREE, stage=""),
        QueueBatch(stream=0, step=0, size=4, version=0),
        ReleaseGang(stage=INIT, announce=4),  # the release carries the first batch's report
    ]
    assert m.held == {}
    assert [(r.step, r.rollout_start) for r in m.history] == [(0, 9.0)]


def test_model_load_queues_every_stream_whose_gate_is_open():
    m = machine(steps=(2, 1, 3), staleness=1, streaming=True)
    queued = [(q.stream, q.step) for q in of(load(m), QueueBatch)]
    assert queued == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]  # streaming, staleness 1: two batches each, stream 1 has one step


def test_nothing_is_queued_before_the_model_load_ends():
    m = machine()
    m.start(0.0)
    m.registered(0.0)
    assert of(m.granted(INIT, INIT_GPUS, 0.0), QueueBatch) == []
    assert m.history == [] and m.rollouts.open_trajectories() == 0


# ------------------------------------------------------------------ a whole step


def test_whole_on_policy_step_effect_by_effect():
    m = machine(steps=(2,), stages=(REF, TRAIN))
    load(m, now=0.0)
    assert m.rolled(0, 0, 3.0) == [DemandChanged(urgent=True), Score(stream=0, step=0)]
    assert m.scored(0, 0, 0.5, 4.0) == [RequestGang(stage=REF, role=Role.REFERENCE, after=None)]
    assert m.granted(REF, REFERENCE, 5.0) == [
        Book(gpus=REFERENCE, activity=SWITCH, stage="ref_logprobs"),
        Load(stage=REF, gpus=REFERENCE),
    ]
    assert m.loaded(REF, 6.0) == [Book(gpus=REFERENCE, activity=WORK, stage="ref_logprobs"), Work(stage=REF, stream=0, step=0)]
    assert m.worked(REF, 2.0, 8.0) == [
        Book(gpus=REFERENCE, activity=SWITCH, stage="ref_logprobs"),
        Offload(stage=REF, gpus=REFERENCE, keep=False),
    ]
    assert m.offloaded(REF, 9.0) == [
        Book(gpus=REFERENCE, activity=FREE, stage=""),
        RequestGang(stage=TRAIN, role=Role.ACTOR_TRAIN, after=REF),  # handed over from the stage before
    ]
    assert m.granted(TRAIN, ACTOR, 9.0) == [Book(gpus=ACTOR, activity=SWITCH, stage="actor_train"), Load(stage=TRAIN, gpus=ACTOR)]
    assert m.loaded(TRAIN, 10.0) == [Book(gpus=ACTOR, activity=WORK, stage="actor_train"), Work(stage=TRAIN, stream=0, step=0)]
    assert m.worked(TRAIN, 3.0, 13.0) == [
        Book(gpus=ACTOR, activity=SWITCH, stage="actor_train"),
        Offload(stage=TRAIN, gpus=ACTOR),
    ]
    assert m.offloaded(TRAIN, 14.0) == [
        Book(gpus=ACTOR, activity=FREE, stage=""),
        ReleaseGang(stage=TRAIN, announce=5),  # the batch this training opens: step 1, 5 trajectories
        Publish(stream=0, version=1, last=False),
    ]
    assert m.published(0, 15.0) == [QueueBatch(stream=0, step=1, size=5, version=1), DemandChanged(urgent=False)]
    assert m.rollouts.versions() == {0: 1} and m.train_s == 5.0 and m.latencies == [15.0]

    assert m.rolled(0, 1, 20.0) == [DemandChanged(urgent=True), Score(stream=0, step=1)]
    end = train(m, 0, 1, now=21.0)
    assert end[-2:] == [ReleaseGang(stage=TRAIN, announce=0), Publish(stream=0, version=2, last=True)]
    assert m.published(0, 22.0) == [DemandChanged(urgent=False), Finished()]
    assert m.done and m.finished_s == 22.0
    assert [(r.step, r.rollout_start, r.rollout_end, r.train_end) for r in m.history] == [
        (0, 0.0, 3.0, 15.0),
        (1, 15.0, 20.0, 22.0),
    ]


def test_a_step_with_no_stages_publishes_at_once_without_a_release():
    m = machine(steps=(2,), stages=())
    load(m)
    assert m.rolled(0, 0, 1.0)[-1] == Score(stream=0, step=0)
    assert m.scored(0, 0, 0.0, 1.0) == [Publish(stream=0, version=1, last=False)]
    assert of(m.published(0, 1.0), QueueBatch) == [QueueBatch(stream=0, step=1, size=5, version=1)]


# ------------------------------------------------------------------ staleness gate


def test_staleness_0_queues_the_next_batch_only_once_the_step_is_published():
    m = machine(steps=(3,), staleness=0)
    assert of(load(m), QueueBatch) == [QueueBatch(stream=0, step=0, size=4, version=0)]
    assert of(m.rolled(0, 0, 1.0), QueueBatch) == []
    end = train(m, 0, 0)
    assert of(end, QueueBatch) == []
    assert of(m.published(0, 2.0), QueueBatch) == [QueueBatch(stream=0, step=1, size=5, version=1)]


def test_staleness_1_batch_mode_queues_step_1_after_step_0_rollout_and_step_2_after_step_0_trained():
    m = machine(steps=(3,), staleness=1)
    assert [q.step for q in of(load(m), QueueBatch)] == [0]  # batch mode: step 1 waits for step 0's rollout
    rolled0 = m.rolled(0, 0, 1.0)
    assert rolled0 == [QueueBatch(stream=0, step=1, size=5, version=0), DemandChanged(urgent=True), Score(stream=0, step=0)]
    assert of(m.rolled(0, 1, 2.0), QueueBatch) == []  # step 2 waits for step 0 trained
    end = train(m, 0, 0)
    assert release_of(end).announce == 6  # step 1 rolled: only the gate held step 2 back
    after = m.published(0, 3.0)
    assert of(after, QueueBatch) == [QueueBatch(stream=0, step=2, size=6, version=1)]
    assert after[-1] == Score(stream=0, step=1)  # step 1 rolled out already: its training turn follows


def test_staleness_1_streaming_queues_step_1_at_the_load_without_waiting_for_step_0_rollout():
    m = machine(steps=(3,), staleness=1, streaming=True)
    assert [q.step for q in of(load(m), QueueBatch)] == [0, 1]
    assert m.rolled(0, 1, 1.0) == [DemandChanged(urgent=True)]  # step 1 done first: it is trained after step 0
    assert m.rolled(0, 0, 2.0) == [DemandChanged(urgent=True), Score(stream=0, step=0)]
    train(m, 0, 0)
    after = m.published(0, 3.0)
    assert of(after, QueueBatch) == [QueueBatch(stream=0, step=2, size=6, version=1)]
    assert after[-1] == Score(stream=0, step=1)


def test_staleness_0_streaming_still_waits_for_the_publish():
    m = machine(steps=(2,), staleness=0, streaming=True)
    assert [q.step for q in of(load(m), QueueBatch)] == [0]
    assert of(m.rolled(0, 0, 1.0), QueueBatch) == []
    train(m, 0, 0)
    assert of(m.published(0, 2.0), QueueBatch) == [QueueBatch(stream=0, step=1, size=5, version=1)]


def test_rolled_keeps_the_oldest_weight_version_its_trajectories_used():
    m = machine(steps=(3,), staleness=1, streaming=True)
    load(m)
    m.rolled(0, 0, 1.0)
    train(m, 0, 0)
    m.published(0, 2.0)  # queues step 2 on version 1
    m.rolled(0, 2, 3.0, oldest_version=0)
    assert [r.version for r in m.history] == [0, 0, 0]
    m.rolled(0, 1, 3.0, oldest_version=5)  # never newer than the version it was queued on
    assert m.history[1].version == 0


def test_a_tally_ends_its_batch_at_the_last_finish_with_the_oldest_version_any_used():
    tally = BatchTally(3)
    assert tally.finished(2) is False and tally.oldest == 2
    assert tally.finished(1) is False  # finished second, on older weights (it started before a sync)
    assert tally.finished(3) is True and tally.oldest == 1


# ------------------------------------------------------------------ announce


def test_last_release_announces_the_next_batch_and_demand_counts_it_as_queued_until_produced():
    m = machine(steps=(3,))
    load(m)
    m.rolled(0, 0, 1.0)
    before = demand(m, pending=2)
    assert (before.pending, before.batch_size, before.backlog) == (2, 0, 5 + 6)
    end = train(m, 0, 0)
    assert release_of(end) == ReleaseGang(stage=TRAIN, announce=5)
    announced = demand(m, pending=2)
    assert (announced.pending, announced.batch_size, announced.backlog) == (2 + 5, 5, 6)
    m.published(0, 2.0)  # QueueBatch: the batch is open now, its trajectories are the engine's to count as pending
    produced = demand(m, pending=2)
    assert (produced.pending, produced.batch_size, produced.backlog) == (2, 5, 6)
    assert m.rollouts.announced == {}


def test_announce_is_0_on_the_last_step():
    m = machine(steps=(1,))
    load(m)
    m.rolled(0, 0, 1.0)
    assert release_of(train(m, 0, 0)) == ReleaseGang(stage=TRAIN, announce=0)
    assert m.rollouts.announced == {}


def test_announce_is_0_when_the_next_batch_is_already_queued_and_still_rolling_out():
    m = machine(steps=(3,), staleness=1)
    load(m)
    m.rolled(0, 0, 1.0)  # queues step 1 (the gate is open for it)
    assert release_of(train(m, 0, 0)).announce == 0  # step 2 waits for step 1's rollout, not for this training
    assert of(m.published(0, 2.0), QueueBatch) == []
    assert of(m.rolled(0, 1, 3.0), QueueBatch) == [QueueBatch(stream=0, step=2, size=6, version=1)]


def test_announce_is_0_when_every_remaining_batch_is_already_queued():
    m = machine(steps=(3,), staleness=2, streaming=True)
    assert len(of(load(m), QueueBatch)) == 3
    m.rolled(0, 0, 1.0)
    assert release_of(train(m, 0, 0)).announce == 0


def test_streaming_announce_ignores_the_rollout_before():
    m = machine(steps=(4,), staleness=1, streaming=True)
    load(m)  # steps 0 and 1
    m.rolled(0, 0, 1.0)
    assert release_of(train(m, 0, 0)).announce == 6  # step 2, though step 1 is still rolling out


# ------------------------------------------------------------------ stop_reward


def test_stop_reward_makes_the_step_last_and_finishes_the_job():
    m = machine(steps=(5,), stop_reward=1.0)
    load(m)
    m.rolled(0, 0, 1.0)
    assert of(train(m, 0, 0, reward=0.5), Publish) == [Publish(stream=0, version=1, last=False)]
    assert of(m.published(0, 2.0), QueueBatch) == [QueueBatch(stream=0, step=1, size=5, version=1)]
    m.rolled(0, 1, 3.0)
    end = train(m, 0, 1, reward=1.0)
    assert end[-2:] == [ReleaseGang(stage=TRAIN, announce=0), Publish(stream=0, version=2, last=True)]
    assert m.rollouts.planned_steps() == 5  # not stopped until the weights are published
    assert m.published(0, 4.0) == [DemandChanged(urgent=False), Finished()]
    assert m.rollouts.backlog() == 0 and m.rollouts.planned_steps() == 2 and path_s(m, 10.0) == 0.0
    assert demand(m).backlog == 0


def test_a_stopped_stream_leaves_the_others_running():
    m = machine(steps=(3, 2), stop_reward=1.0)
    load(m)
    m.rolled(0, 0, 1.0)
    train(m, 0, 0, reward=2.0)
    assert m.published(0, 2.0) == [DemandChanged(urgent=False)]  # stream 1 still runs: no Finished
    assert m.rollouts.backlog() == 15 and m.rollouts.planned_steps() == 1 + 2  # stream 1's step 1 is still to produce
    m.rolled(1, 0, 3.0)
    train(m, 1, 0)
    m.published(1, 4.0)
    m.rolled(1, 1, 5.0)
    train(m, 1, 1)
    assert m.published(1, 6.0)[-1] == Finished()


def test_a_stopped_stream_drops_the_batch_it_had_queued_and_trains_nothing_after_its_last_publish():
    """Staleness 1: step 1 is queued before step 0 is trained; step 0 reaches the stop reward, so step 1
    is dropped (never trained, no longer produced) and the job finishes with that publish."""
    m = machine(steps=(5,), staleness=1, stop_reward=1.0)
    load(m)
    (step1,) = of(m.rolled(0, 0, 1.0), QueueBatch)
    produced = m.rollouts.produced
    end = train(m, 0, 0, reward=2.0)
    assert of(end, Publish) == [Publish(stream=0, version=1, last=True)]
    after = m.published(0, 2.0)
    assert of(after, DropBatch) == [DropBatch(stream=0, step=1)]
    assert of(after, Score) == [] and of(after, Finished) == [Finished()]
    assert step1.step == 1 and m.rollouts.produced == produced - step1.size and m.rollouts.planned_steps() == 1
    assert demand(m).batch_size == 0 and demand(m).backlog == 0


# ------------------------------------------------------------------ two streams


def test_two_streams_train_one_tick_at_a_time_first_rolled_first_trained():
    m = machine(steps=(2, 2))
    assert [(q.stream, q.step) for q in of(load(m), QueueBatch)] == [(0, 0), (1, 0)]
    assert m.rolled(1, 0, 1.0) == [DemandChanged(urgent=True), Score(stream=1, step=0)]
    assert m.rolled(0, 0, 2.0) == [DemandChanged(urgent=True)]  # stream 1 holds the training turn
    end = train(m, 1, 0)
    assert of(end, Score) == []
    with pytest.raises(RuntimeError):
        m.scored(0, 0, 0.0, 3.0)
    assert m.published(1, 3.0) == [
        QueueBatch(stream=1, step=1, size=15, version=1),
        DemandChanged(urgent=False),
        Score(stream=0, step=0),
    ]
    assert m.rolled(1, 1, 4.0) == [DemandChanged(urgent=True)]  # stream 0 trains now
    assert of(train(m, 0, 0), Publish) == [Publish(stream=0, version=1, last=False)]
    assert m.published(0, 5.0)[-1] == Score(stream=1, step=1)
    assert m.rollouts.versions() == {0: 1, 1: 1}


# ------------------------------------------------------------------ share_load, warm grant


def _to_first_worked(share_load: bool, stages=(OLD, TRAIN)) -> StepMachine:
    m = machine(stages=stages, share_load=share_load)
    load(m)
    m.rolled(0, 0, 1.0)
    (first,) = of(m.scored(0, 0, 0.0, 1.0), RequestGang)
    m.granted(first.stage, stage_gpus(m.spec, first.stage), 1.0)
    m.loaded(first.stage, 2.0)
    return m


def test_share_load_keeps_the_model_between_stages_on_the_same_gpus():
    m = _to_first_worked(share_load=True)
    assert m.worked(OLD, 1.0, 3.0) == [Offload(stage=OLD, gpus=ACTOR, keep=True)]  # no offload booked
    assert m.offloaded(OLD, 3.0) == [
        Book(gpus=ACTOR, activity=FREE, stage=""),
        RequestGang(stage=TRAIN, role=Role.ACTOR_TRAIN, after=OLD),
    ]
    m.granted(TRAIN, ACTOR, 3.0)
    m.loaded(TRAIN, 3.0)
    assert m.worked(TRAIN, 1.0, 4.0) == [Book(gpus=ACTOR, activity=SWITCH, stage="actor_train"), Offload(stage=TRAIN, gpus=ACTOR)]


def test_without_share_load_the_model_is_offloaded_between_stages_on_the_same_gpus():
    m = _to_first_worked(share_load=False)
    assert m.worked(OLD, 1.0, 3.0) == [
        Book(gpus=ACTOR, activity=SWITCH, stage="old_logprobs"),
        Offload(stage=OLD, gpus=ACTOR, keep=False),
    ]


def test_share_load_offloads_when_the_next_stage_runs_on_other_gpus():
    m = _to_first_worked(share_load=True, stages=(OLD, REF, TRAIN))
    assert m.worked(OLD, 1.0, 3.0) == [
        Book(gpus=ACTOR, activity=SWITCH, stage="old_logprobs"),
        Offload(stage=OLD, gpus=ACTOR, keep=False),
    ]


def test_warm_grant_works_at_once_without_a_load():
    m = machine()
    load(m)
    m.rolled(0, 0, 1.0)
    m.scored(0, 0, 0.0, 1.0)
    assert m.granted(OLD, ACTOR, 2.0, warm=True) == [
        Book(gpus=ACTOR, activity=WORK, stage="old_logprobs"),
        Work(stage=OLD, stream=0, step=0),
    ]


# ------------------------------------------------------------------ resume


def test_resume_before_the_load_continues_from_the_checkpoint():
    m = machine(steps=(6,))
    m.start(0.0)
    m.registered(0.0)
    m.resume(0, 3)
    assert m.rollouts.backlog() == 7 + 8 + 9 and m.rollouts.planned_steps() == 3 and m.rollouts.resumed_steps() == 3
    assert demand(m, longest_s=10.0).path_s == remaining_path_s(3, 0, longest_s=10.0, train_s=0.0)
    m.granted(INIT, INIT_GPUS, 0.0)
    assert of(m.loaded(INIT, 1.0), QueueBatch) == [QueueBatch(stream=0, step=3, size=7, version=3)]
    assert m.rollouts.backlog() == 8 + 9 and m.rollouts.versions() == {0: 3}
    m.rolled(0, 3, 2.0)
    assert of(train(m, 0, 3), Publish) == [Publish(stream=0, version=4, last=False)]


def test_resume_at_the_end_finishes_at_the_load():
    m = machine(steps=(2, 1))
    m.resume(0, 2)
    m.resume(1, 1)
    assert load(m)[-1] == Finished() and m.rollouts.planned_steps() == 0 and m.rollouts.resumed_steps() == 3


# ------------------------------------------------------------------ errors


def test_worked_or_offloaded_for_a_stage_that_is_not_the_current_one_raises():
    m = _to_first_worked(share_load=False)
    with pytest.raises(RuntimeError, match="no training is at stage actor_train"):
        m.worked(TRAIN, 1.0, 3.0)
    with pytest.raises(RuntimeError, match="no training is at stage actor_train"):
        m.offloaded(TRAIN, 3.0)
    m.worked(OLD, 1.0, 3.0)
    m.offloaded(OLD, 4.0)
    with pytest.raises(RuntimeError, match="old_logprobs"):
        m.worked(OLD, 1.0, 5.0)  # done already: the tick is at the next stage
    with pytest.raises(RuntimeError, match="old_logprobs"):
        m.offloaded(OLD, 5.0)


def test_worked_with_no_training_in_progress_raises():
    m = machine()
    load(m)
    with pytest.raises(RuntimeError):
        m.worked(TRAIN, 1.0, 1.0)
    with pytest.raises(RuntimeError):
        m.offloaded(OLD, 1.0)


def test_scored_for_a_step_not_asked_raises():
    m = machine(steps=(3,))
    load(m)
    with pytest.raises(RuntimeError, match="stream 0 step 0 was not asked to be scored"):
        m.scored(0, 0, 0.0, 1.0)  # not rolled out yet
    m.rolled(0, 0, 1.0)
    with pytest.raises(RuntimeError, match="stream 0 step 1 was not asked"):
        m.scored(0, 1, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="stream 1 step 0 was not asked"):
        m.scored(1, 0, 0.0, 1.0)


def test_published_before_the_last_stage_ends_raises():
    m = _to_first_worked(share_load=False)
    with pytest.raises(RuntimeError, match="stream 0 has no training waiting for its weights"):
        m.published(0, 3.0)


# ------------------------------------------------------------------ demand


def test_demand_follows_batches_produced_rolled_out_and_trained():
    m = machine(steps=(3,), stages=(OLD, REF, TRAIN))
    assert (m.rollouts.open_trajectories(), m.rollouts.backlog(), path_s(m, 10.0)) == (
        0,
        4 + 5 + 6,
        30.0,
    )  # three steps of 10 s rollouts
    load(m)
    assert (m.rollouts.open_trajectories(), m.rollouts.backlog()) == (4, 5 + 6)
    m.rolled(0, 0, 1.0)
    assert (m.rollouts.open_trajectories(), m.rollouts.backlog()) == (0, 5 + 6)  # rolled out: no longer open, even while trained
    train(m, 0, 0, seconds=(0.1, 0.2, 0.3))
    assert m.train_s == 0.0  # counted once the step is trained
    m.published(0, 2.0)
    assert 0.1 + 0.2 + 0.3 != 0.6 and m.train_s == 0.6  # the exact sum of the stage seconds
    assert (m.rollouts.open_trajectories(), m.rollouts.backlog()) == (5, 6)
    assert path_s(m, 10.0) == remaining_path_s(2, 0, longest_s=10.0, train_s=0.6) == pytest.approx(2 * 10.0 + 2 * 0.6)
    report = demand(m, pending=3, longest_s=10.0)
    assert (report.pending, report.batch_size, report.backlog, report.path_s) == (3, 5, 6, path_s(m, 10.0))
    m.rolled(0, 1, 3.0)
    train(m, 0, 1, seconds=(0.1, 0.1, 0.1))
    m.published(0, 4.0)
    assert m.train_s == 0.6  # the longest tick so far
    assert path_s(m, 7.0) == remaining_path_s(1, 0, longest_s=7.0, train_s=0.6)


def test_path_s_uses_staleness_and_rollout_mode():
    for staleness, streaming in [(0, False), (1, False), (2, True)]:
        m = machine(steps=(4,), staleness=staleness, streaming=streaming)
        load(m)
        m.rolled(0, 0, 1.0)
        train(m, 0, 0, seconds=(2.0, 3.0))
        m.published(0, 2.0)
        want = remaining_path_s(3, staleness, longest_s=4.0, train_s=5.0, streaming=streaming)
        assert path_s(m, 4.0) == want


# ------------------------------------------------------------------ random jobs to the end


class RandomJob:
    """Drives a random job to its end, answering every effect at some later random moment, and checks the protocol."""

    def __init__(self, seed: int) -> None:
        rng = self.rng = random.Random(seed)
        roles: dict[str, Sequence[int]] = {"actor_train": ACTOR, "actor_infer": (2, 3)}
        critic = rng.random() < 0.5
        if critic:
            roles["critic"] = rng.choice([(4, 5), ACTOR])
        if rng.random() < 0.5:
            roles["reference"] = rng.choice([REFERENCE, ACTOR])
        allowed = [s for s in STEP_STAGES if critic or s not in (Stage.CRITIC_TRAIN, Stage.VALUE_COMPUTE)]
        self.spec = make_spec(roles)
        self.steps = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
        self.stages = {
            (i, k): step_sequence(rng.sample(allowed, rng.randint(0, len(allowed))))
            for i, n in enumerate(self.steps)
            for k in range(n)
        }
        self.sizes = {key: rng.randint(1, 8) for key in self.stages}
        self.staleness = rng.randint(0, 2)
        self.streaming = rng.random() < 0.5
        plan = JobPlan(
            streams=tuple(StreamSpec(name=f"s{i}", steps=n) for i, n in enumerate(self.steps)),
            stages=lambda i, k: self.stages[(i, k)],
            size=lambda i, k: self.sizes[(i, k)],
            staleness=self.staleness,
            streaming=self.streaming,
            share_load=rng.random() < 0.5,
        )
        self.m = StepMachine(self.spec, plan)
        self.now = 0.0
        self.todo: list[Callable[[], list[Effect]]] = []  # answers owed to the machine, given in random order
        self.held: set[Stage] = set()
        self.tick: tuple[int, int] | None = None  # (stream, step) between Score and published
        self.stage: Stage | None = None  # the tick's stage now granted
        self.done_stages = 0  # stages of the tick offloaded so far
        self.queued: dict[int, list[int]] = {i: [] for i in range(len(self.steps))}
        self.rolled: set[tuple[int, int]] = set()
        self.ready: list[tuple[int, int]] = []  # rolled out and next of their stream to train, first ready first
        self.published: dict[int, list[int]] = {i: [] for i in range(len(self.steps))}
        self.trained: list[tuple[int, int]] = []
        self.finished = 0
        self.effects: list[Effect] = []

    def run(self) -> None:
        self.handle(self.m.start(self.now), INIT)
        for _ in range(10_000):
            if not self.todo:
                break
            self.now += self.rng.choice([0.0, 0.5, 1.0])
            answer = self.todo.pop(self.rng.randrange(len(self.todo)))
            answer()
        assert not self.todo

    def later(self, answer: Callable[[], None]) -> None:
        self.todo.append(answer)

    def handle(self, effects: list[Effect], about: Stage | None = None) -> None:
        """Check each effect and owe the machine its answer; ``about``: the stage of the event that produced them."""
        assert self.finished == 0, f"effects after Finished: {effects}"
        self.effects += effects
        m, spec = self.m, self.spec
        for e in effects:
            if isinstance(e, RegisterJob):
                assert self.effects == [e], "the job registers first, and once"
                self.later(lambda: self.handle(m.registered(self.now)))
            elif isinstance(e, Book):
                stage = Stage(e.stage) if e.stage else about
                assert e.gpus == stage_gpus(spec, stage), e
                assert (e.activity is FREE) == (e.stage == ""), e
            elif isinstance(e, RequestGang):
                assert e.role == (None if e.stage is INIT else stage_role(spec, e.stage)), e
                if e.after is not None:
                    assert e.after in self.held and e.after is about
                    self.held.remove(e.after)
                self.later(lambda e=e: self.grant(e.stage))
            elif isinstance(e, ReleaseGang):
                assert e.stage in self.held and e.announce >= 0
                assert e.stage is INIT or self.done_stages == len(self.stages[self.tick])  # other stages hand over
                self.held.remove(e.stage)
            elif isinstance(e, Load):
                assert e.gpus == stage_gpus(spec, e.stage)
                self.later(lambda e=e: self.handle(m.loaded(e.stage, self.now), e.stage))
            elif isinstance(e, Work):
                assert (e.stream, e.step) == self.tick and e.stage is self.stage
                seconds = self.rng.choice([0.5, 1.0, 2.5])
                self.later(lambda e=e, s=seconds: self.handle(m.worked(e.stage, s, self.now), e.stage))
            elif isinstance(e, Offload):
                assert e.gpus == stage_gpus(spec, e.stage) and e.stage is self.stage
                self.later(lambda e=e: self.offloaded(e.stage))
            elif isinstance(e, Score):
                assert self.tick is None, f"{e} while {self.tick} trains"  # one training tick at a time
                assert self.ready and (e.stream, e.step) == self.ready.pop(0)  # in order per stream, first ready first
                self.tick, self.done_stages = (e.stream, e.step), 0
                self.later(lambda e=e: self.handle(m.scored(e.stream, e.step, self.rng.random(), self.now)))
            elif isinstance(e, QueueBatch):
                done = len(self.published[e.stream])
                assert e.step == len(self.queued[e.stream]) and e.version == done
                assert e.step - 1 - self.staleness < done, f"{e} queued with {done} steps trained"  # the staleness bound
                assert self.streaming or e.step == 0 or (e.stream, e.step - 1) in self.rolled  # one batch at a time
                assert e.size == self.sizes[(e.stream, e.step)]
                self.queued[e.stream].append(e.step)
                self.later(lambda e=e: self.roll(e.stream, e.step))
            elif isinstance(e, Publish):
                assert self.tick == (e.stream, e.version - 1) and self.stage is None
                assert self.done_stages == len(self.stages[self.tick])  # every stage of the step ran
                assert self.published[e.stream] == list(range(1, e.version))  # versions only grow, by one
                assert e.last == (e.version == self.steps[e.stream])
                self.later(lambda e=e: self.publish(e.stream, e.version))
            elif isinstance(e, Finished):
                assert e is effects[-1]
                self.finished += 1

    def grant(self, stage: Stage) -> None:
        assert not (self.held - {INIT}), f"{stage} granted while {self.held} held"  # one gang stage at a time
        self.held.add(stage)
        if stage is not INIT:
            self.stage = stage
            assert self.tick is not None and stage is self.stages[self.tick][self.done_stages]  # stages in step order
        warm = stage is not INIT and self.rng.random() < 0.3
        effects = self.m.granted(stage, stage_gpus(self.spec, stage), self.now, warm=warm)
        if warm:
            assert [type(e) for e in effects] == [Book, Work] and effects[0].activity is WORK
        self.handle(effects, stage)

    def offloaded(self, stage: Stage) -> None:
        self.stage = None
        self.done_stages += 1
        self.handle(self.m.offloaded(stage, self.now), stage)

    def roll(self, stream: int, step: int) -> None:
        self.rolled.add((stream, step))
        if step == len(self.published[stream]):
            self.ready.append((stream, step))
        self.handle(self.m.rolled(stream, step, self.now))

    def publish(self, stream: int, version: int) -> None:
        self.published[stream].append(version)
        self.trained.append((stream, version - 1))
        self.tick = None
        if (stream, version) in self.rolled:
            self.ready.append((stream, version))
        self.handle(self.m.published(stream, self.now))


@pytest.mark.parametrize("seed", range(150))
def test_random_jobs_train_every_step_once_in_order_within_the_staleness_bound(seed):
    job = RandomJob(seed)
    job.run()
    assert job.finished == 1 and isinstance(job.effects[-1], Finished)
    for i, n in enumerate(job.steps):
        assert job.published[i] == list(range(1, n + 1))
        assert [k for s, k in job.trained if s == i] == list(range(n))
        assert job.queued[i] == list(range(n))
    assert job.held == set() and job.m.done and job.m.rollouts.open == {} and job.m.rollouts.backlog() == 0
    assert job.m.rollouts.planned_steps() == sum(job.steps) and len(job.m.latencies) == sum(job.steps)


def test_every_effect_has_an_interpreter_method_and_both_shells_implement_them_all():
    import typing

    from rlix.exec.job.step_runner import StepRunner
    from rlix.sim.pipeline import SimPipeline
    from rlix.step import _HANDLERS, Interpreter

    effects = set(typing.get_args(Effect))
    assert set(_HANDLERS) == effects
    for name in _HANDLERS.values():
        assert callable(getattr(Interpreter, name))
        for shell in (SimPipeline, StepRunner):
            assert callable(getattr(shell, name, None)), f"{shell.__name__} does not carry out {name}"


def test_a_batch_rolled_out_twice_or_a_grant_for_a_stage_no_training_is_at_raises():
    m = machine(steps=(2,))
    load(m)
    m.rolled(0, 0, 1.0)
    with pytest.raises(RuntimeError, match="not rolling out"):
        m.rolled(0, 0, 1.5)  # a repeat would train the step twice
    with pytest.raises(RuntimeError, match="no training is at stage"):
        m.granted(Stage.ACTOR_TRAIN, (0,), 2.0)  # the step waits for its score: no stage was requested


def test_the_declared_open_limit_is_the_largest_batch_times_the_batches_open_together():
    sizes = lambda i, k: [[4, 6, 5], [3, 3]][i][k]  # noqa: E731  two streams (adapters) of different batches
    assert make_plan(steps=(3, 2), size=sizes).open_limit() == 6 + 3  # batch mode: one batch per stream
    assert make_plan(steps=(3, 2), size=sizes, staleness=2).open_limit() == 6 + 3  # it waits for the one before
    assert make_plan(steps=(3, 2), size=sizes, staleness=2, streaming=True).open_limit() == 3 * (6 + 3)
    m = machine(steps=(3, 2), size=sizes)
    assert (m.spec.open_limit, m.spec.total_trajectories, m.spec.batch_credit) == (9, 15 + 6, True)  # what it registers
    # batches credited one by one unless a stream's next batch may open while another stream's runs
    assert make_plan(steps=(3,), staleness=1).batch_credit()
    assert not make_plan(steps=(3, 2), staleness=1).batch_credit()
    assert make_plan(steps=(3, 2), staleness=1, streaming=True).batch_credit()
    assert make_plan(steps=(3,), stages=()).batch_credit()  # one stream in batch mode: a batch waits for the last
    assert not make_plan(steps=(3,), stages=(), streaming=True).batch_credit()  # no training to wait for


# ------------------------------------------------------------------ effects carried out in the machine's order


class _AtOnce:
    """A shell that answers every effect at once, from inside its handler: a batch rolls out, a stage
    loads, works and offloads, a score and a publish return, all before the handler does. Records each
    list the machine returns, in the order the events were told, and each effect as it is carried out."""

    def __init__(self, m: StepMachine, nested: bool) -> None:
        self.m, self.nested, self.told, self.done = m, nested, [], []
        self.driver = Driver(self)

    def tell(self, event: Callable[[], list[Effect]]) -> None:
        def told() -> list[Effect]:
            effects = event()
            self.told.append(list(effects))
            return effects

        if self.nested:  # what both shells did before the driver: carry out the answer's effects in place
            carry_out(told(), self)
        else:
            self.driver.feed(told)

    def _answer(self, e: Effect, event: Callable[[], list[Effect]]) -> None:
        self.done.append(e)
        self.tell(event)

    def register_job(self, e: RegisterJob) -> None:
        self._answer(e, lambda: self.m.registered(0.0))

    def request_gang(self, e: RequestGang) -> None:
        self._answer(e, lambda: self.m.granted(e.stage, stage_gpus(self.m.spec, e.stage), 0.0))

    def load(self, e: Load) -> None:
        self._answer(e, lambda: self.m.loaded(e.stage, 0.0))

    def work(self, e: Work) -> None:
        self._answer(e, lambda: self.m.worked(e.stage, 1.0, 0.0))

    def offload(self, e: Offload) -> None:
        self._answer(e, lambda: self.m.offloaded(e.stage, 0.0))

    def score(self, e: Score) -> None:
        self._answer(e, lambda: self.m.scored(e.stream, e.step, 0.0, 0.0))

    def queue_batch(self, e: QueueBatch) -> None:
        self._answer(e, lambda: self.m.rolled(e.stream, e.step, 0.0))

    def publish(self, e: Publish) -> None:
        self._answer(e, lambda: self.m.published(e.stream, 0.0))

    def _carried_out(self, e: Effect) -> None:
        self.done.append(e)

    release_gang = book = drop_batch = demand_changed = finished = _carried_out


def test_an_effect_answered_at_once_waits_for_the_rest_of_its_list():
    """A handler's answer is told to the machine only once the list holding its effect is carried out:
    the effects carried out are the machine's lists one after another, never one inside another."""
    shell = _AtOnce(machine(steps=(3,), stages=(OLD, TRAIN)), nested=False)
    shell.tell(lambda: shell.m.start(0.0))
    assert shell.m.done and isinstance(shell.done[-1], Finished)
    assert shell.done == [e for effects in shell.told for e in effects]
    # a publish opens the next batch and then says demand changed: that is carried out before the
    # batch's roll-out (answered at once) says demand changed again and asks for its score
    assert after_each_queued_batch(shell.done) == [DemandChanged(urgent=False)] * 2
    # carried out in place instead, the same answers interleave the lists
    nested = _AtOnce(machine(steps=(3,), stages=(OLD, TRAIN)), nested=True)
    nested.tell(lambda: nested.m.start(0.0))
    assert nested.m.done and nested.done != [e for effects in nested.told for e in effects]
    assert after_each_queued_batch(nested.done) == [DemandChanged(urgent=True)] * 2


def after_each_queued_batch(done: list[Effect]) -> list[Effect]:
    """The effect carried out right after each QueueBatch after the first (those a publish opened)."""
    return [done[i + 1] for i, e in enumerate(done) if isinstance(e, QueueBatch)][1:]


def test_what_a_handler_raises_reaches_the_caller_and_drops_the_events_waiting():
    shell = _AtOnce(machine(steps=(2,), stages=(OLD, TRAIN)), nested=False)

    def broken(e: Score) -> None:
        shell.tell(lambda: pytest.fail("an event that waited behind a failed list was told"))
        raise RuntimeError("the reward function raised")

    shell.score = broken
    shell.m.start(0.0)
    shell.m.registered(0.0)  # asks for the model load's GPUs, granted below
    with pytest.raises(RuntimeError, match="reward function"):
        shell.driver.feed(lambda: shell.m.granted(INIT, stage_gpus(shell.m.spec, INIT), 0.0))
    shell.done.clear()
    shell.driver.feed(lambda: [DemandChanged(urgent=False)])  # the driver is free again
    assert shell.done == [DemandChanged(urgent=False)]


def test_the_job_registers_once_before_anything_else():
    m = machine()
    with pytest.raises(RuntimeError, match="registered before start"):
        m.registered(0.0)
    assert m.start(0.0) == [RegisterJob()]
    with pytest.raises(RuntimeError, match="started twice"):
        m.start(0.0)
    m.registered(0.0)
    with pytest.raises(RuntimeError, match="registered twice"):
        m.registered(0.0)
