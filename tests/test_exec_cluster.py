"""``rlix-run --address``: joining a Ray cluster that is already running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from service_cluster import ServiceCluster, free_port

ROOT = Path(__file__).resolve().parent.parent


def tiny_config(
    tmp_path: Path, gpus: int, nodes: int = 1, out: str | None = None, train: int = 0, rollout_gpus: int | None = None
) -> Path:
    """One tiny full-finetune job, two steps, trained on GPU ``train``, its rollout on the first
    ``rollout_gpus`` GPUs of ``nodes`` x ``gpus`` (all of them by default)."""
    cfg = {
        "cluster": {"nodes": nodes, "gpus_per_node": gpus},
        "scheduler": {"min_residency_s": 5.0, "report_ttl_s": 10.0},
        "output": {"dir": out or str(tmp_path / "out"), "console": False},
        "jobs": [
            {
                "name": "solo",
                "model": {"size": {"arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
                "task": {"name": "copy", "min_len": 1, "max_len": 6},
                "steps": 2,
                "prompts_per_step": 4,
                "group_size": 4,
                "max_new_tokens": 8,
                "slots_per_worker": 4,
                "roles": {"actor_train": {"gpus": [train]}, "actor_infer": {"gpus": f"0-{(rollout_gpus or nodes * gpus) - 1}"}},
            }
        ],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def rlix_run(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlix.exec.front.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=400, env=env
    )


@pytest.mark.exec
@pytest.mark.parametrize("where", ["--address", "ray.address"])
def test_unreachable_address_is_one_line_exit_2(tmp_path, where):
    address = f"127.0.0.1:{free_port()}"
    config = tiny_config(tmp_path, 4)
    if where == "--address":
        res = rlix_run(str(config), "--address", address)
    else:
        config.write_text(config.read_text() + f"ray: {{address: '{address}'}}\n")
        res = rlix_run(str(config))
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlix-run: cluster error: {where} {address}: no Ray cluster answers there"), last
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.exec
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--out", "{tmp}/a_file"], "--out {tmp}/a_file: is a file; give a folder"),
        (["--out", "{tmp}/a_file/runs"], "--out {tmp}/a_file/runs: {tmp}/a_file is a file; give a folder path under a folder"),
        (
            ["--out", "{tmp}/out", "--json", "{tmp}/no/such/m.json"],
            "--json {tmp}/no/such/m.json: its folder does not exist; create it or pick another path",
        ),
        (["--out", "{tmp}/out", "--json", "{tmp}"], "--json {tmp}: is a folder; give a file name inside it"),
        (
            ["--out", "{tmp}/out", "--json", "{tmp}/tiny.yaml"],
            "--json {tmp}/tiny.yaml: is also the config; write it to another path",
        ),
        ([], "output.dir {tmp}/a_file: is a file; give a folder"),
    ],
)
def test_outputs_that_could_not_be_written_are_refused_before_ray_starts(tmp_path, args, expected):
    """Before, a traceback: at Ray's start for the folder, and for --json after the whole run."""
    (tmp_path / "a_file").write_text("")
    config = tiny_config(tmp_path, 2, out=str(tmp_path / "a_file"))
    res = rlix_run(str(config), *(a.format(tmp=tmp_path) for a in args), env={**os.environ, "RAY_ADDRESS": ""})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"rlix-run: error: {expected.format(tmp=tmp_path)}"


@pytest.mark.exec
def test_a_checkpoint_folder_that_could_not_be_written_is_refused_before_ray_starts(tmp_path):
    """Before: found as the first checkpoint was saved, after a step's training."""
    (tmp_path / "a_file").write_text("")
    config = tiny_config(tmp_path, 2)
    raw = yaml.safe_load(config.read_text())
    raw["jobs"][0]["checkpoint_dir"] = f"{tmp_path}/a_file/ck"
    config.write_text(yaml.safe_dump(raw))
    res = rlix_run(str(config), env={**os.environ, "RAY_ADDRESS": ""})
    assert res.returncode == 2, res.stderr
    expected = f"jobs[0].checkpoint_dir {tmp_path}/a_file/ck: {tmp_path}/a_file is a file; give a folder path under a folder"
    assert res.stderr.strip() == f"rlix-run: error: {expected}"


