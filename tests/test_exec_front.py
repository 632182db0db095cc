"""The front end a user meets: paths made absolute, readable actor errors, the live view's rows
against the summary lines, and Ctrl-C. In-process (Ray only for its error classes)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlix.exec.config import absolute_paths, parse_config
from rlix.exec.error_text import describe, one_line, plain
from rlix.exec.front.console import rows
from rlix.exec.front.joblines import job_line
from rlix.exec.messages import JobProgress, JobResult
from rlix.exec.records import JobStatus, StepRecord

ROOT = Path(__file__).resolve().parent.parent


def _config(tmp_path: Path, **job) -> dict:
    return {
        "output": {"dir": "runs/x"},
        "jobs": [
            {
                "name": "a",
                "model": {"size": {}},
                "task": {"name": "copy"},
                "steps": 3,
                "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
                **job,
            }
        ],
    }


# ------------------------------------------------------------------ paths


def test_every_relative_path_is_made_absolute_against_the_working_directory(tmp_path):
    ckpt = tmp_path / "ckpt"
    cfg = parse_config(_config(tmp_path, checkpoint_dir="runs/x/a/checkpoints"))
    out = absolute_paths(cfg, tmp_path)
    assert out.output.dir == str(tmp_path / "runs" / "x")
    assert out.jobs[0].checkpoint_dir == str(tmp_path / "runs" / "x" / "a" / "checkpoints")
    again = absolute_paths(out, "/elsewhere")  # absolute paths stay as they are
    assert again.output.dir == out.output.dir and again.jobs[0].checkpoint_dir == out.jobs[0].checkpoint_dir
    assert absolute_paths(parse_config(_config(tmp_path, checkpoint_dir=str(ckpt))), "/x").jobs[0].checkpoint_dir == str(ckpt)


def test_data_and_model_paths_are_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").write_text("")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1"}\n')
    (tmp_path / "r.py").write_text("def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    raw = _config(tmp_path, data={"path": "d.jsonl"}, eval={"path": "d.jsonl"}, rewards=[{"function": "r.py:one"}])
    raw["jobs"][0].pop("task")
    raw["jobs"][0]["model"] = {"path": "m"}
    out = absolute_paths(parse_config(raw), tmp_path)
    job = out.jobs[0]
    assert (job.model.path, job.data.path, job.eval.path) == (
        str(tmp_path / "m"),
        str(tmp_path / "d.jsonl"),
        str(tmp_path / "d.jsonl"),
    )


# ------------------------------------------------------------------ errors


def _ray_task_error(cause: BaseException, text: str):
    from ray.exceptions import RayTaskError

    err = RayTaskError("TrainerActor.start", text, cause, proctitle="ray::TrainerActor", pid=1, ip="10.0.0.1")
    return err.as_instanceof_cause()


def test_an_actor_error_reads_as_what_was_raised_with_no_colour_codes(tmp_path):
    cause = OSError("Can't load tokenizer for 'runs/_models/m': tokenizer.json not found")
    text = '\x1b[36mray::TrainerActor.start()\x1b[39m\nTraceback (most recent call last):\n  File "x.py", line 3\nOSError: ...'
    exc = _ray_task_error(cause, text)
    assert one_line(exc) == "OSError: Can't load tokenizer for 'runs/_models/m': tokenizer.json not found"
    line = describe(exc, tmp_path / "job")
    kept = tmp_path / "job" / "error.txt"
    assert line.endswith(f"(traceback: {kept})") and "\x1b" not in line
    saved = kept.read_text()
    assert 'File "x.py", line 3' in saved and "\x1b" not in saved  # the remote traceback, where the error was raised


def test_an_actor_that_died_in_its_constructor_reads_as_the_error_it_quotes():
    from ray.exceptions import ActorDiedError, RayTaskError

    message = "model directory /data/m cannot be read on node n2; put it on storage every node reads"
    remote = 'Traceback (most recent call last):\n  File "rlix/exec/rollout/actor.py", line 60, in __init__\n'
    init = RayTaskError(
        "RolloutWorkerActor.__init__", remote + f"FileNotFoundError: {message}", FileNotFoundError(message), pid=1, ip="n2"
    )
    exc = ActorDiedError(init)
    assert "\x1b" in str(exc) or "creation task" in str(exc)  # Ray's text, as a user saw it
    assert one_line(exc) == f"FileNotFoundError: {message}"


def test_plain_strips_colour_codes():
    assert plain("\x1b[31mred\x1b[0m text") == "red text"


# ------------------------------------------------------------------ the live view and the summary


class _Job:
    def __init__(self, steps=6, adapters=None, arrival_s=0.0):
        self.steps, self.arrival_s = steps, arrival_s
        self.kind = "multi_lora" if adapters else "full_finetune"
        self.adapters = adapters


class _Pipe:
    def __init__(self, pid, job, progress=None, result=None, admitted=True):
        self.pipeline_id, self.job, self.progress, self.result = pid, job, progress, result
        self.coordinator = object() if admitted else None
        self.admission = None  # no queue holds it back


class _Session:
    def __init__(self, pipelines, now):
        self.pipelines = {p.pipeline_id: p for p in pipelines}
        self._now = now

    def now(self):
        return self._now


def _step(step, reward, stream=""):
    return StepRecord(
        stream=stream,
        step=step,
        started_s=step,
        finished_s=step + 1,
        mean_reward=reward,
        mean_tokens=4,
        stages=(),
        min_weight_version=0,
    )


def _progress(pid, steps_done, total, phase="", since=0.0):
    from rlix.exec.records import reward_spans

    return JobProgress(
        pipeline_id=pid,
        status=JobStatus.RUNNING,
        step=len(steps_done),
        steps=total,
        rewards=reward_spans(steps_done),
        gpus_held=2,
        requeued=1,
        phase=phase,
        phase_since_s=since,
    )


def test_the_last_row_of_a_job_is_its_summary_line_not_the_poll_before_it():
    rewards = [0.256, 0.3, 0.31, 0.33, 0.281, 0.389]
    steps = [_step(i, r) for i, r in enumerate(rewards)]
    lagging = _progress("small", steps[:5], 6)  # the last poll saw five steps
    result = JobResult(pipeline_id="small", status=JobStatus.FINISHED, steps=tuple(steps), steps_planned=6, finish_s=63.0)
    session = _Session([_Pipe("small", _Job(), progress=lagging, result=result)], now=63.0)
    (row,) = rows(session)
    line = job_line(session.pipelines["small"], 63.0)
    assert row[:4] == ("small", "finished", "6/6", "0.256 -> 0.389")
    assert line.summary() == "small: finished steps=6/6 reward 0.256 -> 0.389 jct_s=63.0"
    crashed = dataclasses.replace(result, workers_lost=2)  # each replaced, so the job finished: the line says it
    line = job_line(_Pipe("small", _Job(), progress=lagging, result=crashed), 63.0)
    assert line.summary() == "small: finished steps=6/6 reward 0.256 -> 0.389 jct_s=63.0 workers_lost=2"


def test_multi_lora_rewards_are_each_adapters_own():
    steps = [_step(0, 0.257, "copy"), _step(0, 0.168, "rev"), _step(1, 0.156, "copy"), _step(1, 0.180, "rev")]
    result = JobResult(pipeline_id="lora", status=JobStatus.FINISHED, steps=tuple(steps), steps_planned=4)
    adapters = [SimpleNamespace(name="copy", steps=2), SimpleNamespace(name="rev", steps=2)]
    line = job_line(_Pipe("lora", _Job(steps=2, adapters=adapters), result=result), 10.0)
    assert line.reward_text() == "copy 0.257 -> 0.156, rev 0.168 -> 0.180"


def test_a_loading_job_row_moves_and_says_what_it_waits_for():
    job = _Job()
    pipes = [
        _Pipe("a", job, progress=_progress("a", [], 6, phase="loading model", since=2.0)),
        _Pipe("b", job, progress=_progress("b", [], 6, phase="waiting for GPUs (actor_train)", since=9.0)),
        _Pipe("c", _Job(arrival_s=40.0), admitted=False),
        _Pipe("d", job),
    ]
    first = {r[0]: r[1] for r in rows(_Session(pipes, now=12.0))}
    later = {r[0]: r[1] for r in rows(_Session(pipes, now=30.0))}
    assert first == {"a": "loading model 10s", "b": "waiting for GPUs (actor_train) 3s", "c": "queued until 40s", "d": "starting"}
    assert later["a"] == "loading model 28s"


# ------------------------------------------------------------------ Ctrl-C


def test_first_sigint_asks_to_stop_and_a_second_exits_at_once():
    script = textwrap.dedent(
        """\
        import os, signal, sys, time
        from rlix.exec.front.cli import Interrupts
        with Interrupts() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("requested", stop.requested(), flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        print("not reached")
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT, env=os.environ)
    assert res.returncode == 130
    assert res.stdout.strip() == "requested True"
    assert "Traceback" not in res.stderr and "exit at once" in res.stderr


