"""The executor's outputs: the recorded trace written through the trace format's model, validated, and read
back unchanged; the run's GPU-by-time chart drawn beside its metrics.

No Ray: the run's records are frozen dataclasses, built here from plain values.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rlix.exec.config import parse_config
from rlix.exec.front.outputs import build_outputs, trace_model, usage_from_events
from rlix.exec.messages import JobResult
from rlix.exec.records import ActivityChange, JobStatus, StepRecord, SwitchKind, SwitchRecord, TrajRecord
from rlix.metrics import Activity
from rlix.protocol import SchedulerStats
from rlix.sim.simulator import Simulation
from rlix.trace import dump_trace, load_trace

CONFIG = """
cluster: {nodes: 1, gpus_per_node: 4}
scheduler: {report_ttl_s: 10.0, plan_interval_s: 0.5, heartbeat_s: 1.5}
jobs:
  - name: full          # disaggregated, no home: it gets the default home (all its GPUs)
    model: {size: {}}
    task: {name: copy}
    slots_per_worker: 2
    roles: {actor_train: {gpus: [0]}, actor_infer: {gpus: "1-2"}}
  - name: lora
    kind: multi_lora
    model: {size: {}}
    adapters: [{name: copy}, {name: rev, task: {name: reverse}}]
    priority: 1
    dispatch: drawn      # its rollout starts trajectories as drawn
    placement: longest_held
    roles: {actor_train: {gpus: [3]}, actor_infer: {gpus: "0-3"}}
    home: [3]
