"""A rerun: which jobs resume from which step (said before any actor starts), and job logs that never mix runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlix.exec.config import load_config
from rlix.exec.front.rerun import prepare_rerun, resume_steps, set_aside
from rlix.exec.job.steplog import StepLog, read_lines

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_mixed.yaml"


def _config(tmp_path: Path):
    """The mixed example (a full finetune ``full``, a multi-LoRA ``lora``), both with checkpoints under tmp_path."""
    cfg = load_config(EXAMPLE)
    jobs = [j.model_copy(update={"checkpoint_dir": str(tmp_path / "ck" / j.name)}) for j in cfg.jobs]
    return cfg.model_copy(update={"jobs": jobs})


def _full_checkpoint(directory: Path, step: int) -> None:
    """A full-finetune checkpoint as checkpoint.save lays it out (only what the lookup reads)."""
    (directory / f"step_{step:06d}").mkdir(parents=True)
    (directory / f"step_{step:06d}" / "trainer_state.pt").write_bytes(b"")


def _write_lines(directory: Path, lines: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _steps(path: Path) -> list[tuple[str, int]]:
    return [(x.get("adapter", ""), x["step"]) for x in read_lines(path)]


def test_resume_steps_read_the_newest_full_checkpoint_and_each_adapters_own(tmp_path):
    from rlix.exec.train.lora import write_checkpoint

    full, lora = _config(tmp_path).jobs
    assert resume_steps(full) == {} and resume_steps(lora) == {}  # no checkpoint yet: both start afresh
    _full_checkpoint(tmp_path / "ck" / "full", 2)
    _full_checkpoint(tmp_path / "ck" / "full", 4)
    (tmp_path / "ck" / "full" / "step_000006").mkdir()  # no trainer_state.pt: not a checkpoint
    write_checkpoint({"version": 3, "tensors": {}, "opt": {}}, "copy", tmp_path / "ck" / "lora")
    assert resume_steps(full) == {"": 4}
    assert resume_steps(lora) == {"copy": 3}  # rev has none: it starts from the beginning
    assert resume_steps(full.model_copy(update={"checkpoint_dir": None})) == {}


def test_prepare_rerun_says_which_jobs_resume_and_from_which_step(tmp_path, capsys):
    from rlix.exec.train.lora import write_checkpoint

    cfg = _config(tmp_path)
    assert prepare_rerun(cfg, tmp_path / "out") == {"full": {}, "lora": {}}
    assert capsys.readouterr().err == ""  # nothing resumes: nothing said
    _full_checkpoint(tmp_path / "ck" / "full", 4)
    write_checkpoint({"version": 8, "tensors": {}, "opt": {}}, "rev", tmp_path / "ck" / "lora")
    assert prepare_rerun(cfg, tmp_path / "out") == {"full": {"": 4}, "lora": {"rev": 8}}
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"rlix-run: job full resumes from its checkpoint at step 4 of 6 ({tmp_path / 'ck' / 'full' / 'step_000004'})",
        f"rlix-run: job lora resumes from its checkpoints: copy from the start, rev at step 8 of 8 ({tmp_path / 'ck' / 'lora'})",
    ]


def test_a_run_into_an_earlier_runs_directory_keeps_the_earlier_outputs(tmp_path):
    cfg, out = _config(tmp_path), tmp_path / "out"
    prepare_rerun(cfg, out)  # a first run into a new directory: nothing to keep
    assert not out.exists() or not any(out.iterdir())
    out.mkdir(exist_ok=True)
    for name, text in (("metrics.json", '{"partial": false}'), ("timeline.json", "{}"), ("rlix-run.log", "a line\n")):
        (out / name).write_text(text)
    (out / "full").mkdir()
    prepare_rerun(cfg, out)  # a second run (the same config again, or another into the same directory)
    assert (out / "previous-1" / "metrics.json").read_text() == '{"partial": false}'
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == []  # the new run writes fresh ones
    (out / "metrics.json").write_text("{}")
    prepare_rerun(cfg, out)
    assert (out / "previous-2" / "metrics.json").read_text() == "{}" and (out / "previous-1" / "rlix-run.log").exists()


def test_a_run_sets_aside_only_what_a_run_wrote_and_a_job_named_dots_is_refused(tmp_path):
    """Before: every file in the output folder moved to previous-<n>/, the config and the reward file
    the run was about to read among them; a job named '..' moved the files of the folder above."""
    from helpers import assert_config_error_names

    cfg, out = _config(tmp_path), tmp_path / "out"
    out.mkdir()
    mine = {"cfg.yaml": "jobs: []\n", "rewards.py": "def reward(x): return 1.0\n", "notes.txt": "mine"}
    for name, text in {**mine, "metrics.json": "{}", "timeline.png": "png"}.items():
        (out / name).write_text(text)
    (out / "full").mkdir()
    (out / "full" / "keep.jsonl").write_text("a user's file\n")
    (out / "full" / "data.json").write_text("{}")
    prepare_rerun(cfg, out)
    assert sorted(p.name for p in (out / "previous-1").iterdir()) == ["metrics.json", "timeline.png"]
    assert {n: (out / n).read_text() for n in mine} == mine
    assert (out / "full" / "keep.jsonl").exists() and (out / "full" / "previous-1" / "data.json").exists()
    raw = cfg.model_dump(mode="json", exclude_none=True)
    for dots in (".", ".."):
        raw["jobs"][0]["name"] = dots
        assert_config_error_names(raw, f"jobs[0].name: '{dots}' names no folder of its own")


def test_a_job_that_starts_afresh_moves_its_old_logs_aside_and_keeps_them(tmp_path):
    job = tmp_path / "out" / "small"
    _write_lines(job, [{"step": s, "reward_mean": 0.1} for s in (1, 2, 3)])
    (job / "events.out.tfevents.1.host").write_bytes(b"old events")
    (job / "rewards.log").write_text("printed\n")
    (job / "rewards-fr.log").write_text("an adapter's\n")
    (job / "ck").mkdir()  # a directory (a checkpoint kept there) stays put
    assert set_aside(job, {}) == job / "previous-1"
    assert sorted(p.name for p in job.iterdir()) == ["ck", "previous-1"]  # fresh: no metrics.jsonl, no events, no logs
    assert (job / "previous-1" / "rewards.log").read_text() == "printed\n"
    assert (job / "previous-1" / "rewards-fr.log").is_file()
    assert _steps(job / "previous-1" / "metrics.jsonl") == [("", 1), ("", 2), ("", 3)]
    assert (job / "previous-1" / "events.out.tfevents.1.host").read_bytes() == b"old events"
    _write_lines(job, [{"step": 1}])
    assert set_aside(job, {}) == job / "previous-2"  # every earlier run kept, numbered in order
    assert (job / "previous-1" / "metrics.jsonl").is_file() and (job / "previous-2" / "metrics.jsonl").is_file()
    assert set_aside(job, {}) is None and set_aside(tmp_path / "never", {}) is None  # nothing there: nothing moved


def test_a_resuming_job_keeps_only_the_lines_its_checkpoint_holds(tmp_path):
    job = tmp_path / "out" / "lora"
    old = [{"adapter": a, "step": s} for s in range(1, 7) for a in ("copy", "rev")]
    _write_lines(job, old)
    with (job / "metrics.jsonl").open("a") as f:
        f.write('{"adapter": "copy", "st')  # a line cut short by a crash
    set_aside(job, {"copy": 4})  # copy's checkpoint holds 4 steps; rev has none and starts again
    assert _steps(job / "metrics.jsonl") == [("copy", s) for s in range(1, 5)]
    assert _steps(job / "previous-1" / "metrics.jsonl") == [(x["adapter"], x["step"]) for x in old]


def test_a_run_through_the_scheduler_writes_under_its_id_and_resumes_from_its_newest_earlier_run(tmp_path):
    import os

    cfg = _config(tmp_path)
    runs = tmp_path / "out"
    _write_lines(runs / "full", [{"step": 1}])  # a private run's, oldest
    _write_lines(runs / "full#3" / "full", [{"step": s} for s in (1, 2, 3)])
    _write_lines(runs / "full#5" / "full", [{"step": s} for s in (1, 2, 3, 4, 5)])  # the newest
    os.utime(runs / "full" / "metrics.jsonl", ns=(1, 1))
    os.utime(runs / "full#3" / "full" / "metrics.jsonl", ns=(2, 2))
    _full_checkpoint(tmp_path / "ck" / "full", 4)
    here = runs / "full#7"
    assert prepare_rerun(cfg, here, runs)["full"] == {"": 4}
    assert _steps(here / "full" / "metrics.jsonl") == [("", s) for s in (1, 2, 3, 4)]  # from full#5, up to 4
    assert _steps(runs / "full#5" / "full" / "metrics.jsonl") == [("", s) for s in range(1, 6)]  # left as it was
    assert not (here / "previous-1").exists() and not (here / "lora").exists()  # a fresh directory: nothing set aside
    os.utime(runs / "full" / "metrics.jsonl")  # the private run is now the newest
    again = runs / "full#9"
    prepare_rerun(cfg, again, runs)
    assert _steps(again / "full" / "metrics.jsonl") == [("", 1)]


def test_resumed_step_log_continues_after_its_checkpoint_without_interleaving(tmp_path):
    from rlix.exec.data.recipe import ScoredStep
    from rlix.exec.train.grpo import TrainStats

    job = tmp_path / "out" / "small"
    scored = ScoredStep(samples=(), rewards=(0.5,), functions=())
    stats = TrainStats(loss=0.1, kl=0.0, clip_fraction=0.0, tokens=1, seconds=1.0)

    def run(steps: range) -> None:
        log = StepLog(job)
        for s in steps:
            log.write(stream="", t=float(s), step=s, scored=scored, train=stats, tokens=[1], step_s=1.0, staleness=0)
        log.close()

    run(range(1, 4))  # steps 1-3, then a crash: the checkpoint holds 2
    set_aside(job, {"": 2})
    run(range(3, 6))  # the rerun trains 3, 4, 5
    assert _steps(job / "metrics.jsonl") == [("", s) for s in range(1, 6)]
    assert _steps(job / "previous-1" / "metrics.jsonl") == [("", s) for s in (1, 2, 3)]
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list(job.glob("events.out.tfevents.*"))) == 1  # one event file: the carried steps, then the new ones
    acc = EventAccumulator(str(job))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2, 3, 4, 5]


def test_step_n_is_the_nth_trained_step_in_metrics_and_progress(tmp_path):
    from rlix.exec.data.recipe import ScoredStep
    from rlix.exec.recorder import Recorder
    from rlix.exec.records import JobStatus, StepRecord, TrajRecord
    from rlix.exec.train.grpo import TrainStats

    rec, log = Recorder("small"), StepLog(tmp_path / "small")
    scored = ScoredStep(samples=(), rewards=(0.5,), functions=())
    stats = TrainStats(loss=0.1, kl=0.0, clip_fraction=0.0, tokens=1, seconds=1.0)
    for k in (4, 5):  # the machine's steps 4 and 5 of a job resumed after 4 trained steps
        record = StepRecord(
            step=k, started_s=k, finished_s=k + 1.0, mean_reward=0.5, mean_tokens=1.0, stages=(), min_weight_version=k
        )
        rec.step(record)
        log.write_step(record, [TrajRecord(traj_id=k, step=k, gen_s=1.0, segments=1, tokens=1, weight_version=k)], scored, stats)
    log.close()
    assert _steps(tmp_path / "small" / "metrics.jsonl") == [("", 5), ("", 6)]
    assert [x["staleness"] for x in read_lines(tmp_path / "small" / "metrics.jsonl")] == [0, 0]
    progress = rec.progress(JobStatus.RUNNING, steps=8, gpus_held=0, before=4)
    assert (progress.step, progress.steps) == (6, 8)  # the console's row: the last step's number, as in metrics.jsonl


def test_a_step_line_reports_how_well_the_predicted_lengths_ranked_its_responses(tmp_path):
    from rlix.exec.data.recipe import ScoredStep
    from rlix.exec.records import StepRecord, TrajRecord
    from rlix.exec.train.grpo import TrainStats

    log = StepLog(tmp_path / "small")
    scored = ScoredStep(samples=(), rewards=(0.5,), functions=())
    stats = TrainStats(loss=0.1, kl=0.0, clip_fraction=0.0, tokens=1, seconds=1.0)
    lines = []
    for k, predicted in enumerate(([1.0, 2.0, 3.0, None], [3.0, 2.0, 1.0, None], [None] * 4)):
        record = StepRecord(
            step=k, started_s=k, finished_s=k + 1.0, mean_reward=0.5, mean_tokens=1.0, stages=(), min_weight_version=k
        )
        trained = [
            TrajRecord(traj_id=10 * k + i, step=k, gen_s=1.0, segments=1, tokens=t, weight_version=k, predicted=p)
            for i, (t, p) in enumerate(zip((5, 9, 30, 2), predicted))
        ]
        lines.append(log.write_step(record, trained, scored, stats))
    log.close()
    # Ranked right, then backwards (the one with no prediction left out each time), then no prediction at all.
    assert [x["length_rank_correlation"] for x in read_lines(tmp_path / "small" / "metrics.jsonl")] == [1.0, -1.0, None]


def test_a_rerun_with_nothing_left_to_train_starts_nothing_and_reports_every_job_finished(tmp_path, capsys):
    """Before: every job's trainer started (a gang claim of its GPUs, a model load) only to find its
    checkpoints at the last step; the run started Ray and a scheduler for none of it."""
    import ray

    from rlix.exec.front import api
    from rlix.exec.train.lora import write_checkpoint

    cfg = _config(tmp_path)
    late = cfg.jobs[1].model_copy(update={"arrival_s": 600.0})  # nothing to train: it need not wait for its arrival
    out = cfg.output.model_copy(update={"dir": str(tmp_path / "out"), "console": False})
    cfg = cfg.model_copy(update={"output": out, "jobs": [cfg.jobs[0], late]})
    _full_checkpoint(tmp_path / "ck" / "full", 6)
    for adapter in ("copy", "rev"):
        write_checkpoint({"version": 8, "tensors": {}, "opt": {}}, adapter, tmp_path / "ck" / "lora")
    _write_lines(tmp_path / "out" / "full", [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 7)])
    ray_up = []
    outputs = api.run(cfg, on_progress=lambda session: ray_up.append(ray.is_initialized()))
    assert ray_up and not any(ray_up)  # no Ray started for the run
    err = capsys.readouterr().err
    assert "job full resumes from its checkpoint at step 6 of 6: nothing left to train" in err
    assert "rev at step 8 of 8: nothing left to train" in err
    assert "rlix-run: every job's checkpoints hold all its steps: nothing to train" in err
    assert [line.summary().split(" reward")[0] for line in outputs.lines] == [
        "full: finished steps=6/6 (resumed at step 6)",
        "lora: finished steps=16/16 (resumed at step 16)",
    ]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())["executor"]
    assert metrics["partial"] is False and metrics["unfinished_jobs"] == []
    jobs = {pid: (job["steps"], job["steps_before"], job["trainer_ranks"]) for pid, job in metrics["jobs"].items()}
    assert jobs == {"full": (0, 6, 0), "lora": (0, 16, 0)}  # nothing trained, no trainer started
    assert outputs.metrics.pipelines == {} and outputs.metrics.tasks_per_hour == 0.0  # the run ran no job
    assert max(r.finish_s for r in outputs.results.values()) < 60
    assert _steps(tmp_path / "out" / "full" / "metrics.jsonl") == [("", s) for s in range(1, 7)]  # carried


def test_nothing_left_counts_every_stream_of_a_job(tmp_path):
    from rlix.exec.front.rerun import nothing_left

    full, lora = _config(tmp_path).jobs
    assert not nothing_left(full, {}) and not nothing_left(full, {"": 5}) and nothing_left(full, {"": 6})
    assert nothing_left(full, {"": 9})  # a checkpoint past the steps asked: nothing left either
    assert not nothing_left(lora, {"rev": 8}) and not nothing_left(lora, {"copy": 8, "rev": 7})
    assert nothing_left(lora, {"copy": 8, "rev": 8})
