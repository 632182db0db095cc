"""The data-parallel trainer under Ray: a 2-GPU actor_train mapping trains on 2 ranks.

A :class:`TrainerGang` over 2 logical GPUs (2 processes, FSDP2 over gloo)
answers like a gang of 1 on the same batch (float64, so any real difference
stands far above rounding), each rank pinned to its own GPU; and the CPU
example's small job, its ``actor_train`` widened to 2 GPUs, finishes under
rlix-run, reporting ``trainer_ranks`` 2 in metrics.json.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_two_jobs.yaml"
TOL = 1e-9  # float64: measured differences are ~1e-15


@pytest.fixture(scope="module")
def ray_cpu():
    import ray

    from rlix.ray_runtime import worker_pythonpath

    ray.init(
        address="local",  # a new cluster, even where `ray start` runs one on this machine
        num_cpus=2,
        num_gpus=4,  # the example's cluster (a run reserves all of its GPUs in Ray)
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    yield
    ray.shutdown()


def _gang_run(gpus, model_dir):
    import ray
    from test_exec_fsdp import _perturbed, _samples

    from rlix.core import ClusterSpec
    from rlix.exec.messages import TrainerJob
    from rlix.exec.train.grpo import GrpoConfig
    from rlix.exec.train.trainer_gang import TrainerGang
    from rlix.protocol import GpuMap

    job = TrainerJob(model_path=str(model_dir), cfg=GrpoConfig(kl_coef=0.1, minibatches=3, seed=2), dtype="float64")
    gang = TrainerGang.start(ClusterSpec(nodes=1, gpus_per_node=2), gpus, GpuMap(), "test/trainer", job)
    try:
        ray.get(gang.started)
        ray.get(gang.reload.remote())
        samples = _samples()
        old = ray.get(gang.logprobs.remote(samples, False))
        samples = _perturbed(samples, old, 0.3)
        ref = ray.get(gang.logprobs.remote(samples, True))
        samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, ref)]
        stats = ray.get(gang.train.remote(samples))
        ray.get(gang.offload.remote())
        snap = ray.get(gang.snapshot.remote())
        return {"world": gang.world, "visible": ray.get(gang.visible_devices()), "old": old, "stats": stats, "snap": snap}
    finally:
        gang.kill()


def test_gang_of_two_trains_like_gang_of_one(ray_cpu, tmp_path):
    from rlix.exec.data.model import ModelSize, build_model

    model_dir = build_model(
        ModelSize(arch="qwen2", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), tmp_path / "m"
    )
    two = _gang_run((1, 0), model_dir)
    one = _gang_run((1,), model_dir)
    assert (two["world"], two["visible"], one["visible"]) == (2, ["0", "1"], ["1"])  # rank r on the r-th lowest GPU
    for r2, r1 in zip(two["old"], one["old"], strict=True):
        assert r2 == pytest.approx(r1, abs=TOL)
    s2, s1 = two["stats"], one["stats"]
    assert (s2.loss, s2.kl, s2.clip_fraction, s2.tokens) == pytest.approx(
        (s1.loss, s1.kl, s1.clip_fraction, s1.tokens), rel=TOL, abs=TOL
    )
    assert two["snap"].version == one["snap"].version == 1
    diff = max(float((two["snap"].tensors[k] - one["snap"].tensors[k]).abs().max()) for k in one["snap"].tensors)
    print(f"gang 2 vs 1: loss {s2.loss!r} vs {s1.loss!r}; max weight diff {diff:.2e}")
    assert diff < TOL


def test_two_gpu_actor_train_mapping_reports_two_ranks(tmp_path):
    from rlix.exec.config import load_config
    from rlix.exec.front import api
    from rlix.exec.records import JobStatus

    cfg = load_config(EXAMPLE)
    raw = cfg.jobs[0].model_dump()
    small = type(cfg.jobs[0]).model_validate(
        {**raw, "steps": 2, "roles": {**raw["roles"], "actor_train": {**raw["roles"]["actor_train"], "gpus": [0, 1]}}}
    )
    outputs = api.run(cfg.model_copy(update={"jobs": [small]}), out_dir=str(tmp_path / "out"))
    assert outputs.results["small"].status is JobStatus.FINISHED, outputs.results["small"].error
    jobs = json.loads(Path(outputs.files["metrics"]).read_text())["executor"]["jobs"]
    assert jobs["small"]["trainer_ranks"] == 2