"""


def _step(stream: str, step: int, t0: float) -> StepRecord:
    stages = (("old_logprobs", 0.31), ("actor_train", 0.52))
    return StepRecord(
        stream=stream,
        step=step,
        started_s=t0,
        finished_s=t0 + 2.0,
        mean_reward=0.1,
        mean_tokens=8.0,
        stages=stages,
        min_weight_version=step,
    )


def _trajs(stream: str, step: int, first_id: int) -> tuple[TrajRecord, ...]:
    return tuple(
        TrajRecord(
            traj_id=first_id + k,
            stream=stream,
            step=step,
            gen_s=0.4 + 0.1 * k,
            segments=1,
            tokens=9,
            weight_version=step,
            prompt=k // 2,
        )
        for k in range(3)
    )


def _result(pid: str, streams: tuple[str, ...], sync_s: float) -> JobResult:
    steps = tuple(_step(s, i, 2.0 * i) for s in streams for i in range(2))
    trajs = tuple(t for n, s in enumerate(streams) for i in range(2) for t in _trajs(s, i, 100 * n + 10 * i))
    switches = (
        SwitchRecord(kind=SwitchKind.WAKE, t=1.0, seconds=0.25),
        SwitchRecord(kind=SwitchKind.SLEEP, t=3.0, seconds=0.125),
        SwitchRecord(kind=SwitchKind.STAGE_LOAD, t=2.5, seconds=0.0625),
        SwitchRecord(kind=SwitchKind.STAGE_OFFLOAD, t=2.75, seconds=0.0375),
        SwitchRecord(kind=SwitchKind.SYNC, t=4.0, seconds=sync_s, synced_bytes=1024),
        SwitchRecord(kind=SwitchKind.PROCESS_START, t=0.5, seconds=3.0),  # in the background, on arrival
        SwitchRecord(kind=SwitchKind.PROCESS_START, t=2.0, seconds=5.0),  # once the model is loaded (at 1.75 s)
        SwitchRecord(kind=SwitchKind.PROCESS_START, t=2.0, seconds=7.0),
    )
    return JobResult(
        pipeline_id=pid,
        status=JobStatus.FINISHED,
        arrival_s=0.5,
        init_s=1.25,
        finish_s=9.0,
        steps=steps,
        trajectories=trajs,
        switches=switches,
    )


def _recorded():
    cfg = parse_config(yaml.safe_load(CONFIG))
    results = {"full": _result("full", ("",), 0.0625), "lora": _result("lora", ("copy", "rev"), 0.0375)}
    return cfg, results, trace_model(cfg, results, {"full": "full", "lora": "lora"})


def test_recorded_trace_round_trips_through_the_trace_format(tmp_path):
    _, _, model = _recorded()
    first = tmp_path / "trace.json"
    dump_trace(model, first)
    loaded = load_trace(first)
    assert loaded.model == model
    again = tmp_path / "again.json"
    dump_trace(loaded.model, again)
    assert again.read_text() == first.read_text()


def test_recorded_trace_carries_each_trajectorys_prompt_and_the_order_and_placement_the_run_used():
    _, _, model = _recorded()
    full, lora = model.pipelines
    assert [s.prompts for s in full.steps] == [[0, 0, 1], [0, 0, 1]]  # a group of two and one alone, each step
    assert all(s.prompts == [0, 0, 1] for a in lora.adapters for s in a.steps)
    assert (full.dispatch, lora.dispatch) == ("predicted", "drawn")  # a replay orders them as the run did
    assert (full.placement, lora.placement) == ("lowest_gpu", "longest_held")  # and places them as it did


def test_recorded_trace_carries_what_the_run_registered_and_measured():
    cfg, _, model = _recorded()
    full, lora = model.pipelines
    assert full.home == [] and cfg.jobs[0].spec("full", resumable=True).home_gpus == (0, 1, 2)  # it named no home
    assert lora.home == [3] and lora.priority == 1 and full.slots_per_worker == 2
    assert [a.id for a in lora.adapters] == ["copy", "rev"] and all(len(a.steps) == 2 for a in lora.adapters)
    assert full.switch.weight_sync_s == 0.0625 and lora.switch.adapter_sync_s == 0.0375 and lora.switch.weight_sync_s == 0.0
    assert full.switch.load_s == 0.25 and full.switch.offload_s == 0.125 and full.init_s == 1.25  # rollout workers'
    assert full.switch.stage_load_s == 0.0625 and full.switch.stage_offload_s == 0.0375  # stages', kept apart
    # a worker process's mean start-up, on arrival and once the model is loaded: a replay places no worker before it
    assert full.switch.start_s == 3.0 and full.switch.start_later_s == 6.0
    assert full.steps[0].trajectories == [0.4, 0.5, 0.6] and full.steps[0].stages == {"old_logprobs": 0.31, "actor_train": 0.52}


def test_replay_of_a_recorded_trace_plans_at_the_runs_cadence(tmp_path):
    _, _, model = _recorded()
    dump_trace(model, tmp_path / "trace.json")
    sim = Simulation(load_trace(tmp_path / "trace.json"), "static")
    assert (sim.plan_interval_s, sim.heartbeat_s) == (0.5, 1.5)
    m = sim.run()  # the disaggregated job's default home holds a rollout bundle, so static places it
    assert m.trajectories_lost == 0 and set(m.pipelines) == {"full", "lora"}


def test_a_record_the_trace_format_refuses_fails_when_the_trace_is_built():
    cfg, results, _ = _recorded()
    bad = results["full"]
    bad = JobResult(**{**bad.__dict__, "steps": (StepRecord(**{**bad.steps[0].__dict__, "stages": (("warmup", 1.0),)}),)})
    with pytest.raises(ValidationError, match="stages"):
        trace_model(cfg, {**results, "full": bad}, {"full": "full", "lora": "lora"})


def test_an_adapter_that_trained_no_step_is_left_out_of_the_recorded_trace():
    """A multi-LoRA run stopped before one adapter's first step still writes its trace (it crashed at
    the run's end, once a stream had to hold a step)."""
    cfg, results, _ = _recorded()
    only_copy = _result("lora", ("copy",), 0.0375)
    model = trace_model(cfg, {**results, "lora": only_copy}, NAMES)
    assert [a.id for a in model.pipelines[1].adapters] == ["copy"]


def test_no_finished_step_means_no_trace():
    cfg, results, _ = _recorded()
    empty = {pid: JobResult(pipeline_id=pid, status=JobStatus.FAILED) for pid in results}
    assert trace_model(cfg, empty, {"full": "full", "lora": "lora"}) is None


