"""Property tests: invariants of every plan over random clusters and event sequences."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlix.core import (
    POLICIES,
    ClusterSpec,
    GangHolder,
    PipelineSpec,
    Register,
    ReleaseStage,
    ReportDemand,
    RequestStage,
    Role,
    RoleSpec,
    RolloutWorker,
    Scheduler,
    SchedulerConfig,
    Stage,
    Unregister,
    WorkerLoad,
    check_ledger,
)

GANG_STAGES = [Stage.ACTOR_TRAIN, Stage.OLD_LOGPROBS, Stage.REF_LOGPROBS, Stage.INIT]


@st.composite
def clusters(draw):
    return ClusterSpec(nodes=draw(st.integers(1, 3)), gpus_per_node=draw(st.sampled_from([2, 4, 8])))


@st.composite
def pipelines(draw, cluster: ClusterSpec, pid: str):
    n = cluster.num_gpus
    gpn = cluster.gpus_per_node
    tp = draw(st.sampled_from([t for t in (1, 2) if gpn % t == 0]))
    bundles = [tuple(range(b, b + tp)) for b in range(0, n, tp)]
    chosen = draw(st.lists(st.sampled_from(bundles), min_size=1, max_size=len(bundles), unique=True))
    infer = tuple(sorted(g for b in chosen for g in b))
    lo = draw(st.integers(0, n - 1))
    hi = draw(st.integers(lo, min(n - 1, lo + 2 * gpn)))
    train = tuple(range(lo, hi + 1))
    roles = [RoleSpec(role=Role.ACTOR_TRAIN, gpus=train), RoleSpec(role=Role.ACTOR_INFER, gpus=infer, gpus_per_worker=tp)]
    if draw(st.booleans()):
        r0 = draw(st.integers(0, n - 1))
        roles.append(RoleSpec(role=Role.REFERENCE, gpus=tuple(range(r0, min(n, r0 + gpn)))))
    home = tuple(sorted(set(train) | set(chosen[0])))  # at least one rollout bundle at home
    return PipelineSpec(
        pipeline_id=pid,
        roles=tuple(roles),
        slots_per_worker=draw(st.integers(1, 4)),
        home=home,
        resumable=draw(st.booleans()),
        priority=draw(st.sampled_from((0, 0, 1, -1))),
    )


@st.composite
def scenarios(draw):
    cluster = draw(clusters())
    specs = [draw(pipelines(cluster, f"p{i}")) for i in range(draw(st.integers(1, 4)))]
    actions = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["request", "release", "demand", "demand", "demand", "unregister", "wait"]),
                st.integers(0, len(specs) - 1),
                st.sampled_from(GANG_STAGES),
                st.integers(0, 40),  # pending trajectories
                st.floats(0.5, 120.0),  # seconds until this action
            ),
            min_size=1,
            max_size=40,
        )
    )
    return cluster, specs, actions, draw(st.booleans())


def run_and_check(policy: str, cluster, specs, actions, by_duration: bool) -> None:
    config = SchedulerConfig(report_ttl_s=200.0, min_residency_s=20.0, weight_by_duration=by_duration)
    sched = Scheduler(cluster, policy, config)
    now = 0.0
    sched.step(now, [Register(spec=s) for s in specs])
    live = {s.pipeline_id: s for s in specs}
    requested: set[tuple[str, Stage]] = set()
    granted: set[tuple[str, Stage]] = set()
    reports: dict[str, tuple[float, ReportDemand]] = {}
    for kind, idx, stage, pending, dt in actions:
        now += dt
        pid = specs[idx].pipeline_id
        if pid not in live:
            continue
        if kind == "request" and (pid, stage) not in requested:
            if stage is Stage.REF_LOGPROBS and not live[pid].has_role(Role.REFERENCE):
                continue
            sched.submit(RequestStage(pipeline_id=pid, stage=stage), now)
            requested.add((pid, stage))
        elif kind == "release":
            mine = sorted((k for k in requested if k[0] == pid), key=lambda k: k[1].priority)
            if not mine:
                continue
            sched.submit(ReleaseStage(pipeline_id=pid, stage=mine[0][1]), now)
            requested.discard(mine[0])
            granted.discard(mine[0])
        elif kind == "demand":
            slots = live[pid].slots_per_worker
            loads = tuple(
                WorkerLoad(first_gpu=w.gpus[0], active=min(slots, (pending + w.gpus[0]) % (slots + 1)))
                for w in sched.workers(pid)
            )
            batch = pending + sum(x.active for x in loads) + 5
            report = ReportDemand(
                pipeline_id=pid,
                pending=pending,
                loads=loads,
                batch_size=batch,
                backlog=pending * idx,
                trajectory_s=dt * (idx + 1),
                path_s=dt * 100.0 * idx,
            )
            sched.submit(report, now)
            reports[pid] = (now, report)
        elif kind == "unregister":
            sched.submit(Unregister(pipeline_id=pid), now)
            del live[pid]
            requested = {k for k in requested if k[0] != pid}
            granted = {k for k in granted if k[0] != pid}
            reports.pop(pid, None)
        before = {g: h for g, h in enumerate(sched.ledger.owner) if isinstance(h, GangHolder)}
        plan = sched.plan(now)
        check_ledger(sched.ledger)
        # a granted (non-preemptable) stage keeps every GPU until it releases
        for g, holder in before.items():
            assert sched.ledger.owner[g] == holder
        assert not ({s.worker for s in plan.shrinks} & {e.worker for e in plan.expands})
        granted |= {(g.pipeline_id, g.stage) for g in plan.grants}
        for key in granted:
            assert sched.granted(*key)
        # liveness: the most urgent waiting request is blocked only by another gang, or by another
        # admitted job holding part of its home: under a partitioned baseline a job's admission
        # waits for it; under rlix a guest's stage may (guest_stage_fit), if that job came first
        waiting = sched.pending_requests()
        if waiting:
            first_pid, first_stage = waiting[0]
            gpus = sched._requests[(first_pid, first_stage)].gpus
            home = set(live[first_pid].home_gpus)
            own = sched._view.pipelines[first_pid]
            partition_taken = (first_stage is Stage.INIT or policy == "rlix") and any(
                e.admitted
                and home & set(e.spec.home_gpus)
                and (policy != "rlix" or (e.admitted_at, p) < (own.admitted_at, first_pid))
                for p, e in sched._view.pipelines.items()
                if p != first_pid and p in live
            )
            assert partition_taken or any(isinstance(sched.ledger.owner[g], GangHolder) for g in gpus)
        # rollout workers sit only on bundles their pipeline may use
        for p in live:
            for w in sched.workers(p):
                assert isinstance(w, RolloutWorker)
                assert w.gpus in sched._view.pipelines[p].bundle_of.values()
        if policy == "rlix":
            check_work_conserving(sched, live, reports, now)


def check_work_conserving(sched: Scheduler, live, reports, now: float) -> None:
    """No wholly idle bundle while a pipeline that may use it still wants workers."""
    owner = sched.ledger.owner
    for pid, (t, report) in reports.items():
        if pid not in live or now - t > sched.config.report_ttl_s:
            continue
        spec = live[pid]
        entry = sched._view.pipelines[pid]
        remaining = report.pending + sum(x.active for x in report.loads)
        need = min(math.ceil(remaining / spec.slots_per_worker), len(entry.rollout_bundles))
        if len(sched.workers(pid)) < need:
            for bundle in entry.rollout_bundles:
                assert not all(owner[g] is None for g in bundle), f"{pid} wants workers while {bundle} idles"


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenarios())
def test_rlix_plans_keep_every_invariant(scenario):
    run_and_check("rlix", *scenario)


@SETTINGS
@given(scenarios())
def test_baseline_plans_keep_every_invariant(scenario):
    for policy in POLICIES:
        if policy != "rlix":
            run_and_check(policy, *scenario)


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_same_events_give_the_same_plans(scenario):
    cluster, specs, actions, _ = scenario

    def plans():
        sched = Scheduler(cluster, "rlix")
        out = [sched.step(0.0, [Register(spec=s) for s in specs])]
        now = 0.0
        for kind, idx, _stage, pending, dt in actions:
            now += dt
            if kind == "demand":
                out.append(sched.step(now, [ReportDemand(pipeline_id=specs[idx].pipeline_id, pending=pending)]))
        return out

    assert plans() == plans()
