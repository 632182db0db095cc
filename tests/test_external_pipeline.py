"""The example pipeline written outside rlix's recipe (examples/external_pipeline.py): its learning
rule in-process, and the whole pipeline beside an ``rlix-run`` job under the cluster's shared
scheduler. The client library it stands on (the elastic pool, the blocking client, placement) is
tested in tests/test_elastic_pool.py."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_cluster import free_port, job, scheduler_running, write_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "external_pipeline.py"


def example():
    """The example's module, imported from its path (examples/ is not a package)."""
    name = "external_pipeline_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while being built
        spec.loader.exec_module(module)
    return sys.modules[name]


# ------------------------------------------------------------------ the learning rule


def test_reinforce_raises_the_reward_and_repeats_exactly():
    ep = example()
    rewards = ep.train_in_process(8, 32, seed=0)
    assert rewards == ep.train_in_process(8, 32, seed=0)  # same seed, same figures
    assert rewards[-1] - rewards[0] > 0.15, rewards
    rises = []
    for seed in range(4):
        r = ep.train_in_process(8, 32, seed=seed)
        rises.append((r[-2] + r[-1]) / 2 - (r[0] + r[1]) / 2)
    assert min(rises) > 0.1, rises


def test_a_trajectory_depends_on_seed_step_and_index_only():
    ep = example()
    means, probs = ep.arm_means(0), ep.Policy().probs()
    assert ep.play(probs, means, 0, 2, 5) == ep.play(probs, means, 0, 2, 5)
    outcomes = {ep.play(probs, means, 0, step, i) for step in range(4) for i in range(32)}
    assert {arm for arm, _ in outcomes} == set(range(len(means)))  # a uniform policy reaches every arm
    greedy = [0.0] * len(means)
    greedy[3] = 1.0
    assert {ep.play(greedy, means, 1, 0, i)[0] for i in range(16)} == {3}


# ------------------------------------------------------------------ its topology and command line


def test_topology_trains_at_home_and_rolls_out_anywhere():
    from rlix.core import ClusterSpec, Role, SchedulingError
    from rlix.core.topology import validate_pipeline

    ep = example()
    cluster = ClusterSpec(nodes=1, gpus_per_node=4)
    spec = ep.pipeline_spec("bandit", (2, 3), cluster, priority=1)
    validate_pipeline(cluster, spec)
    assert spec.role(Role.ACTOR_TRAIN).gpus == (2, 3) and spec.init_gpus == (2, 3) and spec.home_gpus == (2, 3)
    assert spec.role(Role.ACTOR_INFER).gpus == (0, 1, 2, 3) and spec.priority == 1
    with pytest.raises(SchedulingError, match="must lie in 0..3"):
        validate_pipeline(cluster, ep.pipeline_spec("bandit", (4,), cluster, priority=0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "a,b"], "external_pipeline: --gpus a,b: 'a,b' is not a GPU list"),
        (["--steps", "0"], "external_pipeline: --steps 0 --batch 32: both must be >= 1"),
        (["--address", "127.0.0.1:{free}"], "external_pipeline: --address 127.0.0.1:"),  # nothing listens
    ],
)
def test_bad_arguments_are_one_line_exit_2(args, message, capsys):
    """The free port is picked as the test runs: one picked at collection may be taken by then (a Ray
    cluster another test started)."""
    assert example().main([a.format(free=free_port()) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


# ------------------------------------------------------------------ beside an rlix-run job


def holding(snapshot: dict) -> dict[str, list[int]]:
    """The GPUs each job holds in a status snapshot (jobs holding none left out)."""
    return {job["name"]: [gpu for gpu, _ in job["gpus"]] for job in snapshot["jobs"] if job["gpus"]}


@pytest.mark.heavy
@pytest.mark.exec
def test_external_pipeline_beside_rlix_run(tmp_path):
    with scheduler_running(tmp_path) as (cluster, procs):
        # its rollout may use all 4 GPUs; two ranks make its steps long enough for the example to join it
        solo = write_config(tmp_path / "solo.yaml", [job("solo", "0-1", steps=4, ranks=2)])
        run = cluster.submit(solo)
        procs.append(run)
        ext = None
        snapshots = []
        deadline = time.monotonic() + 600
        while run.poll() is None or (ext is not None and ext.poll() is None):
            assert time.monotonic() < deadline, "the two jobs did not end within 600 s"
            snapshots.append(cluster.status()[0])
            if ext is None and "solo" in holding(snapshots[-1]):  # the rlix-run job holds GPUs: the example joins it
                cmd = [sys.executable, str(EXAMPLE), "--address", cluster.address, "--name", "bandit", "--gpus", "2,3"]
                out, err = (open(tmp_path / f"ext.{s}", "w") for s in ("out", "err"))
                ext = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=cluster.env, cwd=tmp_path)
                procs.append(ext)
            time.sleep(1.0)
        logs = {name: (tmp_path / name).read_text()[-3000:] for name in ("solo.out", "solo.err", "ext.out", "ext.err")}
        assert run.returncode == 0, logs
        assert ext is not None and ext.returncode == 0, logs

        for snap in snapshots:  # never more GPUs held than the cluster has, and no GPU held twice
            held = [gpu for gpus in holding(snap).values() for gpu in gpus]
            assert sum(len(job["gpus"]) for job in snap["jobs"]) <= 4 and len(set(held)) == len(held), snap
        assert any(set(holding(snap)) == {"solo", "bandit"} for snap in snapshots), snapshots
        # Its rewards are those of the same learning in-process, however the scheduler moved its workers.
        r = example().train_in_process(8, 32, seed=0)
        assert re.search(rf"bandit: finished steps=8/8, reward {r[0]:.3f} -> {r[-1]:.3f}", logs["ext.out"]), logs["ext.out"]
        # Each worker played on the device of the GPU it was expanded onto: every trajectory once, on the cluster's.
        per_device = ast.literal_eval(re.search(r"bandit: trajectories per rollout device (\{.*\})", logs["ext.out"]).group(1))
        assert set(per_device) <= {"0", "1", "2", "3"} and sum(per_device.values()) == 8 * 32, per_device

        # Alone now, found as Ray's 'auto' finds the cluster this host runs.
        cmd = [sys.executable, str(EXAMPLE), "--address", "auto", "--name", "bandit2", "--steps", "2", "--gpus", "0"]
        alone = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env, cwd=tmp_path, timeout=300)
        r = example().train_in_process(2, 32, seed=0)
        assert alone.returncode == 0, alone.stderr[-3000:]
        assert f"bandit2: finished steps=2/2, reward {r[0]:.3f} -> {r[-1]:.3f}" in alone.stdout, alone.stdout


def test_the_example_is_short_and_speaks_through_the_client_library_only():
    import ast

    tree = ast.parse(EXAMPLE.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert len(EXAMPLE.read_text().splitlines()) <= 200
    assert not {m for m in imported if m == "rlix.exec" or m.startswith("rlix.exec.")}, imported
    assert {"rlix.client", "rlix.elastic_pool"} <= imported