NAMES = {"full": "full", "lora": "lora"}
EVENTS = [
    ActivityChange(t=0.5, gpus=(1, 2), activity=Activity.SWITCH, pipeline_id="full", stage=""),
    ActivityChange(t=1.0, gpus=(1, 2), activity=Activity.WORK, pipeline_id="full", stage="rollout"),
    ActivityChange(t=1.0, gpus=(3,), activity=Activity.WORK, pipeline_id="lora", stage="rollout"),
    ActivityChange(t=4.0, gpus=(0,), activity=Activity.WORK, pipeline_id="full", stage="actor_train"),
    ActivityChange(t=4.0, gpus=(1, 2), activity=Activity.HELD, pipeline_id="full", stage=""),
    ActivityChange(t=6.0, gpus=(0, 1, 2, 3), activity=Activity.FREE, pipeline_id="", stage=""),
]
STATS = SchedulerStats(plans=12, plan_s=0.01, unmet=((0.0, True), (1.0, False)))


def test_a_run_writes_its_gpu_by_time_chart_beside_its_metrics(tmp_path):
    from rlix.plot import plot_runs

    cfg, results, _ = _recorded()
    out = build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path / "run")
    png = tmp_path / "run" / "timeline.png"
    assert out.files["plot"] == str(png)
    assert set(out.files) == {"timeline", "metrics", "trace", "plot"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the simulator's chart of the same recorded activity, byte for byte (and so deterministic)
    plot_runs(
        {"rlix": (usage_from_events(4, EVENTS, STATS.unmet, 9.0), 9.0)},
        ["full", "lora"],
        tmp_path / "sim.png",
        "rlix-run: 2 jobs",
    )
    assert png.read_bytes() == (tmp_path / "sim.png").read_bytes()


def test_a_stop_that_came_once_every_job_had_finished_leaves_the_figures_whole(tmp_path):
    """Before: Ctrl-C after the last job finished (while the outputs were written) marked them partial,
    with no job unfinished."""
    import json

    cfg, results, _ = _recorded()
    build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path, stopped_at=8.5)
    executor = json.loads((tmp_path / "metrics.json").read_text())["executor"]
    assert executor["partial"] is False and executor["unfinished_jobs"] == [] and executor["stopped_at_s"] == 8.5


def test_without_matplotlib_a_run_writes_its_other_outputs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rlix.plot", None)  # as if matplotlib were not installed: the import fails
    cfg, results, _ = _recorded()
    out = build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path)
    assert set(out.files) == {"timeline", "metrics", "trace"}
    assert not (tmp_path / "timeline.png").exists() and (tmp_path / "metrics.json").is_file()


def test_metrics_say_what_each_job_used_lent_and_borrowed(tmp_path):
    import json

    cfg, results, _ = _recorded()
    events = [  # lora rolls out on full's home (GPUs 0-2, its default home) until full takes it back at 3 s
        ActivityChange(t=1.0, gpus=(0, 1, 2, 3), activity=Activity.WORK, pipeline_id="lora", stage="rollout"),
        ActivityChange(t=3.0, gpus=(0, 1, 2), activity=Activity.WORK, pipeline_id="full", stage="rollout"),
        ActivityChange(t=6.0, gpus=(0, 1, 2, 3), activity=Activity.FREE, pipeline_id="", stage=""),
    ]
    build_outputs(cfg, results, NAMES, events, STATS, 9.0, tmp_path)
    jobs = json.loads((tmp_path / "metrics.json").read_text())["pipelines"]
    got = {pid: (p["gpu_seconds_used"], p["gpu_seconds_lent"], p["gpu_seconds_borrowed"]) for pid, p in jobs.items()}
    assert got == {"full": (9.0, 6.0, 0.0), "lora": (11.0, 0.0, 6.0)}  # whole seconds: exact


def test_metrics_count_each_jobs_rollout_workers_that_died(tmp_path):
    """A worker process that dies is replaced and its trajectories continue, so a run can finish with every
    job's rewards as expected while its engines crash: metrics.json says how many died, per job."""
    import dataclasses
    import json

    cfg, results, _ = _recorded()
    results["lora"] = dataclasses.replace(results["lora"], workers_lost=3)
    build_outputs(cfg, results, NAMES, [], STATS, 9.0, tmp_path)
    jobs = json.loads((tmp_path / "metrics.json").read_text())["executor"]["jobs"]
    assert {pid: j["workers_lost"] for pid, j in jobs.items()} == {"full": 0, "lora": 3}


