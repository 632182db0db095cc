"""Co-tenants in the executor: two jobs mapped onto the same logical GPUs (examples/cpu_colocated.yaml).

One run per policy, two steps a job. Under ``static`` the second job waits for the first (the GPUs are one
partition); under ``rlix`` they run at once, and each learns exactly what it learns alone. The example is
narrowed to 2 GPUs at four times the decode pace: 6 model processes a run rather than 10 (each costs seconds of
imports on a CPU host), twice the example's rollout capacity (its runs wait less on the emulated devices), and the
same shape: both jobs on every GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import narrowed, roles

from rlix.exec.records import JobStatus

pytestmark = pytest.mark.heavy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_colocated.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from rlix.exec.front import api

    both = {"steps": 2, "roles": roles(0, 2)}
    cfg = narrowed(EXAMPLE, 2, {"first": both, "second": both}, pace=0.25)
    return {p: api.run(cfg.model_copy(update={"policy": p}), out_dir=str(tmp_path_factory.mktemp(p))) for p in ("rlix", "static")}


def test_cotenants_finish_and_lose_nothing(runs):
    for policy, outputs in runs.items():
        for pid, r in outputs.results.items():
            assert r.status is JobStatus.FINISHED and r.lost == 0, (policy, pid, r.error)


def test_cotenants_run_at_once_under_rlix_and_one_after_the_other_under_static(runs):
    def overlap(outputs) -> float:
        first, second = outputs.results["first"], outputs.results["second"]
        spans = [(s.started_s, s.finished_s) for s in first.steps], [(s.started_s, s.finished_s) for s in second.steps]
        return min(spans[0][-1][1], spans[1][-1][1]) - max(spans[0][0][0], spans[1][0][0])

    assert overlap(runs["static"]) <= 0  # the second job's steps begin after the first job's last
    assert overlap(runs["rlix"]) > 0


def test_each_cotenant_learns_what_it_learns_alone(runs):
    """Under ``static`` each job has the GPUs to itself; under ``rlix`` the other job's stages
    preempt its workers. Every token and every step's reward is the same."""
    for pid in ("first", "second"):
        shared, alone = runs["rlix"].results[pid], runs["static"].results[pid]
        assert sorted((t.traj_id, t.tokens) for t in shared.trajectories) == sorted(
            (t.traj_id, t.tokens) for t in alone.trajectories
        )
        assert [(s.mean_reward, s.mean_tokens) for s in shared.steps] == [(s.mean_reward, s.mean_tokens) for s in alone.steps]
