"""The example pipeline written outside rlix's recipe (examples/external_pipeline.py):
its learning rule and rollout engine in-process, and the whole pipeline beside an
``rlix-run`` job under the cluster's shared scheduler."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from service_cluster import ServiceCluster, free_port, job, write_config

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
    assert {arm for arm, _ in outcomes} == set(range(ep.ARMS))  # a uniform policy reaches every arm
    greedy = [0.0] * ep.ARMS
    greedy[3] = 1.0
    assert {ep.play(greedy, means, 1, 0, i)[0] for i in range(16)} == {3}


# ------------------------------------------------------------------ the rollout engine


def expected(ep, probs, step: int, size: int) -> list[tuple[int, int, float]]:
    means = ep.arm_means(0)
    return [(i, *ep.play(probs, means, 0, step, i)) for i in range(size)]


def test_rollouts_deal_a_batch_across_expands_and_shrinks():
    ep = example()
    means, probs = ep.arm_means(0), ep.Policy().probs()
    reports = []

    async def report(demand):
        reports.append(demand)

    async def run():
        engine = ep.Rollouts("bandit", lambda gpus: ep.Player(gpus, means, 0, 0.01), report_s=0.005)
        engine.expand((0,))
        batch = asyncio.get_running_loop().create_task(engine.play(probs, 3, 24, report=report))
        await asyncio.sleep(0.035)
        engine.expand((1,))
        engine.expand((2,))
        await asyncio.sleep(0.035)
        await engine.shrink((0,))  # its trajectory in flight is played again elsewhere
        assert (0,) not in engine.running
        return engine, await batch

    engine, trajs = asyncio.run(run())
    assert [(t.idx, t.arm, t.reward) for t in trajs] == expected(ep, probs, 3, 24)  # every one once, same outcome
    assert set(Counter(t.gpu for t in trajs)) == {0, 1, 2}
    assert set(engine.workers) == {(1,), (2,)}
    first = reports[0]
    assert first.pipeline_id == "bandit" and first.batch_size == 24
    assert first.pending + sum(w.active for w in first.loads) == 24  # reported before anything finished
    assert any({w.first_gpu for w in r.loads} == {1, 2} for r in reports)  # the new workers' loads were reported
    assert all(a != b for a, b in zip(reports, reports[1:]))  # sent when the demand changed only
    assert engine.demand(24) == ep.ReportDemand(pipeline_id="bandit", pending=0, batch_size=24, finished=24)


def test_a_dead_worker_is_reported_lost_and_its_trajectory_played_again():
    import ray.exceptions

    ep = example()
    means, probs = ep.arm_means(0), ep.Policy().probs()

    class Dies(ep.Player):
        async def rollout(self, probs, step, idx):
            await asyncio.sleep(self.traj_s)
            raise ray.exceptions.RayActorError()  # its process is gone

    lost = []

    async def on_lost(gpus):
        lost.append(gpus)

    async def run():
        start = lambda gpus: (Dies if gpus == (0,) else ep.Player)(gpus, means, 0, 0.01)
        engine = ep.Rollouts("bandit", start, lost=on_lost)
        engine.expand((0,))
        engine.expand((1,))
        return engine, await engine.play(probs, 0, 8)

    engine, trajs = asyncio.run(run())
    assert lost == [(0,)]
    assert [(t.idx, t.arm, t.reward) for t in trajs] == expected(ep, probs, 0, 8)
    assert {t.gpu for t in trajs} == {1} and set(engine.workers) == {(1,)}


def test_a_worker_error_fails_the_batch():
    ep = example()

    class Broken(ep.Player):
        async def rollout(self, probs, step, idx):
            raise ValueError("bad arm")

    async def run():
        engine = ep.Rollouts("bandit", lambda gpus: Broken(gpus, ep.arm_means(0), 0, 0.0))
        engine.expand((0,))
        await engine.play(ep.Policy().probs(), 0, 4)

    with pytest.raises(ValueError, match="bad arm"):
        asyncio.run(run())


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
        (["--address", f"127.0.0.1:{free_port()}"], "external_pipeline: --address 127.0.0.1:"),  # nothing listens
    ],
)
def test_bad_arguments_are_one_line_exit_2(args, message, capsys):
    assert example().main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


# ------------------------------------------------------------------ beside an rlix-run job


def holding(snapshot: dict) -> dict[str, list[int]]:
    """The GPUs each job holds in a status snapshot (jobs holding none left out)."""
    return {job["name"]: [gpu for gpu, _ in job["gpus"]] for job in snapshot["jobs"] if job["gpus"]}


@pytest.mark.heavy
@pytest.mark.exec
def test_external_pipeline_beside_rlix_run(tmp_path):
    cluster = ServiceCluster(tmp_path)
    cluster.start()
    procs: list[subprocess.Popen] = []
    try:
        res = cluster.rlix("scheduler", "start")
        assert res.returncode == 0, res.stderr[-2000:]
        solo = write_config(tmp_path / "solo.yaml", [job("solo", "0-1", steps=4)])  # its rollout may use all 4 GPUs
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
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        cluster.stop()