def test_a_runs_bounds_are_those_of_its_recorded_trace_streaming_and_co_tenants_included(tmp_path):
    """The executor bounds a run from its measured shapes; a replay of its trace bounds the same run from
    the trace's. They agree, for a streaming job beside a co-tenant whose stages span its GPUs too."""
    from rlix.exec.front.outputs import run_metrics
    from rlix.job import lower_bounds

    raw = yaml.safe_load(CONFIG)
    raw["jobs"][0] |= {
        "rollout_mode": "streaming",
        "staleness": 1,
        "roles": {"actor_train": {"gpus": "0-3"}, "actor_infer": {"gpus": "0-3"}},
    }
    raw["jobs"][1] |= {"roles": {"actor_train": {"gpus": "0-3"}, "actor_infer": {"gpus": "0-3"}}, "home": []}
    cfg = parse_config(raw)
    full = _result("full", ("",), 0.0625)  # rollouts far longer than its stages: streaming shortens its chain
    full = JobResult(
        **{**full.__dict__, "trajectories": tuple(TrajRecord(**{**t.__dict__, "gen_s": 20 * t.gen_s}) for t in full.trajectories)}
    )
    results = {"full": full, "lora": _result("lora", ("copy", "rev"), 0.0375)}
    dump_trace(trace_model(cfg, results, NAMES), tmp_path / "trace.json")
    trace = load_trace(tmp_path / "trace.json")
    _, metrics = run_metrics(cfg, results, NAMES, EVENTS, STATS, 9.0)
    work, path = lower_bounds(trace.job_shapes(), 4)
    assert (metrics.lower_bound_work_s, metrics.lower_bound_critical_path_s) == pytest.approx((work, path))
    alone = max(lower_bounds([shape], 4)[1] for shape in trace.job_shapes())
    assert path > alone  # each job's stages stop the other's chain


def test_a_run_whose_folder_broke_during_it_keeps_its_outputs_elsewhere_and_says_where(tmp_path, capsys):
    """Before: the folder replaced by a file mid-run made rlix-run end in a traceback, every run output lost."""
    from rlix.exec.front.cli import report

    cfg, results, _ = _recorded()
    (tmp_path / "run").write_text("")  # the run's folder went away, a file in its place
    out = build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path / "run")
    elsewhere = Path(out.files["metrics"]).parent
    assert elsewhere != tmp_path / "run" and set(out.files) == {"timeline", "metrics", "trace", "plot"}
    assert all(Path(f).parent == elsewhere and Path(f).is_file() for f in out.files.values())
    why = "could not be written (FileExistsError: File exists)"
    assert out.moved == f"{tmp_path / 'run'} {why}; the run's outputs are in {elsewhere}"
    results = {pid: dataclasses.replace(r, warnings=("its step 2 metrics could not be written",)) for pid, r in results.items()}
    report(dataclasses.replace(out, results=results), None)
    assert capsys.readouterr().err.splitlines() == [
        "rlix-run: job full: warning: its step 2 metrics could not be written",
        "rlix-run: job lora: warning: its step 2 metrics could not be written",
        f"rlix-run: warning: {out.moved}",
    ]
    shutil.rmtree(elsewhere)


def test_a_run_file_that_fails_midway_leaves_no_part_behind_and_no_folder_at_all_still_ends_in_one_line(tmp_path, monkeypatch):
    import tempfile

    cfg, results, _ = _recorded()
    (tmp_path / "run" / "metrics.json").mkdir(parents=True)  # written after timeline.json and trace.json: it fails
    out = build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.json"]  # no half of a run to take for one
    shutil.rmtree(Path(out.files["metrics"]).parent)
    (tmp_path / "tmp").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # no temporary folder either
    out = build_outputs(cfg, results, NAMES, EVENTS, STATS, 9.0, tmp_path / "run")
    assert out.files == {"timeline": str(tmp_path / "run" / "timeline.json"), "trace": str(tmp_path / "run" / "trace.json")}
    assert out.moved.startswith(f"{tmp_path / 'run'} could not be written whole (IsADirectoryError: ")  # what it has stays
    assert ", nor a temporary folder (NotADirectoryError: " in out.moved
