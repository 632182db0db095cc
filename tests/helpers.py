"""Small builders shared by the tests (public API only)."""

from __future__ import annotations

from pathlib import Path

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

    from rlix.exec.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    msg = str(info.value)
    assert msg.startswith(field), msg
    assert "\n" not in msg


def assert_trace_replays(outputs, policy: str) -> None:
    """The run's measured trace replays in the simulator under the same policy: every job the run
    finished finishes in the replay with as many steps and trajectories, and the replay's GPU-seconds
    add up to its GPUs times its makespan.

    How close the replay's times come to the run's (makespan, each job's completion time, the share
    of GPU-seconds spent switching) is a wall-clock figure that a loaded machine moves: it is printed
    by ``benchmarks/bench_exec_policies.py``, never asserted here."""
    from rlix.exec.records import JobStatus
    from rlix.sim.simulator import Simulation
    from rlix.trace import load_trace

    sim_run = Simulation(load_trace(outputs.files["trace"]), policy, keep_segments=True)
    sim = sim_run.run()
    finished = {pid for pid, r in outputs.results.items() if r.status is JobStatus.FINISHED}
    assert finished and finished <= set(sim.pipelines), (policy, sorted(finished), sorted(sim.pipelines))
    for pid in sorted(finished):
        measured, replayed = outputs.metrics.pipelines[pid], sim.pipelines[pid]
        assert (replayed.steps, replayed.trajectories) == (measured.steps, measured.trajectories), (policy, pid)
        assert replayed.jct_s > 0
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for seg in sim_run.usage.iter_segments():
        by_gpu.setdefault(seg.gpu, []).append((seg.start, seg.end))
    for gpu, spans in sorted(by_gpu.items()):  # a GPU holds one thing at a time, within the replay's makespan
        spans.sort()
        assert 0 <= spans[0][0] and spans[-1][1] <= sim.makespan_s + 1e-6, (policy, gpu, spans[0], spans[-1])
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:])), (policy, gpu)


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


def narrowed_raw(example: Path, gpus: int, jobs: dict[str, dict], *, pace: float = 1.0, **top: object) -> dict:
    """``example``'s YAML on one node of ``gpus`` logical GPUs: ``jobs`` maps a job's name to the fields
    it changes (its roles, its home, its steps), ``pace`` scales the decode pace, ``top`` replaces
    top-level blocks. Each GPU a job rolls out on is a model process, seconds of imports on a CPU host:
    the suite's runs use no more GPUs than their checks need, and pace them faster to keep the rollout
    capacity of the example's."""
    import yaml

    raw = yaml.safe_load(example.read_text())
    raw["cluster"] = {**raw["cluster"], "gpus_per_node": gpus}
    raw["emulation"] = {**raw["emulation"], "decode_step_s": raw["emulation"]["decode_step_s"] * pace}
    assert set(jobs) <= {j["name"] for j in raw["jobs"]}, set(jobs)
    raw["jobs"] = [{**j, **jobs.get(j["name"], {})} for j in raw["jobs"]]
    raw.update(top)
    return raw


def roles(train: int, gpus: int) -> dict:
    """A job's roles on a node of ``gpus`` GPUs: trained on GPU ``train``, rolled out on every GPU."""
    return {"actor_train": {"gpus": [train]}, "actor_infer": {"gpus": f"0-{gpus - 1}"}}


def narrowed(example: Path, gpus: int, jobs: dict[str, dict], *, pace: float = 1.0, **top: object):
    """:func:`narrowed_raw`, validated as ``rlix-run`` validates a config."""
    from rlix.exec.config import parse_config

    return parse_config(narrowed_raw(example, gpus, jobs, pace=pace, **top))
