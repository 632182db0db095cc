"""The simulator as a planning tool: ``rlix-sim whatif`` and ``rlix-sim sweep`` as a user runs them.

whatif must agree exactly with replaying a trace into which the job was
written by hand; a sweep's cells must agree exactly with replays run one by
one in this process, and the same sweep must write the same bytes.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlix.sim import sweep, sweep_plot
from rlix.sim.cli import main
from rlix.sim.simulator import replay
from rlix.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
JOB = ROOT / "examples" / "whatif_job.json"
POLICIES = ("static", "partial_overlap", "rlix")


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlix.sim.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlix-sim: error:"), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def error_in_process(capsys, *args: str) -> str:
    """``main(args)`` in this process (no interpreter start): exit 2 and one line on stderr, nothing on stdout."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2 and not out, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlix-sim: error:"), err
    return lines[0]


def jcts(path: Path) -> dict[str, dict[str, float]]:
    """policy -> {pipeline: jct_s, "makespan": makespan_s} from a replay's --json."""
    data = json.loads(path.read_text())["policies"]
    return {
        policy: {**{pid: p["jct_s"] for pid, p in m["pipelines"].items()}, "makespan": m["makespan_s"]}
        for policy, m in data.items()
    }


# ------------------------------------------------------------------ whatif


@pytest.mark.parametrize("extra", [[], ["--seed", "3", "--set", "small_first=0"]], ids=["as-shipped", "seed-and-knob"])
def test_whatif_equals_replaying_the_trace_with_the_job_written_in(tmp_path, extra):
    out = tmp_path / "whatif.json"
    assert (
        main(["whatif", str(TRACES / "two_jobs.json"), "--add", str(JOB), "--at", "300", "--json", str(out), "--quiet", *extra])
        == 0
    )
    raw = json.loads((TRACES / "two_jobs.json").read_text())
    job = json.loads(JOB.read_text())
    raw["pipelines"].append({**job, "arrival_s": 300.0})
    by_hand = tmp_path / "by_hand.json"
    by_hand.write_text(json.dumps(raw))
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert main(["replay", str(TRACES / "two_jobs.json"), "--json", str(before), "--quiet", *extra]) == 0
    assert main(["replay", str(by_hand), "--json", str(after), "--quiet", *extra]) == 0
    before_jct, after_jct = jcts(before), jcts(after)

    data = json.loads(out.read_text())
    assert data["format"] == "rlix-whatif" and set(data["policies"]) == set(POLICIES)
    for policy, r in data["policies"].items():
        assert r["new_jobs"] == {
            "rlvr-new": {
                "arrival_s": 300.0,
                "jct_s": after_jct[policy]["rlvr-new"],
                "queue_delay_s": json.loads(after.read_text())["policies"][policy]["pipelines"]["rlvr-new"]["queue_delay_s"],
            }
        }
        assert set(r["existing"]) == {"math-a", "code-b"}
        for pid, c in {**r["existing"], "makespan": r["makespan"]}.items():
            assert c["before_s"] == before_jct[policy][pid]  # exactly: the same replays
            assert c["after_s"] == after_jct[policy][pid]
            assert c["change_s"] == c["after_s"] - c["before_s"]
            assert c["change_pct"] == pytest.approx(100 * c["change_s"] / c["before_s"])
    # The job changes something: under static it waits for code-b's home, so the makespan grows.
    assert data["policies"]["static"]["makespan"]["change_s"] > 0


def test_at_moves_a_templates_listed_arrivals_with_it(tmp_path):
    """Before: ``--at`` changed nothing for a template of listed arrival times (its copies arrived as listed)."""
    from rlix.sim.whatif import load_job

    job = json.loads(Path("traces/two_jobs.json").read_text())["pipelines"][0]
    job.update(id="new", arrivals={"times_s": [100.0, 250.0]})
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert [c.arrival_s for c in load_job(tmp_path / "job.json", 5000.0).copies()] == [5000.0, 5150.0]
    assert [c.arrival_s for c in load_job(tmp_path / "job.json").copies()] == [100.0, 250.0]


