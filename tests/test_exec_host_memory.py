"""Co-tenants share a host's memory: a local run admits jobs only while their resident models fit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlix.exec.config import ConfigError, load_config
from rlix.exec.front.host_memory import HOST_QUEUE, parameters, resident_gb, with_host_memory
from rlix.exec.front.joblines import job_line
from rlix.exec.messages import LOAD_WAIT, JobProgress, JobStatus

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_colocated.yaml"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    pytest.importorskip("torch")
    cfg = load_config(EXAMPLE)
    root = tmp_path_factory.mktemp("models")
    return cfg, {j.name: str(j.model.directory(root)) for j in cfg.jobs}


def test_a_checkpoints_parameters_are_counted_from_its_weight_files(model_dirs):
    from transformers import AutoModelForCausalLM

    _, dirs = model_dirs
    for d in dirs.values():
        model = AutoModelForCausalLM.from_pretrained(d)
        assert parameters(d) == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)


def test_resident_memory_counts_the_trainers_offloaded_state_and_the_weight_cache(model_dirs):
    cfg, dirs = model_dirs
    job = cfg.jobs[0]
    n = parameters(dirs[job.name])
    assert resident_gb(job, dirs[job.name]) == pytest.approx(n * (4 + 8 + 2) / 1e9)  # fp32 weights, Adam, bf16 cache
    kl = job.model_copy(update={"algo": job.algo.model_copy(update={"kl_coef": 0.1})})
    assert resident_gb(kl, dirs[job.name]) == pytest.approx(n * (4 + 8 + 2 + 4) / 1e9)  # and the reference


def test_a_local_run_admits_cotenants_only_while_their_models_fit_in_host_memory(model_dirs):
    cfg, dirs = model_dirs
    need = {j.name: resident_gb(j, dirs[j.name]) for j in cfg.jobs}
    out = with_host_memory(cfg, dirs, free_gb=sum(need.values()) * 0.9)  # both fit alone, not together
    assert [j.resident_gb for j in out.jobs] == [need[j.name] for j in cfg.jobs]
    (queue,) = out.scheduler.queues
    assert queue.name == HOST_QUEUE and queue.max_resident_gb == sum(need.values()) * 0.9
    assert queue.gpus == [0, 1, 2, 3]


def test_a_job_that_can_never_fit_is_a_one_line_config_error_naming_the_bytes(model_dirs):
    cfg, dirs = model_dirs
    with pytest.raises(ConfigError) as err:
        with_host_memory(cfg, dirs, free_gb=1e-6)
    msg = str(err.value)
    assert msg.startswith("jobs[0] (first): its model keeps") and "GB of host memory resident" in msg and "\n" not in msg
    assert "this host has 0.00 GB available" in msg


def test_a_memory_limit_the_config_declares_is_kept(model_dirs):
    cfg, dirs = model_dirs
    own = cfg.scheduler.model_copy(update={"queues": [{"name": "mine", "gpus": [0, 1, 2, 3], "max_resident_gb": 5.0}]})
    mine = cfg.model_copy(update={"scheduler": type(cfg.scheduler).model_validate(own.model_dump())})
    out = with_host_memory(mine, dirs, free_gb=100.0)
    assert [q.name for q in out.scheduler.queues] == ["mine"]


def test_a_job_its_queue_holds_back_says_why_in_the_progress_table():
    cfg = load_config(EXAMPLE)
    prog = JobProgress(pipeline_id="second", status=JobStatus.RUNNING, step=0, steps=4, rewards=(), gpus_held=0, requeued=0)
    waiting = prog.__class__(**{**prog.__dict__, "phase": LOAD_WAIT, "phase_since_s": 1.0})
    reason = "queue 'host memory' has 0.4 GB of resident model memory free, the job needs 0.9 GB"
    p = SimpleNamespace(
        pipeline_id="second", job=cfg.jobs[1], coordinator=object(), result=None, progress=waiting, admission=reason
    )
    assert job_line(p, 5.0).state == f"queued: {reason}"
    p.admission = None
    assert job_line(p, 5.0).state == LOAD_WAIT
