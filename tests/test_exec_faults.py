"""Faults at the worker-process boundary (injected by the job's ``fault`` knobs inside the worker).

A fault the job survives loses no trajectory, and the job beside it finishes
(a worker dying mid-rollout is shown on the faulty job alone: a second job
would only make that run longer); a job that cannot go on ends with a
one-line reason, and the job beside it finishes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlix.exec.front.config import load_config
from rlix.exec.job.records import JobStatus

pytestmark = pytest.mark.heavy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_two_jobs.yaml"


def run_with(tmp_path, fault: dict, limits: dict | None = None, *, beside: bool = False):
    """The example's ``large`` job (3 steps) with ``fault``; ``beside``: the ``small`` job (2 steps) runs with it."""
    from rlix.exec.front import api

    cfg = load_config(EXAMPLE)
    small = cfg.jobs[0].model_copy(update={"steps": 2})
    raw = {**cfg.jobs[1].model_dump(), "steps": 3, "prompts_per_step": 6, "fault": fault, "limits": limits or {}}
    large = type(cfg.jobs[1]).model_validate(raw)
    cfg = cfg.model_copy(update={"jobs": [small, large] if beside else [large]})
    return cfg, api.run(cfg, out_dir=str(tmp_path / "out"))


def assert_complete(cfg, outputs, pid: str) -> None:
    job = next(j for j in cfg.jobs if j.name == pid)
    r = outputs.results[pid]
    assert r.status is JobStatus.FINISHED, (pid, r.error)
    assert r.lost == 0 and len(r.trajectories) == job.steps * job.batch_size
    assert len(r.steps) == job.steps


def test_rollout_worker_killed_mid_rollout_is_continued_elsewhere(tmp_path):
    cfg, out = run_with(tmp_path, {"die_in_rollout_gpu": 2})
    assert_complete(cfg, out, "large")
    large = out.results["large"]
    assert large.workers_lost >= 1
    assert large.requeued >= 1  # its in-flight trajectories went back to the queue
    assert out.metrics.trajectories_lost == 0


def test_worker_that_hangs_in_wake_is_killed_and_the_job_goes_on(tmp_path):
    cfg, out = run_with(tmp_path, {"hang_wake_gpu": 3}, {"wake_timeout_s": 8.0}, beside=True)
    assert_complete(cfg, out, "small")  # beside it, on the GPUs the killed worker gave back
    assert_complete(cfg, out, "large")
    assert out.results["large"].workers_lost >= 1


def test_engine_refusing_every_request_fails_its_job_alone(tmp_path):
    cfg, out = run_with(tmp_path, {"refuse_requests": True}, {"rollout_tries": 2}, beside=True)
    assert_complete(cfg, out, "small")
    large = out.results["large"]
    assert large.status is JobStatus.FAILED
    assert "\n" not in large.error
    assert "TrajectoryFailed" in large.error and "failed 2 times" in large.error and "EngineRefused" in large.error, large.error
