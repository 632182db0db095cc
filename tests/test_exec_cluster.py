"""``rlix-run --address``: joining a Ray cluster that is already running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def tiny_config(tmp_path: Path, gpus: int) -> Path:
    """One tiny full-finetune job, two steps, on ``gpus`` logical GPUs of one node."""
    cfg = {
        "cluster": {"nodes": 1, "gpus_per_node": gpus},
        "scheduler": {"min_residency_s": 5.0, "report_ttl_s": 10.0},
        "output": {"dir": str(tmp_path / "out"), "console": False},
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
                "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": f"0-{gpus - 1}"}},
            }
        ],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rlix_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlix.exec.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=400, env=env)


def test_unreachable_address_is_one_line_exit_2(tmp_path):
    res = rlix_run(str(tiny_config(tmp_path, 4)), "--address", f"127.0.0.1:{free_port()}")
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("rlix-run: cluster error: --address 127.0.0.1:") and "no Ray cluster answers there" in last
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.heavy
def test_joins_an_existing_cluster_and_refuses_one_too_small(tmp_path):
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    start = [ray_cli, "start", "--head", f"--port={port}", "--num-gpus=4", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(start, check=True, capture_output=True, env=env, timeout=120)
    try:
        res = rlix_run(str(tiny_config(tmp_path, 4)), "--address", f"127.0.0.1:{port}", "--no-console", env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "solo: finished steps=2" in res.stdout and "trajectories_lost=0" in res.stdout
        for name in ("timeline.json", "trace.json", "metrics.json"):
            assert (tmp_path / "out" / name).is_file()

        big = tmp_path / "big"
        big.mkdir()
        res = rlix_run(str(tiny_config(big, 8)), "--address", f"127.0.0.1:{port}", env=env)
        assert res.returncode == 2
        assert "the Ray cluster has 4 GPUs but cluster in the config needs 8" in res.stderr.strip().splitlines()[-1]
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, env=env, timeout=120)