def test_whatif_prints_a_table_per_policy_and_writes_the_same_bytes_twice(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    res = run_cli("whatif", "traces/two_jobs.json", "--add", str(JOB), "--policy", "rlix", "--json", str(a))
    assert res.returncode == 0, res.stderr
    data = json.loads(a.read_text())["policies"]["rlix"]
    assert "rlix: JCT (s) without and with the job" in res.stdout
    assert "+ rlvr-new (new, arrives 600 s)" in res.stdout
    for pid, c in data["existing"].items():
        row = next(line for line in res.stdout.splitlines() if f" {pid} " in line)
        assert f"{c['before_s']:,.0f}" in row and f"{c['after_s']:,.0f}" in row and f"{c['change_pct']:+.1f}%" in row
    assert main(["whatif", "traces/two_jobs.json", "--add", str(JOB), "--policy", "rlix", "--json", str(b), "--quiet"]) == 0
    assert a.read_bytes() == b.read_bytes()


def _job_file(tmp_path: Path, mutate) -> str:
    raw = json.loads(JOB.read_text())
    mutate(raw)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(raw))
    return str(path)


BAD_JOBS = {
    "name clash": (lambda j: j.update(id="math-a"), "id: 'math-a' is already a pipeline of traces/two_jobs.json"),
    "invalid field": (lambda j: j.update(slots_per_worker=0), "slots_per_worker: Input should be greater than or equal to 1"),
    "unknown field": (lambda j: j.update(colour="red"), "colour: Extra inputs are not permitted (got 'red'); remove it"),
    "beyond the cluster": (
        lambda j: j["roles"]["actor_infer"].update(gpus="0-31"),
        "GPU ids must lie in 0..15, got 0..31 (the trace's cluster has 16 GPUs, 2x8); fit the job's roles to it",
    ),
    "no steps": (lambda j: j.pop("generate"), "give exactly one of 'steps' (explicit) or 'generate' (compact)"),
    "undeclared tenant": (
        lambda j: j.update(tenant="nobody"),
        "job.json: tenant: 'nobody' is not declared in scheduler.tenants (declared: none)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_whatif_bad_job_is_one_line_exit_2(case, tmp_path):
    mutate, expected = BAD_JOBS[case]
    line = one_line_error(run_cli("whatif", "traces/two_jobs.json", "--add", _job_file(tmp_path, mutate)))
    assert "job.json: " in line and expected in line, line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--add", "no/such/job.json"], "no/such/job.json: no such file; give the path of a JSON file holding one pipeline"),
        (["--add", "traces/single.json"], "this is a whole trace; give one pipeline entry"),
        (["--add", "README.md"], "README.md: not valid JSON (line 1"),
        (
            ["--add", str(JOB), "--at", "-5"],
            "--at -5: an arrival is seconds from the trace's start; give a number from 0 to 1e+09",
        ),
        (["--add", str(JOB), "--at", "inf"], "--at inf: an arrival is seconds"),
        (["--add", str(JOB), "--at", "1e300"], "--at 1e+300: an arrival is seconds"),  # it hung: the clock stood still
        (["--add", str(JOB), "--at", "soon"], "argument --at: invalid float value"),
        (["--add", str(JOB), "--policy", "fifo"], "--policy fifo: unknown policy"),
        (["--add", str(JOB), "--set", "small_first=99"], "scheduler.small_first: Input should be less than or equal to 10"),
        ([], "the following arguments are required: --add"),
    ],
)
def test_whatif_bad_arguments_are_one_line_exit_2(args, expected, capsys):
    assert expected in error_in_process(capsys, "whatif", "traces/two_jobs.json", *args)


# ------------------------------------------------------------------ sweep, in this process


KNOB = sweep.Knob(name="small_first", values=("0", "3"))