@pytest.mark.heavy
def test_joins_an_existing_cluster_and_refuses_one_too_small(tmp_path):
    # `ray start --head` with 4 GPUs and token authentication with a token of its own (a temp file):
    # nothing is read from ~/.ray.
    cluster = ServiceCluster(tmp_path)
    port, env = cluster.port, cluster.env
    cluster.start()
    try:
        # The output directory (and the model built under it) relative to where rlix-run runs, not
        # where the cluster was started: every path is made absolute before any actor starts.
        config = tiny_config(tmp_path, 4, out="out", rollout_gpus=2)  # 2 rollout processes are enough to show it
        res = rlix_run(config.name, "--address", f"127.0.0.1:{port}", "--no-console", env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "solo: finished steps=2" in res.stdout and "trajectories_lost=0" in res.stdout
        [run] = (tmp_path / "out").iterdir()  # a run through the scheduler writes under its job id
        assert re.fullmatch(r"solo#\d+", run.name) and f"outputs in {run}" in res.stderr
        for name in ("timeline.json", "trace.json", "metrics.json"):
            assert (run / name).is_file()

        big = tmp_path / "big"
        big.mkdir()
        res = rlix_run(str(tiny_config(big, 8)), "--address", f"127.0.0.1:{port}", env=env)
        assert res.returncode == 2
        assert "the Ray cluster has 4 GPUs but cluster in the config needs 8" in res.stderr.strip().splitlines()[-1]

        # Without an address, a run starts its own local cluster, even while `ray start` runs one here
        # (a plain ray.init() would join that one and refuse the run's GPU count).
        own = tmp_path / "own"
        own.mkdir()
        res = rlix_run(str(tiny_config(own, 2)), "--no-console", env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "solo: finished steps=2" in res.stdout
    finally:
        cluster.stop()


@pytest.mark.heavy
def test_two_node_cluster_reserves_the_gpus_and_pins_every_worker_to_the_node_that_holds_them(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    from rlix.core import ClusterSpec
    from rlix.exec.config import load_config
    from rlix.exec.control.gpu_reservation import release, reserve
    from rlix.exec.front import api
    from rlix.exec.placement import actor_options

    nodes2 = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
    nodes2.add_node(num_cpus=1, num_gpus=2)
    try:
        ray.init(address=nodes2.address, log_to_driver=False)
        spec = ClusterSpec(nodes=2, gpus_per_node=2)
        gpu_map = reserve(spec)
        assert gpu_map.devices == (("0", "1"), ("0", "1"))  # each node's device ids, read back from Ray

        # Ray accounts the reserved GPUs: other Ray work asking for one is not placed
        other = ray.remote(num_gpus=1, num_cpus=0)(lambda: 1).remote()
        assert ray.wait([other], timeout=3)[0] == []
        ray.cancel(other)

        @ray.remote
        def where():
            path = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
            return ray.get_runtime_context().get_node_id(), os.environ["CUDA_VISIBLE_DEVICES"], path

        seen = {
            gpus: ray.get(where.options(**actor_options(spec, gpus, gpu_map, "probe")).remote())
            for gpus in ((0,), (1,), (2,), (3,), (2, 3))
        }
        assert {gpus: local for gpus, (_, local, _) in seen.items()} == {
            (0,): "0",
            (1,): "1",
            (2,): "0",
            (3,): "1",
            (2, 3): "0,1",
        }
        node = {gpus: n for gpus, (n, _, _) in seen.items()}
        # a cluster joined with no runtime env of rlix's: the workers get the path of the driver's rlix first
        import rlix

        assert {path for _, _, path in seen.values()} == {str(Path(rlix.__file__).resolve().parent.parent)}
        assert node[(0,)] == node[(1,)] != node[(2,)] == node[(3,)] == node[(2, 3)]
        release(gpu_map)

        # a job whose rollout spans both nodes and whose trainer runs on the second node runs to the end
        out = api.run(load_config(tiny_config(tmp_path, 2, nodes=2, train=2)))
        assert out.results["solo"].status.value == "finished" and len(out.results["solo"].steps) == 2
        assert out.metrics.trajectories_lost == 0
    finally:
        ray.shutdown()
        nodes2.shutdown()


@pytest.mark.exec
def test_a_worker_that_sees_other_devices_than_its_bundle_fails_at_once(monkeypatch):
    from rlix.exec.placement import EXPECTED_DEVICES, DeviceMismatchError, check_devices

    monkeypatch.setenv(EXPECTED_DEVICES, "2,3")
    monkeypatch.setenv("RLIX_WORKER", "job/rollout2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert check_devices() == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what Ray before 2.56 did to an actor asking for no GPU
    with pytest.raises(DeviceMismatchError, match=r"^job/rollout2: CUDA_VISIBLE_DEVICES is '' but its bundle's GPUs are '2,3'"):
        check_devices()


def test_own_device_ids_are_those_ray_reads(monkeypatch):
    from rlix.exec.control.gpu_reservation import own_devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert own_devices(3) == ("0", "1", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert own_devices(2) == ("4", "5")  # Ray takes the first ones listed
    assert own_devices(5) is None  # fewer listed than GPUs: each bundle is asked


@pytest.mark.heavy
def test_a_run_of_its_own_ray_knows_the_ids_every_bundle_would_report(monkeypatch):
    """The ids a run's own Ray is not asked for (:func:`own_devices`) are the ones its bundles report when asked."""
    import ray

    from rlix.core import ClusterSpec
    from rlix.exec.control.gpu_reservation import own_devices, release, reserve
    from rlix.ray_runtime import init_local_ray

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3,6")
    init_local_ray(num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = ClusterSpec(nodes=1, gpus_per_node=2)
        asked = reserve(spec)
        release(asked)
        known = reserve(spec, devices=own_devices(2))
        release(known)
        assert sorted(asked.devices[0]) == sorted(known.devices[0]) == ["3", "5"]
    finally:
        ray.shutdown()
