"""Faults at the worker-process boundary (injected by the job's ``fault`` knobs inside the worker).

One run holds three jobs: ``large``, whose worker on GPU 3 hangs in its first
wake (and which rolls out streaming, with partial rollout: a wake does the same
in either mode); ``refuse``, whose engines refuse every request; and ``small``, with no
fault. A fault the job survives loses no trajectory; a job that cannot go on
ends with a one-line reason; the jobs beside either finish. (A worker dying
mid-rollout is shown by ``tests/test_exec_ray.py``'s run of failing jobs.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlix.exec.config import load_config
from rlix.exec.records import JobStatus

pytestmark = pytest.mark.heavy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_two_jobs.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The example's ``small`` (2 steps); its ``large`` (3 steps, streaming) with a worker that hangs in wake; and
    ``refuse``, a copy of ``small`` with no home whose engines refuse every request."""
    from rlix.exec.front import api

    cfg = load_config(EXAMPLE)
    small = cfg.jobs[0].model_copy(update={"steps": 2})
    job = type(small)
    large = job.model_validate(
        {
            **cfg.jobs[1].model_dump(),
            "steps": 3,
            "prompts_per_step": 6,
            "fault": {"hang_wake_gpu": 3},
            "rollout_mode": "streaming",
            "partial_rollout": True,
            "limits": {"wake_timeout_s": 8.0},
        }
    )
    refuse = job.model_validate(
        {
            **small.model_dump(),
            "name": "refuse",
            "home": [],
            "seed": 2,
            "fault": {"refuse_requests": True},
            "limits": {"rollout_tries": 2},
        }
    )
    cfg = cfg.model_copy(update={"jobs": [small, large, refuse]})
    return cfg, api.run(cfg, out_dir=str(tmp_path_factory.mktemp("faults") / "out"))


def assert_complete(cfg, outputs, pid: str) -> None:
    job = next(j for j in cfg.jobs if j.name == pid)
    r = outputs.results[pid]
    assert r.status is JobStatus.FINISHED, (pid, r.error)
    assert r.lost == 0 and len(r.trajectories) == job.steps * job.batch_size
    assert len(r.steps) == job.steps


def test_worker_that_hangs_in_wake_is_killed_and_the_job_goes_on(run):
    cfg, out = run
    assert_complete(cfg, out, "large")
    assert out.results["large"].workers_lost >= 1
    assert_complete(cfg, out, "small")  # beside it, on the GPUs the killed worker gave back


def test_engine_refusing_every_request_fails_its_job_alone(run):
    cfg, out = run
    assert_complete(cfg, out, "small")
    assert_complete(cfg, out, "large")
    refused = out.results["refuse"]
    assert refused.status is JobStatus.FAILED
    assert "\n" not in refused.error
    assert "TrajectoryFailed" in refused.error and "failed 2 times" in refused.error, refused.error
    assert "EngineRefused" in refused.error, refused.error


def test_a_streaming_job_rolls_its_next_batch_out_beside_the_one_before(run):
    """``large`` has staleness 1 and streams: steps 0 and 1 are queued together once its model is loaded
    (in batch mode step 1 waits for step 0's rollout), and no trajectory used weights older than its
    step allows; the recorded trace says how it rolled out, so a replay streams too."""
    cfg, out = run
    large = out.results["large"]
    assert large.steps[1].started_s - large.steps[0].started_s < 0.1  # a rollout takes seconds here (paced decoding)
    assert all(t.weight_version >= t.step - 1 for t in large.trajectories)
    trace = json.loads(Path(out.files["trace"]).read_text())
    pipeline = next(p for p in trace["pipelines"] if p["id"] == "large")
    assert (pipeline["rollout_mode"], pipeline["partial_rollout"]) == ("streaming", True)