def test_grid_is_the_cartesian_product_in_a_fixed_order():
    cells = sweep.grid(["a.json", "b.json"], [KNOB, sweep.Knob(name="backlog_weight", values=("0", "1", "2"))], [0, 1], ["rlix"])
    assert len(cells) == 2 * 2 * 3 * 2
    assert [c.index for c in cells] == list(range(len(cells)))
    assert sorted(cells, key=lambda c: c.sort_key()) == cells
    assert len({(c.source, c.policy, c.knobs, c.seed) for c in cells}) == len(cells)
    assert cells[1].knobs == (("small_first", "0"), ("backlog_weight", "0")) and cells[1].seed == 1
    assert cells[2].knobs == (("small_first", "0"), ("backlog_weight", "1")) and cells[2].seed == 0


def test_a_cell_is_a_replay_and_outputs_do_not_depend_on_finishing_order(tmp_path):
    sources = ["traces/single.json", "traces/two_jobs.json"]
    texts = sweep.load_texts(sources, [KNOB])
    cells = sweep.grid(sources, [KNOB], [0, 1], ["rlix"])
    rows = [sweep.run_cell(c, texts[c.source]) for c in cells]
    cell = next(c for c in cells if c.source == "traces/two_jobs.json" and c.knobs == (("small_first", "0"),) and c.seed == 1)
    direct = replay(load_trace(ROOT / "traces/two_jobs.json").reseeded(1).with_scheduler({"small_first": "0"}), "rlix")
    row = rows[cell.index]
    assert (row.makespan_s, row.gpu_utilization, row.plans) == (direct.makespan_s, direct.gpu_utilization, direct.plans)
    assert row.max_jct_s == max(p.jct_s for p in direct.pipelines.values()) and row.knobs == (("small_first", 0.0),)

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    sweep_plot.write_outputs(first, [KNOB], [0, 1], ["rlix"], sweep.sorted_rows(rows))
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    sweep_plot.write_outputs(second, [KNOB], [0, 1], ["rlix"], sweep.sorted_rows(shuffled))
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    lines = (first / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("trace,source,policy,seed,small_first,makespan_s,")
    assert [line.split(",")[:5] for line in lines[1:3]] == [
        ["single", "traces/single.json", "rlix", "0", "0.0"],
        ["single", "traces/single.json", "rlix", "1", "0.0"],
    ]
    assert json.loads((first / "sweep.json").read_text())["rows"][cell.index]["makespan_s"] == direct.makespan_s
    assert (first / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_without_ray_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the exec extra
    code = main(["sweep", "traces/single.json", "--knob", "small_first=0,3", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "rlix-sim: error: sweep runs its replays on Ray, which is not installed; pip install -e '.[exec]'"
    ]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--knob", "small_first"], "--knob small_first: write NAME=V1,V2,..., e.g. --knob small_first=0,1,3"),
        (["--knob", "small_first=0,,3"], "--knob small_first=0,,3: write NAME=V1,V2"),
        (["--knob", "small_first=1,1"], "--knob small_first: a value is given twice"),
        (["--knob", "small_first=0,0.0"], "--knob small_first: 0 and 0.0 are the same value; list each value once"),
        (["--knob", "weight_by_demand=true,yes"], "--knob weight_by_demand: true and yes are the same value"),
        (["--knob", "small_fist=0,1"], "--knob small_fist=0: traces/single.json: scheduler.small_fist: Extra inputs"),
        (
            ["--knob", "small_first=0,99"],
            "--knob small_first=99: traces/single.json: scheduler.small_first: Input should be less",
        ),
        (["--knob", "small_first=0", "--knob", "small_first=1"], "--knob: a knob is named twice"),
        (["--knob", "small_first=0", "--seeds", "a,b"], "--seeds a,b: write whole numbers or ranges separated by commas"),
        (["--knob", "small_first=0", "--seeds", "7-0"], "--seeds 7-0: '7-0' runs backwards; write the lower seed first"),
        (["--knob", "small_first=0", "--seeds", "1_000"], "--seeds 1_000: write whole numbers or ranges"),
        (["--knob", "small_first=0", "--seeds", "+3"], "--seeds +3: write whole numbers or ranges"),
        (["--knob", "small_first=0", "--seeds", "0-\u0663"], "write whole numbers or ranges"),
        (["--knob", "small_first=0", "--seeds", "1" * 5000], "write whole numbers or ranges"),
        (["--knob", "small_first=0", "--seeds", "-1"], "--seeds -1: seeds are whole numbers >= 0; drop the minus sign"),
        (["--knob", "small_first=0", "--seeds", "0-3,2"], "--seeds 0-3,2: a seed is given twice"),
        (["--knob", "small_first=0", "--seeds", "0-100000000"], "--seeds 0-100000000: more than 10,000 seeds"),
        (["--knob", "small_first=0", "--seeds", "0-99999999999999999999999"], "more than 10,000 seeds"),
        (["--knob", "small_first=0", "--policy", "fifo"], "--policy fifo: unknown policy"),
        (["--knob", "small_first=0", "--out", "README.md"], "--out README.md: is a file; give a folder"),
        (["--knob", "tenants=a:1,b:2"], "--knob tenants: a sweep varies knobs that are numbers or true/false"),
        ([], "the following arguments are required: --knob"),
    ],
)
def test_sweep_bad_arguments_are_one_line_exit_2_before_ray_starts(args, expected, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "run_on_ray", None)  # reaching Ray would fail the test with a TypeError
    line = error_in_process(capsys, "sweep", "traces/single.json", *args)
    assert expected in line, line


def test_a_grid_of_knobs_that_depend_on_each_other_is_checked_as_its_cells_are():
    """Each cell is valid (a heartbeat below each TTL): a check of one knob at a time against the trace's
    other values refused the grid."""
    from rlix.sim.sweep import Knob, load_texts

    texts = load_texts(
        ["traces/two_jobs.json"], [Knob(name="heartbeat_s", values=("700",)), Knob(name="report_ttl_s", values=("1000", "2000"))]
    )
    assert list(texts) == ["traces/two_jobs.json"]


def test_a_job_that_cannot_roll_out_under_a_policy_is_refused_before_any_replay(tmp_path, capsys):
    """Before: ``validate`` said ok, then the replay failed with a traceback under ``static`` as the job arrived."""
    trace = tmp_path / "t.json"
    roles = {"actor_train": {"gpus": [0, 1]}, "actor_infer": {"gpus": [0, 1], "gpus_per_worker": 2}}
    job = {"id": "a", "home": [1], "roles": roles, "steps": [{"trajectories": [1]}]}  # its one bundle is 0-1
    trace.write_text(
        json.dumps({"format": "rlix-trace", "version": 1, "cluster": {"nodes": 1, "gpus_per_node": 2}, "pipelines": [job]})
    )
    line = error_in_process(capsys, "replay", str(trace), "--quiet")
    assert "pipelines[0] ('a'): no actor_infer bundle lies inside its home GPUs, so it cannot roll out under static" in line
    assert main(["replay", str(trace), "--policy", "rlix", "--quiet", "--no-alone"]) == 0
    assert main(["validate", str(trace)]) == 0
    assert "note: pipelines[0] ('a'): no actor_infer bundle" in capsys.readouterr().out


def test_an_output_that_cannot_be_written_after_the_replay_is_one_line_exit_2(capsys):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    line = error_in_process(capsys, "replay", "traces/single.json", "--json", "/dev/full", "--quiet", "--no-alone")
    assert "--json /dev/full: not written (No space left on device); run it again with another path" in line


def test_sweep_rows_of_two_traces_of_one_name_are_told_apart_by_their_files():
    labels = sweep_plot.trace_labels({"a/t.json": "t", "b/t.json": "t", "u.json": "u"})
    assert labels == {"a/t.json": "a/t.json", "b/t.json": "b/t.json", "u.json": "u"}


def test_sweep_missing_trace_is_one_line_exit_2(capsys):
    line = error_in_process(capsys, "sweep", "traces/single.json", "no/such.json", "--knob", "small_first=0")
    assert "no/such.json: no such file" in line


# ------------------------------------------------------------------ sweep on Ray


def ray_env(tmp: Path) -> dict:
    """A local Ray with a token of its own: nothing read from or written to ~/.ray."""
    token = tmp / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(name, None)
    return env


SWEEP_TRACES = ("traces/two_jobs.json", "traces/single.json", "traces/agentic_swe.json")


@pytest.mark.heavy
def test_sweep_on_ray_equals_the_same_replays_in_one_process(tmp_path):
    """3 traces x 3 values of small_first x 2 seeds under rlix = 18 replays on Ray, then the same 18 here, one by one.

    Measured on 2 cores: the command 16-22 s (Ray's start included), the whole test about 30 s, at a load
    average near 9 from another test suite; about 95 s for the whole test at a load average above 20.
    """
    out = tmp_path / "ray"
    args = ["sweep", *SWEEP_TRACES, "--knob", "small_first=0,1,3", "--seeds", "0,1", "--policy", "rlix", "--out", str(out)]
    started = time.perf_counter()
    res = run_cli(*args, env=ray_env(tmp_path))
    wall = time.perf_counter() - started
    assert res.returncode == 0, res.stderr[-3000:]
    assert "18 replays in" in res.stdout, res.stdout
    print(f"sweep of 18 replays: {wall:.1f} s wall (the command, Ray start included)")

    knob = sweep.Knob(name="small_first", values=("0", "1", "3"))
    texts = sweep.load_texts(list(SWEEP_TRACES), [knob])
    cells = sweep.grid(list(SWEEP_TRACES), [knob], [0, 1], ["rlix"])
    here = tmp_path / "here"
    here.mkdir()
    in_process = sweep.sorted_rows([sweep.run_cell(c, texts[c.source]) for c in cells])
    sweep_plot.write_outputs(here, [knob], [0, 1], ["rlix"], in_process)
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        assert (out / name).read_bytes() == (here / name).read_bytes(), name

    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert len(rows) == 18 and len({(r["trace"], r["seed"], r["small_first"]) for r in rows}) == 18
    cell = next(r for r in rows if r["trace"] == "two_jobs" and r["seed"] == 1 and r["small_first"] == 0.0)
    direct = replay(load_trace(ROOT / "traces/two_jobs.json").reseeded(1).with_scheduler({"small_first": "0"}), "rlix")
    assert cell["makespan_s"] == direct.makespan_s and cell["plans"] == direct.plans
    assert cell["mean_jct_s"] == sum(p.jct_s for p in direct.pipelines.values()) / len(direct.pipelines)


@pytest.mark.heavy
def test_sweep_joins_a_running_cluster_with_address(tmp_path):
    env = ray_env(tmp_path)
    head = subprocess.Popen(  # a driver that owns a local cluster until its stdin closes
        [
            sys.executable,
            "-c",
            "import sys, ray; ray.init(address='local', num_cpus=2, include_dashboard=False, log_to_driver=False); "
            "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "head.err").open("w"),
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        address = head.stdout.readline().strip()
        assert address, (tmp_path / "head.err").read_text()[-3000:]
        res = run_cli("sweep", "traces/single.json", "--knob", "small_first=0,3", "--policy", "rlix", "--address", address,
                      "--out", str(tmp_path / "s"), "--quiet", env=env)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        rows = json.loads((tmp_path / "s" / "sweep.json").read_text())["rows"]
        assert [(r["small_first"], r["makespan_s"]) for r in rows] == [(0.0, rows[0]["makespan_s"]), (3.0, rows[1]["makespan_s"])]
        assert rows[0]["makespan_s"] == replay(load_trace(ROOT / "traces/single.json"), "rlix").makespan_s
    finally:
        head.stdin.close()
        head.wait(timeout=120)


def test_knobs_set_from_python_take_numbers_and_bools_as_well_as_text():
    """Before: ``with_scheduler({"small_first": 1})`` failed with AttributeError ('int' has no 'strip')."""
    trace = load_trace(ROOT / "traces/two_jobs.json")
    knobs = trace.with_scheduler({"small_first": 1, "weight_by_duration": True}).model.scheduler
    assert (knobs.small_first, knobs.weight_by_duration) == (1.0, True)
    assert trace.with_scheduler({"small_first": "1"}).model == trace.with_scheduler({"small_first": 1}).model
    beat = trace.with_scheduler({"heartbeat_s": "60"})
    assert beat.with_scheduler({"heartbeat_s": "null"}).model.scheduler.heartbeat_s is None  # back to its default


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("misfit", "no actor_infer bundle lies inside its home GPUs, so it cannot roll out under static"),
        ("far draw", "rlix-sim: error: --seeds 3: "),
        ("named twice", "TRACE: a trace is named twice"),
    ],
)
def test_sweep_checks_what_a_replay_checks_before_ray_starts(case, expected, tmp_path, capsys, monkeypatch):
    """A job no policy of the grid can place, or a draw past any clock under one of the seeds, is refused
    before Ray starts (it failed in every cell, on Ray), and one file named by two paths is named twice."""
    monkeypatch.setattr(sweep, "run_on_ray", None)  # reaching Ray would fail the test with a TypeError
    doc = json.loads((TRACES / "single.json").read_text())
    p = doc["pipelines"][0]
    if case == "misfit":
        p["roles"]["actor_infer"]["gpus_per_worker"], p["home"] = 2, [0]
    elif case == "far draw":
        p["generate"]["duration"] = {"dist": "lognormal", "median_s": 1e8, "p99_s": 1e9}
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    out = tmp_path / "sweep"
    args = [str(trace), f"{tmp_path}/../{tmp_path.name}/t.json"] if case == "named twice" else [str(trace)]
    line = error_in_process(capsys, "sweep", *args, "--knob", "small_first=0,3", "--seeds", "3", "--out", str(out))
    assert expected in line and (case != "far draw" or "past 1e+09 s" in line), line
    assert not out.exists()  # refused before anything was written


def test_a_seed_on_a_trace_of_written_out_steps_is_refused(tmp_path, capsys):
    """Before: the seed was taken and changed nothing, and the output read as a redraw. A what-if whose added
    job is drawn takes a seed on such a trace: the seed redraws the job."""
    trace, written_job = tmp_path / "t.json", tmp_path / "job.json"
    roles = {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}}
    job = {"id": "a", "roles": roles, "steps": [{"trajectories": [1]}]}
    trace.write_text(
        json.dumps({"format": "rlix-trace", "version": 1, "cluster": {"nodes": 1, "gpus_per_node": 16}, "pipelines": [job]})
    )
    written_job.write_text(json.dumps({**job, "id": "b"}))
    line = error_in_process(capsys, "replay", str(trace), "--seed", "3", "--quiet")
    assert f"--seed 3: {trace} writes every step out, so no seed redraws it; drop --seed" in line
    line = error_in_process(capsys, "whatif", str(trace), "--add", str(written_job), "--seed", "3", "--quiet")
    assert f"--seed 3: {trace} and {written_job} write every step out, so no seed redraws them; drop --seed" in line
    line = error_in_process(capsys, "sweep", str(trace), "--knob", "small_first=0,1", "--seeds", "0-1")
    assert f"--seeds: {trace} writes every step out, so no seed redraws it" in line
    assert main(["replay", str(trace), "--quiet", "--no-alone"]) == 0
    drawn = ["whatif", str(trace), "--add", "examples/whatif_job.json", "--policy", "rlix", "--quiet"]
    assert main([*drawn, "--seed", "3"]) == 0
    capsys.readouterr()
