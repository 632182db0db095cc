"""The rlix-sim command as a user runs it: output, files, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from rlix.config import TOO_MANY_DIGITS
from rlix.sim.cli import main
from rlix.trace import SCHEMA_PATH, json_schema

ROOT = Path(__file__).parent.parent
TRACES = ROOT / "traces"
METRIC_KEYS = {
    "gpu_utilization",
    "idle_fraction",
    "switch_overhead_fraction",
    "stranded_fraction",
    "throughput_steps_per_hour",
    "trajectories_per_hour",
    "makespan_s",
    "makespan_lower_bound_s",
    "preemptions",
    "trajectories_requeued",
    "trajectories_lost",
}
PIPELINE_KEYS = {"jct_s", "step_latency_mean_s", "step_latency_p50_s", "step_latency_p99_s"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlix.sim.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_replay_prints_a_table_and_writes_json_and_png(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    res = run_cli("replay", "traces/two_jobs.json", "--json", str(out), "--plot", str(png))
    assert res.returncode == 0, res.stderr
    for word in ("static", "partial_overlap", "rlix", "gpu_utilization", "lower bound", "throughput vs static", "math-a"):
        assert word in res.stdout
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"static", "partial_overlap", "rlix"}
    for metrics in data["policies"].values():
        assert METRIC_KEYS <= set(metrics)
        assert set(metrics["pipelines"]) == {"math-a", "code-b"}
        for p in metrics["pipelines"].values():
            assert PIPELINE_KEYS <= set(p)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_replay_one_policy(tmp_path):
    out = tmp_path / "r.json"
    assert main(["replay", str(TRACES / "single.json"), "--policy", "rlix", "--quiet", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["policies"]) == ["rlix"]


def test_set_overrides_a_scheduler_knob_of_the_trace(tmp_path):
    def rlix_metrics(*extra: str) -> dict:
        out = tmp_path / "r.json"
        assert main(["replay", str(TRACES / "two_jobs.json"), "--policy", "rlix", "--quiet", "--json", str(out), *extra]) == 0
        return json.loads(out.read_text())["policies"]["rlix"]

    default = rlix_metrics()
    assert rlix_metrics("--set", "weight_by_duration=false") == default  # the trace's own value, restated
    assert rlix_metrics("--set", "min_residency_s=1e9", "--set", "protect_fraction=1") != default
    # the control loop's periods are knobs of the same block: restating the defaults changes nothing, a slower loop does
    assert rlix_metrics("--set", "plan_interval_s=5", "--set", "heartbeat_s=150") == default
    assert rlix_metrics("--set", "plan_interval_s=60") != default
    # a list written as YAML is one (before: always the text, which no list field reads); other text stays text
    assert rlix_metrics("--set", "queues=[]") == default
    assert rlix_metrics("--set", "tenants=a: 1") == rlix_metrics("--set", "tenants=a:1")
    queued = rlix_metrics("--set", "queues=[{name: q, gpus: 0-15, max_jobs: 1}]")
    assert queued["makespan_s"] > default["makespan_s"]  # one job at a time


def test_generate_writes_a_trace_that_validates(tmp_path):
    out = tmp_path / "t.json"
    res = run_cli("generate", "two_jobs", "-o", str(out), "--seed", "3")
    assert res.returncode == 0, res.stderr
    assert run_cli("validate", str(out)).returncode == 0
    assert json.loads(out.read_text())["pipelines"][0]["generate"]["seed"] == 3


def test_shipped_traces_match_the_committed_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema == json.loads(json.dumps(json_schema(), sort_keys=True)), "regenerate: python -m rlix.trace --schema"
    for path in sorted(TRACES.glob("*.json")):
        jsonschema.validate(json.loads(path.read_text()), schema)
    ranged = json.loads((TRACES / "two_jobs.json").read_text())  # GPUs as range strings, as the models read them
    ranged["pipelines"][0]["roles"]["actor_train"]["gpus"], ranged["pipelines"][0]["home"] = "0-7", "0-3, 5"
    jsonschema.validate(ranged, schema)
    ranged["pipelines"][0]["home"] = "0-x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ranged, schema)


def _broken(tmp_path: Path, mutate) -> str:
    raw = json.loads((TRACES / "two_jobs.json").read_text())
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    return str(path)


BAD_TRACES = {
    "missing cluster": (lambda r: r.pop("cluster"), "cluster: Field required"),
    "negative arrival": (lambda r: r["pipelines"][0].update(arrival_s=-5), "pipelines[0].arrival_s"),
    "bundle across nodes": (
        lambda r: r["pipelines"][0]["roles"]["actor_infer"].update(gpus="7-8", gpus_per_worker=2),
        "spans nodes 0 and 1",
    ),
    "gpu outside cluster": (lambda r: r["pipelines"][0]["roles"]["actor_train"].update(gpus="0-99"), "must lie in 0..15"),
    "duplicate pipeline": (lambda r: r["pipelines"].append(r["pipelines"][0]), "'math-a' appears more than once"),
    "unknown field": (lambda r: r["pipelines"][0].update(colour="red"), "pipelines[0].colour: Extra inputs are not permitted"),
    "both step forms": (lambda r: r["pipelines"][0].update(steps=[{"trajectories": [1.0]}]), "exactly one of 'steps'"),
    "wrong version": (lambda r: r.update(version=9), "version: this rlix reads version 1"),
    "bad gpu range": (lambda r: r["pipelines"][0]["roles"]["actor_train"].update(gpus="zero-7"), "is not a GPU list"),
    "infinite model load": (lambda r: r["pipelines"][0].update(init_s=float("inf")), "init_s: Input should be a finite number"),
    "negative seed": (lambda r: r["pipelines"][0]["generate"].update(seed=-1), "generate.seed: Input should be greater"),
    # each of these hung the replay, or filled the memory, before it was refused
    "arrival beyond any clock": (lambda r: r["pipelines"][0].update(arrival_s=1e300), "arrival_s: Input should be less than"),
    "too many trajectories": (
        lambda r: r["pipelines"][0]["generate"].update(steps=100_000, trajectories_per_step=1_000),
        "100000 steps x 1000 trajectories is more than the 10,000,000 one stream may draw",
    ),
    "no steps": (lambda r: r["pipelines"][0].pop("generate") and r["pipelines"][0].update(steps=[]), "pipelines[0].steps: List"),
    "copies arriving past any clock": (
        lambda r: r["pipelines"][0].update(arrivals={"per_hour": 0.001, "count": 1000}),
        "arrivals: a copy would arrive at",
    ),
    "too many trajectories in all": (
        lambda r: r["pipelines"][0].update(arrivals={"per_hour": 1, "count": 5000}),
        "the trace draws 10,242,048 trajectories in all, more than 10,000,000",
    ),
    "a range of a hundred million GPUs": (lambda r: r["pipelines"][0].update(home="0-100000000"), "names more than 100,000"),
    "ranges of too many GPUs in all": (lambda r: r["pipelines"][0].update(home="0-60000,0-60000"), "names more than 100,000"),
    "too many nodes": (
        lambda r: r["cluster"].update(nodes=10_000_000),
        "cluster: 10000000 nodes x 8 GPUs is more than 100,000 GPUs",
    ),
    "turns without end": (
        lambda r: r["pipelines"][0]["generate"].update(agentic={"turns": 10**9, "tool": {"median_s": 1, "p99_s": 2}}),
        "agentic.turns: Input should be less than or equal to 1000",
    ),
    "turns past what a stream may draw": (
        lambda r: r["pipelines"][0]["generate"].update(steps=1000, agentic={"turns": 1000, "tool": {"median_s": 1, "p99_s": 2}}),
        "turns one stream may draw; lower agentic.turns",
    ),
    "a draw past any clock": (  # the replay never ended
        lambda r: r["pipelines"][0]["generate"].update(duration={"median_s": 1e-9, "p99_s": 1e9}),
        "step 0 draws 5.28817e+14 s, past 1e+09 s",
    ),
    # accepted as something else than was meant
    "an open-ended gpu range": (lambda r: r["pipelines"][0]["roles"]["actor_train"].update(gpus="0-"), "is not a GPU list"),
    "a backwards gpu range": (
        lambda r: r["pipelines"][0]["roles"]["actor_train"].update(gpus="7-0"),
        "'7-0' in '7-0' runs backwards",
    ),
    "a home gpu listed twice": (lambda r: r["pipelines"][0].update(home=[0, 0]), "home: GPU 0 is listed twice"),
    "a home gpu the job never uses": (  # it made the job the owner of a GPU it cannot use, and others its guests
        lambda r: r["pipelines"][0]["roles"]["actor_infer"].update(gpus="0-7") or r["pipelines"][0].update(home=[9]),
        "home: GPU 9 is in none of the job's role mappings",
    ),
    "a priority that is not a number": (
        lambda r: r["pipelines"][0].update(priority=True),
        "priority: true is not a priority; write a whole number",
    ),
    # a traceback (OverflowError) on a number the schema allowed
    "a prompt id past 64 bits": (
        lambda r: (
            r["pipelines"][0].pop("generate")
            and r["pipelines"][0].update(
                steps=[{"trajectories": [1.0, 2.0], "prompts": [2**64, 1], "stages": {"actor_train": 1}}]
            )
        ),
        "steps[0].prompts[0]: Input should be less than 9223372036854775808",
    ),
    "slots past any engine": (
        lambda r: r["pipelines"][0].update(slots_per_worker=2**1024),
        "slots_per_worker: Input should be less",
    ),
    "a stage cost's reference past any cluster": (
        lambda r: r["pipelines"][0].update(stage_cost={"reference_gpus": 10**400}),
        "stage_cost.reference_gpus: Input should be less than or equal to 100000",
    ),
    "a tenant's limit past any cluster": (
        lambda r: r["scheduler"].update(tenants=[{"name": "a", "borrow_limit_gpus": 10**400}]),
        "borrow_limit_gpus: Input should be less than or equal to 100000",
    ),
    # validated, then a traceback as the replay's scheduler registered it
    "a model load larger than its tenant may hold": (
        lambda r: r["scheduler"].update(tenants=[{"name": "a", "borrow_limit_gpus": 3}]) or r["pipelines"][0].update(tenant="a"),
        "its model load needs 8 GPUs, more than tenant 'a' may hold (3)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_trace_is_one_line_exit_2_no_traceback(case, tmp_path):
    mutate, expected = BAD_TRACES[case]
    res = run_cli("replay", _broken(tmp_path, mutate))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rlix-sim: error:") and expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["replay", "no/such/trace.json"], "no such file"),
        (["replay", "traces"], "is a folder, not a file"),
        (["replay", "traces/single.json", "--seed", "-1"], "-1 is negative; give a seed >= 0"),
        (["generate", "single", "--seed", "-3"], "-3 is negative"),
        (["sweep", "traces/single.json", "--knob", "small_first=1", "--seeds", "0,-1", "--out", "x"], "whole numbers >= 0"),
        (
            ["sweep", "traces/single.json", "--knob", "small_first=1", "--address", "127.0.0.1:1", "--out", "x"],
            "--address 127.0.0.1:1: no Ray cluster answers there",  # Ray's own retries and tracebacks, for minutes
        ),
        (["replay", "traces/single.json", "--policy", "fifo"], "unknown policy"),
        (["replay", "traces/single.json", "--policy", "rlix", "--policy", "rlix"], "named twice"),
        (["replay", "traces/single.json", "--json", "no/such/dir/x.json"], "folder does not exist"),
        (["replay", "traces/single.json", "--json", "traces"], "--json traces: is a folder"),
        (["replay", "traces/single.json", "--plot", "x.xyz"], "matplotlib cannot write '.xyz'"),
        (["generate", "single", "-o", "traces"], "--output traces: is a folder"),
        (["replay", "traces/single.json", "--json", ""], "--json : is empty; give a path"),  # it wrote nothing, silently
        (["generate", "nope"], "scenario 'nope' is unknown"),
        (["replay", "traces/single.json", "--set", "tenants=a:1:99"], "scheduler.tenants: their guarantees add up to 99"),
        (["sweep", "traces/single.json", "--knob", "small_first=1", "--address", ""], "--address: is empty"),
        (
            ["sweep", "traces/single.json", "--knob", "small_first=1", "--address", "localhost:99999999999999999999"],
            "is not an address",  # an OverflowError from the socket, before
        ),
        (
            ["sweep", "traces/single.json", "--knob", "small_first=1", "--address", "localhost:99999"],
            "no Ray cluster answers there",
        ),
        (["replay"], "required"),
        (["replay", "traces/single.json", "--set", "backlog_weight"], "write KNOB=VALUE"),
        (["replay", "traces/single.json", "--set", "backlog_wieght=1"], "scheduler.backlog_wieght: Extra inputs"),
        (["replay", "traces/single.json", "--set", "backlog_weight=-1"], "scheduler.backlog_weight: Input should be greater"),
        (["replay", "traces/single.json", "--set", "weight_by_duration=1", "--set", "weight_by_duration=0"], "given twice"),
        (["replay", "traces/single.json", "--set", "plan_interval_s=1e-9"], "scheduler.plan_interval_s: Input should be greater"),
        (
            ["replay", "traces/single.json", "--set", "heartbeat_s=600"],
            "scheduler.heartbeat_s: 600.0 s is not below report_ttl_s",
        ),
    ],
)
def test_bad_arguments_are_one_line_exit_2(args, expected, tmp_path):
    res = run_cli(*args)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and expected in res.stderr, res.stderr


def test_a_figure_is_checked_where_it_will_be_written(tmp_path):
    """``--plot fig`` writes fig.png: that is the path checked before any work, not ``fig``."""
    from rlix.plot import figure_path, figure_problem

    (tmp_path / "fig.png").mkdir()
    assert figure_path(tmp_path / "fig") == tmp_path / "fig.png"
    assert figure_problem(tmp_path / "fig") == "is a folder; give a file name inside it"
    assert figure_problem(tmp_path / "other") is None
    assert figure_problem(tmp_path / "fig.xyz") == "matplotlib cannot write '.xyz'; end the name in .png, .svg or .pdf"
    res = run_cli("replay", "traces/single.json", "--plot", str(tmp_path / "fig"))
    assert res.returncode == 2 and f"--plot {tmp_path / 'fig'}: is a folder" in res.stderr, res.stderr


def test_an_output_that_would_overwrite_an_input_or_another_output_is_refused(tmp_path):
    """Before: each of these exited 0 having overwritten the trace, the job file or the JSON."""
    import shutil

    trace = tmp_path / "tj.json"
    shutil.copy("traces/two_jobs.json", trace)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(json.loads(trace.read_text())["pipelines"][0] | {"id": "new"}))
    cases = [
        (["replay", str(trace), "--json", str(trace)], f"--json {trace}: is also the trace; write it to another path"),
        (["replay", str(trace), "--json", f"{tmp_path}/x.png", "--plot", f"{tmp_path}/x"], "--plot"),
        (["whatif", str(trace), "--add", str(job), "--json", str(job)], f"--json {job}: is also --add"),
    ]
    before = trace.read_bytes(), job.read_bytes()
    for args, expected in cases:
        res = run_cli(*args, "--quiet")
        assert res.returncode == 2 and expected in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (trace.read_bytes(), job.read_bytes()) == before
    assert "is also --json" in run_cli("replay", str(trace), "--json", f"{tmp_path}/x.png", "--plot", f"{tmp_path}/x").stderr


def test_a_number_of_more_digits_than_python_reads_is_one_line_not_a_traceback(tmp_path):
    """Before: Python's ValueError for an integer of over 4,300 digits came out as a traceback."""
    text = Path("traces/single.json").read_text().replace('"seed": 0', '"seed": ' + "1" * 5000, 1)
    assert "1" * 5000 in text
    (tmp_path / "big.json").write_text(text)
    res = run_cli("validate", str(tmp_path / "big.json"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == f"rlix-sim: error: {tmp_path / 'big.json'}: {TOO_MANY_DIGITS}"


def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path):
    """Before: JSON and YAML kept the last of two values, so a trace or config ran what it did not say."""
    from rlix.exec.config import ConfigError, load_config

    text = Path("traces/single.json").read_text()
    twice = text.replace('"version": 1,', '"version": 1,\n "version": 1,', 1)
    assert twice != text
    (tmp_path / "twice.json").write_text(twice)
    res = run_cli("validate", str(tmp_path / "twice.json"))
    line = 1 + twice[: twice.index('"version"', twice.index('"version"') + 1)].count("\n")  # the second one's
    assert res.returncode == 2 and res.stderr.strip().endswith(f"line {line}: 'version' is given twice in one object; keep one")
    (tmp_path / "tabs.json").write_text('{\t"a": 1,\t"b": {"c": 2, "c": 3}}')  # JSON that YAML cannot read: no line
    res = run_cli("validate", str(tmp_path / "tabs.json"))
    assert res.returncode == 2 and res.stderr.strip().endswith("tabs.json: 'c' is given twice in one object; keep one")
    (tmp_path / "c.yaml").write_text("policy: rlix\ncluster: {nodes: 1}\npolicy: static\n")
    with pytest.raises(ConfigError, match="line 3: 'policy' is given twice in one mapping; keep one"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "merge.yaml").write_text("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\n")
    from rlix.config import read_document

    assert read_document(tmp_path / "merge.yaml", "yaml", ValueError, "yaml")["x"] == {"a": 1, "b": 3}  # a merge, overridden
    # a mapping merged into another before it is built itself (its override came first as a second key)
    (tmp_path / "nested.yaml").write_text("base: &b {x: 1}\ndefs: [&c {<<: *b, x: 5}]\nd: {<<: *c}\n")
    assert read_document(tmp_path / "nested.yaml", "yaml", ValueError, "yaml")["d"] == {"x": 5}
    (tmp_path / "date.yaml").write_text("a: 2023-02-30\n")
    with pytest.raises(ValueError, match="a value cannot be read \\(day is out of range for month\\); fix it"):
        read_document(tmp_path / "date.yaml", "yaml", ValueError, "yaml")


def test_a_symbolic_link_loop_as_an_output_path_is_named_not_a_traceback(tmp_path):
    from rlix.config import unwritable

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert unwritable(loop) == "cannot be reached (a symbolic link loop); pick another path"
    res = run_cli("replay", "traces/single.json", "--json", str(loop))
    assert res.returncode == 2 and "a symbolic link loop" in res.stderr and "Traceback" not in res.stderr


def test_an_output_path_that_could_not_be_written_is_named_with_why(tmp_path, monkeypatch):
    """``rlix.config.unwritable``, which both CLIs ask before any work."""
    import os

    from rlix.config import unwritable

    (tmp_path / "a_file").write_text("")
    assert unwritable(tmp_path / "new" / "deep", folder=True) is None  # made when the run starts
    assert unwritable(tmp_path / "m.json") is None
    assert unwritable("") == "is empty; give a path"
    assert unwritable(f"{tmp_path}/new/") == "ends in a slash; give a file name"  # it passed, then open() failed
    assert unwritable(tmp_path / "a_file" / "m.json") == f"{tmp_path / 'a_file'} is a file, not a folder; pick another path"
    assert (
        unwritable(tmp_path / "a_file" / "runs", folder=True)
        == f"{tmp_path / 'a_file'} is a file; give a folder path under a folder"
    )

    def unsearchable(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "stat", unsearchable)  # a folder on the way this user may not search
    assert unwritable(tmp_path / "m.json") == "cannot be reached (Permission denied); pick another path"


def test_a_file_nested_too_deep_to_read_is_one_line_exit_2(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError traceback, before
    res = run_cli("validate", str(deep))
    assert res.returncode == 2 and res.stderr.strip() == f"rlix-sim: error: {deep}: nested too deep to read; flatten it"


def test_a_file_that_is_not_utf8_text_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "binary.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    res = run_cli("replay", str(bad))
    want = f"rlix-sim: error: {bad}: not UTF-8 text; give the path of a trace JSON (see traces/)"
    assert res.returncode == 2 and res.stderr.strip() == want


def test_malformed_json_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"cluster": {"nodes": 1,, }')
    res = run_cli("validate", str(bad))
    assert res.returncode == 2 and "not valid JSON (line 1, column" in res.stderr


def test_names_that_look_like_rich_markup_are_printed_as_written(tmp_path, capsys):
    """A trace name or job id with brackets is the user's text: printed literally, never read as markup
    (``job[/]`` crashed the table, after the replay and before the JSON was written)."""
    doc = json.loads((TRACES / "single.json").read_text())
    doc["name"], doc["pipelines"][0]["id"] = "exp [dapo] v2\\", "job[/]\\"  # a backslash last is text too
    trace, out = tmp_path / "t.json", tmp_path / "r[b].json"
    trace.write_text(json.dumps(doc))
    assert main(["replay", str(trace), "--policy", "rlix", "--no-alone", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exp [dapo] v2\\ - metrics" in printed and "job[/]\\ " in printed, printed
    assert f"wrote {out}" in printed.replace("\n", ""), printed
    assert "\\\\" not in printed, printed
    assert list(json.loads(out.read_text())["policies"]["rlix"]["pipelines"]) == ["job[/]\\"]
    job = json.loads((ROOT / "examples" / "whatif_job.json").read_text())
    job["id"] = "new[/b]"
    added = tmp_path / "job.json"
    added.write_text(json.dumps(job))
    assert main(["whatif", str(TRACES / "two_jobs.json"), "--add", str(added), "--policy", "rlix"]) == 0
    assert "+ new[/b]" in capsys.readouterr().out


def test_a_job_id_with_dollar_signs_is_drawn_as_text_not_mathtext(tmp_path):
    """matplotlib reads ``$...$`` as mathtext: ``a$^$b`` crashed the figure after the replays."""
    doc = json.loads((TRACES / "single.json").read_text())
    doc["name"], doc["pipelines"][0]["id"] = "t$x^$", "a$^$b"
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    trace.write_text(json.dumps(doc))
    assert main(["replay", str(trace), "--policy", "rlix", "--no-alone", "--quiet", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
