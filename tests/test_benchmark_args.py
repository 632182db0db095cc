"""The benchmark scripts refuse bad arguments as the project's tools do: one line, exit 2, before any replay."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("cotenancy.py", ["--seeds", "4-x"], "cotenancy: --seeds 4-x: write whole numbers or ranges separated by commas"),
        ("cotenancy.py", ["--seeds", "7-4"], "cotenancy: --seeds 7-4: '7-4' runs backwards"),
        ("cotenancy.py", ["small_first=1", "--seeds=0-99999999999999999999"], "cotenancy: --seeds 0-99999999999999999999: more"),
        ("cotenancy.py", ["small_first"], "cotenancy: 'small_first' is not KNOB=VALUE"),
        ("cotenancy.py", ["small_first=0", "small_first=3"], "cotenancy: small_first: given twice (0 and 3)"),
        ("cotenancy.py", ["--seeds", "0-3", "x=1", "--seeds=4"], "cotenancy: --seeds: given twice (0-3 and 4); give it once"),
        ("placement.py", ["--seeds", "0", "--trace", "a", "--trace", "b"], "placement: --trace: given twice (a and b)"),
        ("straggler_order.py", ["--seeds", "0", "small_first=0", "small_first=3"], "straggler_order: small_first: given twice"),
        ("sharing_families.py", ["queues=[{name: q, gpus: 0-15, max_jobs: 1}]"], "gpus must be GPUs of the cluster (0..7)"),
        ("slowdown_family.py", [".", "two_jobs", "-1"], "slowdown_family: SEEDS: seeds are whole numbers >= 0"),
        ("placement.py", ["--bogus"], "placement: unrecognized arguments: --bogus (see 'python benchmarks/placement.py --help')"),
        ("overreport.py", ["nonexist.json"], "overreport: nonexist.json: no such file"),
        ("overreport.py", ["--seeds", "-1"], "overreport: --seeds -1: write s and whole numbers >= 0"),
        ("overreport.py", ["--factor", "0"], "overreport: argument --factor: 0: give a number from 1 to 1000"),
        ("overreport.py", ["--factor", "1e308"], "overreport: argument --factor: 1e308: give a number from 1 to 1000"),
        ("overreport.py", ["{far}"], "step 0 draws"),
        ("placement.py", ["--trace", "{far}", "--seeds", "0"], "past 1e+09 s"),
        ("straggler_order.py", ["--trace", "{far}", "--seeds", "0"], "past 1e+09 s"),
        ("slowdown.py", ["{misfit}"], "cannot roll out under static"),
        ("bench_sim.py", ["{misfit}", "--policy", "static"], "cannot roll out under static"),
        ("slowdown.py", ["nonexist.json"], "slowdown: nonexist.json: no such file"),
        ("bench_sim.py", ["nonexist.json"], "bench_sim: nonexist.json: no such file"),
        ("bench_sim.py", ["traces/single.json", "--policy", "nope"], "bench_sim: argument --policy: invalid choice: 'nope'"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2_before_any_replay(script: str, args: list[str], expected: str, tmp_path):
    """``{misfit}``: a job that cannot roll out under ``static``; ``{far}``: a draw past any clock."""
    doc = json.loads((BENCHMARKS.parent / "traces" / "single.json").read_text())
    misfit, far = copy.deepcopy(doc), copy.deepcopy(doc)
    misfit["pipelines"][0]["roles"]["actor_infer"]["gpus_per_worker"], misfit["pipelines"][0]["home"] = 2, [0]
    far["pipelines"][0]["generate"]["duration"] = {"dist": "lognormal", "median_s": 1e8, "p99_s": 1e9}
    paths = {"misfit": tmp_path / "misfit.json", "far": tmp_path / "far.json"}
    paths["misfit"].write_text(json.dumps(misfit))
    paths["far"].write_text(json.dumps(far))
    args = [str(paths[a[1:-1]]) if a in ("{misfit}", "{far}") else a for a in args]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert not done.stdout


def test_placement_prints_a_trace_where_nothing_is_put_back():
    """``single.json`` puts no trajectory back under either placement: the change column reads '-', not a crash."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "placement.py"), "--trace", "traces/single.json", "--seeds", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("continue", "requeue"))]
    assert len(rows) == 4 and [r[5] for r in rows if r[1] == "longest_held"] == ["-", "-"], done.stdout
