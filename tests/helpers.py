"""Small builders shared by the tests (public API only)."""

from __future__ import annotations

from rlix.core import PipelineSpec, Register, ReportDemand, Role, RoleSpec, Scheduler, WorkerLoad


def spec(
    pid: str,
    train: range | tuple,
    infer: range | tuple,
    *,
    tp: int = 1,
    slots: int = 4,
    home=(),
    resumable=False,
    priority: int = 0,
    open_limit: int = 0,
    total_trajectories: int = 0,
    batch_credit: bool = False,
    **roles,
) -> PipelineSpec:
    role_specs = [
        RoleSpec(role=Role.ACTOR_TRAIN, gpus=tuple(train)),
        RoleSpec(role=Role.ACTOR_INFER, gpus=tuple(infer), gpus_per_worker=tp),
    ]
    for name, gpus in roles.items():
        role_specs.append(RoleSpec(role=Role(name), gpus=tuple(gpus)))
    return PipelineSpec(
        pipeline_id=pid,
        roles=tuple(role_specs),
        slots_per_worker=slots,
        home=tuple(home),
        resumable=resumable,
        priority=priority,
        open_limit=open_limit,
        total_trajectories=total_trajectories,
        batch_credit=batch_credit,
    )


def register(sched: Scheduler, *specs: PipelineSpec, now: float = 0.0):
    return sched.step(now, [Register(spec=s) for s in specs])


def demand(
    pid: str,
    pending: int,
    loads: dict[int, int] | None = None,
    batch: int = 0,
    backlog: int = 0,
    trajectory_s: float = 0.0,
    finished: int = 0,
) -> ReportDemand:
    loads = loads or {}
    return ReportDemand(
        pipeline_id=pid,
        pending=pending,
        loads=tuple(WorkerLoad(first_gpu=g, active=n) for g, n in sorted(loads.items())),
        batch_size=batch or pending + sum(loads.values()),
        backlog=backlog,
        trajectory_s=trajectory_s,
        finished=finished,
    )


def owners(sched: Scheduler) -> dict[str, list[int]]:
    """pipeline id -> first GPUs of its rollout workers."""
    return {pid: [w.gpus[0] for w in sched.workers(pid)] for pid in sched.pipelines()}


def assert_config_error_names(raw: dict, field: str) -> None:
    """``raw`` fails to parse with one line that starts with ``field``."""
    import pytest

    from rlix.exec.front.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    msg = str(info.value)
    assert msg.startswith(field), msg
    assert "\n" not in msg


def assert_replay_predicts(outputs, policy: str) -> None:
    """The simulator replaying an ``rlix-run``'s measured trace under the same policy predicts
    the makespan within 10%, every job's completion time within 15%, and the share of GPU-seconds
    spent switching (loads, offloads, weight syncs) within 0.02.

    GPUs held by a worker waiting for its process to start are counted apart, within 0.05: each such
    wait is up to a process's whole start-up (about 20 s on a 2-core machine, up to 0.05 of a 4-GPU,
    100-s run), and whether a plan places a worker there at all turns on which side of a plan a
    demand report lands, tens of milliseconds the replay does not reproduce."""
    from rlix.sim.simulator import Simulation
    from rlix.sim.trace import load_trace

    sim_run = Simulation(load_trace(outputs.files["trace"]), policy, keep_segments=True)
    sim = sim_run.run()
    measured = outputs.metrics
    jct = {p: (sim.pipelines[p].jct_s, m.jct_s) for p, m in measured.pipelines.items()}
    print(f"{policy}: makespan sim={sim.makespan_s:.1f}s measured={measured.makespan_s:.1f}s; jct (sim, measured) {jct}")
    waits = (
        _start_waits((s.end - s.start, s.activity.value, s.stage) for s in sim_run.usage.iter_segments())
        / (sim.gpus * sim.makespan_s),
        _start_waits(_timeline_segments(outputs.files["timeline"])) / (measured.gpus * measured.makespan_s),
    )
    whole = (sim.switch_overhead_fraction, measured.switch_overhead_fraction)
    print(f"{policy}: switch_overhead_fraction sim={whole[0]:.4f} measured={whole[1]:.4f}")
    print(f"{policy}: of which waiting for a worker process: sim={waits[0]:.4f} measured={waits[1]:.4f}")
    switch = (whole[0] - waits[0], whole[1] - waits[1])
    assert abs(switch[0] - switch[1]) <= 0.02, (policy, "switch_overhead_fraction without process waits (sim, measured)", switch)
    assert abs(waits[0] - waits[1]) <= 0.05, (policy, "share waiting for a worker process (sim, measured)", waits)
    assert abs(sim.makespan_s - measured.makespan_s) <= 0.10 * measured.makespan_s, (policy, sim.makespan_s, measured.makespan_s)
    for pid, (predicted, real) in jct.items():
        assert abs(predicted - real) <= 0.15 * real, (policy, pid, predicted, real)


def _timeline_segments(path):
    """(seconds, activity, stage) of each GPU segment of an ``rlix-run``'s timeline.json."""
    import json
    from pathlib import Path

    for e in json.loads(Path(path).read_text())["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") == 0:
            yield e["dur"] / 1e6, e["cat"], e["name"].split(":", 1)[1]


def _start_waits(segments) -> float:
    """GPU-seconds of switching while a worker's process starts (the job model's ``start`` phase)."""
    from rlix.job import WorkerPhase, worker_booking

    activity, label = worker_booking(WorkerPhase.START)
    return sum(sec for sec, act, stage in segments if act == activity.value and stage == label)


class LastRows:
    """An ``on_progress`` for :func:`rlix.exec.front.api.run` keeping the live view's last rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []

    def __call__(self, session) -> None:
        from rlix.exec.front.console import rows

        self.rows = rows(session)


def assert_last_rows_are_the_summary(outputs, last: LastRows) -> None:
    """Each job's last live row shows what its summary line says: state, steps, rewards."""
    assert [r[0] for r in last.rows] == [line.name for line in outputs.lines]
    for row, line in zip(last.rows, outputs.lines, strict=True):
        assert row[1] == line.state and row[2] == f"{line.step}/{line.steps}" and row[3] == line.reward_text(), (row, line)
        assert f"{line.state} steps={row[2]} reward {row[3]}" in line.summary()
        res = outputs.results[line.name]
        assert line.step == res.steps_before + len(res.steps)


def drawn_job(rng, pid: str, *, arrival: float | None, train: tuple[int, int], gpus: int, max_steps: int) -> dict:
    """A job of the small random trace families (tests/test_sim_*.py): its tail, size, slots and
    staleness drawn from ``rng`` in a fixed order (the families' draws depend on it); ``arrival``
    None: drawn in 0-300 s. Rollout anywhere on the ``gpus`` of the cluster, training on ``train``."""
    from rlix.sim.scenarios import _job

    median = rng.choice([10.0, 20.0, 30.0])
    rollout = median * rng.uniform(4, 8)
    return _job(
        pid,
        arrival=round(rng.uniform(0, 300), 1) if arrival is None else arrival,
        train=train,
        infer=(0, gpus - 1),
        steps=rng.randint(2, max_steps),
        trajectories=rng.choice([32, 64, 128]),
        median_s=median,
        p99_s=median * 10,
        max_s=median * 20,
        typical_rollout_s=rollout,
        seed=rng.randrange(1000),
        slots=rng.choice([4, 8, 16]),
        staleness=rng.choice([0, 1]),
    )