@pytest.mark.parametrize("status", [JobStatus.CANCELLED])
def test_a_cancelled_job_keeps_what_it_did(status):
    steps = (_step(0, 0.1), _step(1, 0.2))
    result = JobResult(pipeline_id="a", status=status, steps=steps, steps_planned=6, finish_s=30.0)
    assert (
        job_line(_Pipe("a", _Job(), result=result), 31.0).summary() == "a: cancelled steps=2/6 reward 0.100 -> 0.200 jct_s=30.0"
    )


def test_a_resumed_job_counts_on_from_its_checkpoint():
    steps = (_step(8, 0.5), _step(9, 0.6))
    result = JobResult(pipeline_id="a", status=JobStatus.FINISHED, steps=steps, steps_before=8, steps_planned=10, finish_s=9.0)
    pipe = _Pipe("a", _Job(steps=10), progress=_progress("a", [], 0), result=result)
    (row,) = rows(_Session([pipe], now=9.0))
    assert row[2] == "10/10"
    assert job_line(pipe, 9.0).summary() == "a: finished steps=10/10 (resumed at step 8) reward 0.500 -> 0.600 jct_s=9.0"


def test_a_job_whose_model_is_loading_shows_its_configured_steps():
    adapters = [SimpleNamespace(name="copy", steps=4), SimpleNamespace(name="rev", steps=6)]
    pipe = _Pipe("lora", _Job(adapters=adapters), progress=_progress("lora", [], 0, phase="loading model", since=0.0))
    assert rows(_Session([pipe], now=5.0))[0][2] == "0/10"


def test_a_process_that_died_is_named_in_the_one_line():
    """A trainer rank and a rollout worker die for different reasons: the job's line says which process it was."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    ctx = ActorDiedErrorContext(
        class_name="TrainerActor",
        actor_id=bytes(16),
        pid=15601,
        error_message="The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit ...",
    )
    line = one_line(ActorDiedError(ctx))
    died = "ActorDiedError: The actor died unexpectedly before finishing this task."
    assert line == f"{died} (TrainerActor, pid 15601, exit type SYSTEM_ERROR)"
    assert one_line(ActorDiedError()) == died  # Ray did not say which process
    ctx = ActorDiedErrorContext(
        class_name="test_x.<locals>.Worker", actor_id=bytes(16), error_message="MemoryError: out of memory"
    )
    assert (
        one_line(ActorDiedError(ctx)) == "MemoryError: out of memory (test_x.<locals>.Worker)"
    )  # a quoted error and the process
