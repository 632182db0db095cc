"""A job from the user's JSONL and TRL-style reward file under rlix-run (Ray, CPU), beside other jobs.

One run: the example's ``arith`` (data) and ``copy`` (task) jobs, plus a job whose reward function raises
when called; then a rerun of ``arith`` with more steps resumes from its checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import narrowed, roles

from rlix.exec.records import JobStatus

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu_data.yaml"


# The example on 3 GPUs at twice its decode pace (each job's home one GPU, the third for ``broken``):
# 12 model processes rather than 15, each seconds of imports on a CPU host.
THREE_GPUS = {
    "arith": {"home": [0], "roles": roles(0, 3)},
    "copy": {"home": [1], "roles": roles(1, 3)},
}


def _config(out: Path, ck: Path, *, arith_steps: int, with_others: bool, done: Path | None = None):
    """``done``: a checkpoint directory holding all 8 steps of a copy of ``arith`` (named ``done``)."""
    cfg = narrowed(EXAMPLE, 3, THREE_GPUS, pace=0.5)
    arith = cfg.jobs[0].model_copy(update={"steps": arith_steps, "checkpoint_dir": str(ck)})
    jobs = [arith]
    if done is not None:
        jobs.append(arith.model_copy(update={"name": "done", "steps": 8, "checkpoint_dir": str(done), "home": []}))
    if with_others:
        copy = cfg.jobs[1].model_copy(update={"steps": 4})
        bad = type(arith).model_validate(
            {
                **arith.model_dump(),
                "name": "broken",
                "rewards": [{"function": f"{ROOT}/tests/data/fails_at_run.py:flaky", "weight": 1.0}],
                "checkpoint_dir": None,
                "eval": None,
                "steps": 2,
                "roles": roles(2, 3),
                "home": [],
            }
        )
        jobs += [copy, bad]
    return cfg.model_copy(update={"jobs": jobs, "output": cfg.output.model_copy(update={"dir": str(out), "console": False})})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from rlix.exec.front import api

    d = tmp_path_factory.mktemp("data")
    first = api.run(_config(d / "out", d / "ck", arith_steps=8, with_others=True))
    shutil.copytree(d / "ck", d / "done")
    resumed = api.run(_config(d / "out", d / "ck", arith_steps=10, with_others=False, done=d / "done"))
    return d, first, resumed


def test_user_job_trains_beside_others_with_reward_rising(run):
    _, first, _ = run
    arith = first.results["arith"]
    assert arith.status is JobStatus.FINISHED, arith.error
    assert first.results["copy"].status is JobStatus.FINISHED, first.results["copy"].error
    rewards = [s.mean_reward for s in arith.steps]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.04, [round(r, 3) for r in rewards]
    assert first.results["arith"].lost == 0 and first.results["copy"].lost == 0


def test_raising_reward_fails_only_its_job_with_one_line(run):
    d, first, _ = run
    broken = first.results["broken"]
    assert broken.status is JobStatus.FAILED
    assert "RewardError" in broken.error and "fails_at_run.py:flaky" in broken.error and "KeyError" in broken.error
    assert "\n" not in broken.error
    kept = d / "out" / "broken" / "reward_error.txt"
    assert broken.error.endswith(f"fails_at_run.py:8; traceback in {kept}"), broken.error
    assert "Traceback (most recent call last):" in kept.read_text()
    printed = (d / "out" / "broken" / "rewards.log").read_text().splitlines()  # the dry run's went to stderr
    assert printed and all(line.startswith("flaky: ") for line in printed), printed
    assert broken.bad_input and not first.results["copy"].bad_input
    assert len(first.results["copy"].steps) == 4


def test_metrics_file_per_step_with_eval_and_data_report(run):
    d, _, _ = run
    lines = [json.loads(x) for x in (d / "out" / "arith" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 11))  # 8 steps, then 2 more after the resume
    earlier = [json.loads(x) for x in (d / "out" / "arith" / "previous-1" / "metrics.jsonl").read_text().splitlines()]
    assert (d / "out" / "arith" / "rewards.log").is_file() and (d / "out" / "arith" / "previous-1" / "rewards.log").is_file()
    assert lines[:8] == earlier  # the first run's log, kept aside; the rerun's starts with the steps its checkpoint holds
    for key in (
        "reward_mean",
        "reward/arith_rewards.exact_match/mean",
        "reward/arith_rewards.format_ok/std",
        "reward/arith_rewards.subtraction_sign/none",
        "loss",
        "kl",
        "response_len_mean",
        "response_len_max",
        "step_s",
        "gpu_s_held",
        "staleness",
    ):
        assert key in lines[0], key
    assert all(x["gpu_s_held"] > 0 and x["staleness"] == 0 for x in lines)
    # eval_every 4 from step 1, and each run's last step (8, then 10)
    assert [x["step"] for x in lines if "eval/reward_mean" in x] == [1, 5, 8, 9, 10]
    assert json.loads((d / "out" / "arith" / "data.json").read_text())["train"]["prompts"] == 200
    assert (d / "out" / "copy" / "metrics.jsonl").is_file()


def test_rerun_resumes_from_the_last_checkpoint(run):
    d, _, resumed = run
    r = resumed.results["arith"]
    assert r.status is JobStatus.FINISHED, r.error
    assert [s.step for s in r.steps] == [8, 9]
    assert sorted(p.name for p in (d / "ck").iterdir()) == ["step_000008", "step_000010"]


def test_a_job_whose_checkpoint_holds_all_its_steps_starts_nothing_beside_one_that_trains(run):
    """Before: its trainer started, claimed its GPU for a model load and found nothing to train."""
    _, _, resumed = run
    done = resumed.results["done"]
    assert done.status is JobStatus.FINISHED and done.error == ""
    assert (done.steps, done.steps_before, done.trainer_ranks, done.switches) == ((), 8, 0, ())
    assert resumed.metrics.pipelines.keys() == {"arith"}  # the run's figures are of the job it ran
    timeline = json.loads(Path(resumed.files["timeline"]).read_text())["traceEvents"]
    assert not [e for e in timeline if "done" in str(e.get("name", ""))]  # no GPU held, not even for a model load
    line = next(x for x in resumed.lines if x.name == "done")
    assert line.summary().startswith("done: finished steps=8/8 (resumed at step 8)")
