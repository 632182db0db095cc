"""The shared job model: the rules of an RL step both shells call."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlix.config import RoleModel
from rlix.core import JobKind, Role, Stage, WorkerLoad
from rlix.job import (
    GangPhase,
    JobModelError,
    JobShape,
    StepShape,
    WeightGate,
    check_stage_roles,
    demand_report,
    executor_stages,
    gang_activity,
    lower_bounds,
    pipeline_spec,
    remaining_path_s,
    rollout_gate,
    rollout_may_start,
    stage_gpus,
    stage_role,
    step_sequence,
    weight_gate,
)
from rlix.metrics import Activity


def spec(**roles):
    models = {name: RoleModel(gpus=gpus, gpus_per_worker=tp) for name, (gpus, tp) in roles.items()}
    return pipeline_spec(pipeline_id="p", roles=models, kind="full_finetune", slots_per_worker=2, resumable=True)


def test_step_sequence_orders_stages_and_refuses_non_step_stages():
    assert step_sequence([Stage.ACTOR_TRAIN, Stage.OLD_LOGPROBS]) == (Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN)
    assert executor_stages(kl=False) == (Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN)
    assert executor_stages(kl=True) == (Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS, Stage.ACTOR_TRAIN)
    with pytest.raises(JobModelError, match="rollout is not a stage of a step"):
        step_sequence([Stage.ROLLOUT])


def test_reference_falls_back_to_training_gpus_and_missing_roles_are_named():
    s = spec(actor_train=([0, 1], 1), actor_infer=([0, 1, 2, 3], 2))
    assert stage_role(s, Stage.REF_LOGPROBS) is Role.ACTOR_TRAIN
    assert stage_gpus(s, Stage.REF_LOGPROBS) == (0, 1)
    assert stage_gpus(s, Stage.INIT) == (0, 1)
    with_ref = spec(actor_train=([0, 1], 1), actor_infer=([0, 1], 1), reference=([2], 1))
    assert stage_gpus(with_ref, Stage.REF_LOGPROBS) == (2,)
    assert stage_gpus(with_ref, Stage.INIT) == (0, 1, 2)
    with pytest.raises(JobModelError, match="needs a 'critic' role mapping; add roles.critic"):
        check_stage_roles(s, [Stage.OLD_LOGPROBS, Stage.CRITIC_TRAIN])


@pytest.mark.parametrize(
    "step, staleness, gate", [(0, 0, None), (1, 0, 0), (5, 0, 4), (1, 1, None), (2, 1, 0), (2, 2, None), (7, 2, 4)]
)
def test_staleness_gate(step, staleness, gate):
    assert rollout_gate(step, staleness) == gate
    if gate is None:
        assert rollout_may_start(step, 0, staleness)
    else:
        assert not rollout_may_start(step, gate, staleness)  # step `gate` not trained yet
        assert rollout_may_start(step, gate + 1, staleness)


def test_demand_report_has_one_meaning():
    r = demand_report(
        pipeline_id="p",
        pending=3,
        loads=[WorkerLoad(first_gpu=4, active=1), WorkerLoad(first_gpu=0, active=2)],
        open_trajectories=8,
        backlog=16,
        trajectory_s=2.5,
        path_s=40.0,
    )
    assert [w.first_gpu for w in r.loads] == [0, 4]
    assert (r.pending, r.batch_size, r.backlog, r.trajectory_s, r.path_s) == (3, 8, 16, 2.5, 40.0)
    for bad in ({"pending": -1}, {"pending": 0, "path_s": -1.0}):
        with pytest.raises(JobModelError):
            demand_report(pipeline_id="p", **bad)


def test_the_chain_still_ahead_is_chained_as_the_critical_path_is():
    # 3 steps left, the slowest trajectory seen 10 s, the longest training 4 s
    assert remaining_path_s(3, 0, longest_s=10.0, train_s=4.0) == pytest.approx(3 * (10 + 4))  # on-policy: all in series
    assert remaining_path_s(3, 1, longest_s=10.0, train_s=4.0) == pytest.approx(3 * 10 + 4)  # trainings overlap the next rollout
    assert remaining_path_s(0, 0, longest_s=10.0, train_s=4.0) == 0.0  # nothing left


def test_pipeline_spec_sorts_and_keeps_resumable():
    s = pipeline_spec(
        pipeline_id="j",
        roles={"actor_infer": RoleModel(gpus=[3, 2]), "actor_train": RoleModel(gpus=[1, 0])},
        kind="multi_lora",
        slots_per_worker=4,
        home=[1, 0],
        resumable=True,
    )
    assert s.kind is JobKind.MULTI_LORA and s.resumable and s.home == (0, 1)
    assert [r.role for r in s.roles] == [Role.ACTOR_INFER, Role.ACTOR_TRAIN]
    assert s.role(Role.ACTOR_INFER).gpus == (2, 3)


def test_gang_phases_book_switch_work_switch_free():
    phases = [GangPhase.LOAD, GangPhase.WORK, GangPhase.OFFLOAD, GangPhase.RELEASED]
    assert [gang_activity(Stage.ACTOR_TRAIN, p) for p in phases] == [
        Activity.SWITCH,
        Activity.WORK,
        Activity.SWITCH,
        Activity.FREE,
    ]
    assert gang_activity(Stage.INIT, GangPhase.WORK) is Activity.SWITCH  # model load is switching throughout


def _job(staleness: int) -> JobShape:
    s = spec(actor_train=([0, 1], 1), actor_infer=([0, 1, 2, 3], 2))
    step = StepShape(trajectory_s=14.0, longest_s=10.0, stages=((Stage.OLD_LOGPROBS, 2.0), (Stage.ACTOR_TRAIN, 3.0)))
    return JobShape(spec=s, arrival_s=0.0, init_s=5.0, staleness=staleness, streams=((step, step),))


def test_lower_bounds_count_tp_width_and_staleness_overlap():
    # work: init 5 s x 2 GPUs + per step (14 trajectory-s x TP 2 / 2 slots + 5 stage-s x 2 GPUs) x 2 steps
    serial, _ = lower_bounds([_job(0)], num_gpus=1)
    assert serial == pytest.approx(10 + 2 * (14 + 10))
    # on 4 GPUs the chain tightens it: the model load (10 GPU-s) is followed by 30 s of the job's chain
    work, path = lower_bounds([_job(0)], num_gpus=4)
    assert work == pytest.approx(30 + 10 / 4)
    assert path == pytest.approx(5 + 10 + 5 + 10 + 5)  # on-policy: step 1's rollout waits for step 0's training
    _, overlapped = lower_bounds([_job(1)], num_gpus=4)
    assert overlapped == pytest.approx(5 + 10 + 10 + 5)  # staleness 1: step 1 rolls out while step 0 trains


def _cotenant(pid: str, train: list[int], infer: list[int], arrival_s: float) -> JobShape:
    models = {"actor_train": RoleModel(gpus=train, gpus_per_worker=1), "actor_infer": RoleModel(gpus=infer, gpus_per_worker=1)}
    s = pipeline_spec(pipeline_id=pid, roles=models, kind="full_finetune", slots_per_worker=2, resumable=True)
    step = StepShape(trajectory_s=4.0, longest_s=10.0, stages=((Stage.OLD_LOGPROBS, 2.0), (Stage.ACTOR_TRAIN, 3.0)))
    return JobShape(spec=s, arrival_s=arrival_s, init_s=5.0, staleness=0, streams=((step,),))


def test_critical_path_adds_the_co_tenants_gang_stages_that_stop_the_job():
    # alone: model load 5 s, then rollout 10 s, then 2 + 3 s of stages: 20 s
    _, alone = lower_bounds([_cotenant("a", [0, 1, 2, 3], [0, 1, 2, 3], 0.0)], num_gpus=4)
    assert alone == pytest.approx(20.0)
    # a co-tenant whose gang stages span every GPU: while its load (5 s) and stages (2 + 3 s) hold
    # the node, no part of the first job's chain can go on, so they add to it
    both = [_cotenant("a", [0, 1, 2, 3], [0, 1, 2, 3], 0.0), _cotenant("b", [0, 1, 2, 3], [0, 1, 2, 3], 0.0)]
    assert lower_bounds(both, num_gpus=4)[1] == pytest.approx(20.0 + 10.0)
    # stages that could have run before the job arrived do not count: b's load starts at 0, a arrives at 4
    late = [_cotenant("a", [0, 1, 2, 3], [0, 1, 2, 3], 4.0), _cotenant("b", [0, 1, 2, 3], [0, 1, 2, 3], 0.0)]
    assert lower_bounds(late, num_gpus=4)[1] == pytest.approx(max(4.0 + 20.0 + 5.0, 0.0 + 20.0 + 5.0 + 5.0))
    # a co-tenant training on GPUs 0-1 leaves GPUs 2-3 to the first job's rollout: no addition
    # (its stages overlap the first job's gang stages, but the rollout goes on beside them)
    narrow = [_cotenant("a", [0, 1, 2, 3], [0, 1, 2, 3], 0.0), _cotenant("b", [0, 1], [0, 1, 2, 3], 0.0)]
    assert lower_bounds(narrow, num_gpus=4)[1] == pytest.approx(20.0 + 10.0)  # b is stopped by a's gangs, not a by b's
    # disjoint gang stages never stop one another's rollout on its own GPUs
    apart = [_cotenant("a", [0, 1], [0, 1], 0.0), _cotenant("b", [2, 3], [2, 3], 0.0)]
    assert lower_bounds(apart, num_gpus=4)[1] == pytest.approx(20.0)


def _adapters(train: list[int], count: int) -> JobShape:
    infer = RoleModel(gpus=[0, 1, 2, 3], gpus_per_worker=1)
    models = {"actor_train": RoleModel(gpus=train, gpus_per_worker=1), "actor_infer": infer}
    s = pipeline_spec(pipeline_id="m", roles=models, kind="multi_lora", slots_per_worker=2, resumable=True)
    step = StepShape(trajectory_s=4.0, longest_s=10.0, stages=((Stage.OLD_LOGPROBS, 2.0), (Stage.ACTOR_TRAIN, 3.0)))
    return JobShape(spec=s, arrival_s=0.0, init_s=5.0, staleness=0, streams=((step,),) * count)


def test_critical_path_adds_a_jobs_other_adapters_gang_stages_that_stop_it():
    # one adapter: model load 5 s, rollout 10 s, stages 2 + 3 s
    assert lower_bounds([_adapters([0, 1, 2, 3], 1)], num_gpus=4)[1] == pytest.approx(20.0)
    # every other adapter's stages hold the whole rollout mapping: while they run, this adapter's
    # chain cannot move, so they add (5 s each)
    assert lower_bounds([_adapters([0, 1, 2, 3], 2)], num_gpus=4)[1] == pytest.approx(25.0)
    assert lower_bounds([_adapters([0, 1, 2, 3], 3)], num_gpus=4)[1] == pytest.approx(30.0)
    # training on GPUs 0-1 leaves GPUs 2-3 to the rollout: nothing adds
    assert lower_bounds([_adapters([0, 1], 3)], num_gpus=4)[1] == pytest.approx(20.0)
    # beside a short co-tenant over the same GPUs, both add: its model load (5 s) and training (1 s)
    short = StepShape(trajectory_s=1.0, longest_s=1.0, stages=((Stage.ACTOR_TRAIN, 1.0),))
    b = replace(_cotenant("b", [0, 1, 2, 3], [0, 1, 2, 3], 0.0), streams=((short,),))
    assert lower_bounds([_adapters([0, 1, 2, 3], 2), b], num_gpus=4)[1] == pytest.approx(25.0 + 5.0 + 1.0)


@pytest.mark.parametrize(
    ("have", "need", "newest", "idle", "streaming", "partial", "expected"),
    [
        (1, 1, 1, False, False, False, (WeightGate.START, 1)),  # new enough: starts, busy or not
        (1, 1, 2, True, False, False, (WeightGate.START, 1)),  # batch mode: an idle worker stays on what suffices
        (1, 1, 2, True, True, False, (WeightGate.SYNC, 2)),  # streaming: an idle worker moves to the newest first
        (1, 1, 2, False, True, False, (WeightGate.START, 1)),  # ... a busy one keeps going
        (0, 2, 2, True, False, False, (WeightGate.SYNC, 2)),  # too old, idle: sync to what the batch needs
        (0, 1, 2, True, False, False, (WeightGate.SYNC, 2)),  # a sync brings the newest (all a trainer keeps)
        (0, 1, 2, False, False, False, (WeightGate.WAIT, 2)),  # too old and busy: drain first
        (0, 1, 2, False, True, False, (WeightGate.WAIT, 2)),
        (0, 1, 2, False, True, True, (WeightGate.SYNC, 2)),  # partial rollout: sync under running trajectories
        (-1, 0, 0, True, False, False, (WeightGate.SYNC, 0)),  # no weights at all
    ],
)
def test_the_weight_gate(have, need, newest, idle, streaming, partial, expected):
    assert weight_gate(have, need, newest, idle=idle, streaming=streaming, partial=partial) == expected
