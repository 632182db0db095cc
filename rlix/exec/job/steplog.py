"""Executor layer: what a user watches while a job trains, one line per step.

Each job writes ``<output.dir>/<job>/metrics.jsonl`` as its steps finish:
the step (step N is the Nth trained step, counted from 1, as on the console,
in checkpoint names and as TensorBoard's global step), each reward function's mean and std (and how many completions it
had no opinion on), the total reward, loss, KL, mean and max response
length (tokens), step seconds, GPU-seconds the job held, and the staleness
of the batch (steps between the policy that generated the oldest token and
the one trained). With ``tensorboard`` installed the same scalars go to
event files in that directory (written with tensorboard's own writer: no
torch, no TensorFlow). A ``data.json`` beside it says what preparing the
job's data found, and ``rewards.log`` what its reward functions print (:meth:`StepLog.reward_log`).
Lines are flushed as written, so a crash keeps every
finished step. A rerun finds the directory prepared by
:mod:`rlix.exec.front.rerun`: fresh, or, for a job resuming from a checkpoint,
a metrics.jsonl holding the lines of the steps the checkpoint holds (copied
into the fresh TensorBoard events when they open).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

from rlix.exec.error_text import one_line, os_error
from rlix.exec.records import StepRecord, TrajRecord
from rlix.lengths import spearman
from rlix.metrics import Activity


class HeldClock:
    """GPU-seconds a pipeline has held (any activity but FREE), from its activity changes."""

    def __init__(self) -> None:
        self.held: dict[int, bool] = {}
        self.t = 0.0
        self.total_s = 0.0  # GPU-seconds

    def observe(self, t: float, gpus: tuple[int, ...], activity: Activity) -> None:
        self.advance(t)
        for g in gpus:
            self.held[g] = activity is not Activity.FREE

    def advance(self, t: float) -> float:
        if t > self.t:
            self.total_s += (t - self.t) * sum(1 for h in self.held.values() if h)
            self.t = t
        return self.total_s


def _fn_key(name: str) -> str:
    """A reward reference as a metric name: its function, qualified by its file or module stem."""
    where, _, fn = name.rpartition(":")
    stem = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
    return f"{stem}.{fn}" if stem else fn


def step_metrics(
    *, step: int, scored, train, tokens: list[int], step_s: float, gpu_s: float, staleness: int, length_rank: float | None = None
) -> dict:
    """One metrics line (flat keys, so pandas and TensorBoard read it as is)."""
    rewards = list(scored.rewards)
    mean = sum(rewards) / max(len(rewards), 1)
    out: dict[str, object] = {
        "step": step,
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)) ** 0.5,
    }
    for f in scored.functions:
        key = _fn_key(f.name)
        out[f"reward/{key}/mean"] = f.mean
        out[f"reward/{key}/std"] = f.std
        out[f"reward/{key}/none"] = f.nones
    out.update(
        loss=getattr(train, "loss", None),
        kl=getattr(train, "kl", None),
        response_len_mean=sum(tokens) / max(len(tokens), 1),
        response_len_max=max(tokens, default=0),
        step_s=step_s,
        gpu_s_held=gpu_s,
        staleness=staleness,
        length_rank_correlation=length_rank,  # predicted against actual response length (rlix.lengths; None: < 2 predicted)
    )
    if scored.eval is not None:
        out["eval/reward_mean"] = scored.eval.mean_reward
        out["eval/prompts"] = scored.eval.prompts
        for f in scored.eval.functions:
            out[f"eval/{_fn_key(f.name)}/mean"] = f.mean
    return out


def read_lines(path: Path) -> list[dict]:
    """The whole lines of a metrics.jsonl (a line cut short by a crash is left out)."""
    out = []
    for text in path.read_text(encoding="utf-8").splitlines() if path.is_file() else ():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and isinstance(line.get("step"), int):
            out.append(line)
    return out


def _why(exc: Exception) -> str:
    return os_error(exc) if isinstance(exc, OSError) else one_line(exc)


def _ends_mid_line(path: Path) -> bool:
    """Whether a file's last line has no end (written only in part)."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


class StepLog:
    """A job's metrics.jsonl (+ TensorBoard events when importable); opened in the process that writes.

    A line that cannot be written (the folder gone, the disk full) fails no training: the first such
    failure is kept in ``problem`` (the job reports it at its end) and the next step's line tries again."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.clock = HeldClock()
        self._last_gpu_s: dict[str, float] = {}
        self._file = None
        self._tb = None
        self.problem = ""  # the first line that could not be written, and why

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None, "_tb": None}  # handles are opened where the log is used

    def observe(self, t: float, gpus: tuple[int, ...], activity: Activity) -> None:
        self.clock.observe(t, gpus, activity)

    def reward_log(self, stream: str = "") -> Path:
        """Where a stream's reward functions' output goes: ``rewards.log`` (an adapter's: ``rewards-<adapter>.log``)."""
        return self.dir / (f"rewards-{stream}.log" if stream else "rewards.log")

    def write_data_report(self, report: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "data.json").write_text(json.dumps(report, indent=1) + "\n")

    def write_step(self, record: StepRecord, trained: Sequence[TrajRecord], scored, train) -> dict:
        """The line of one trained step: ``trained`` are its trajectory records (eval ones left out)."""
        return self.write(
            stream=record.stream,
            t=record.finished_s,
            step=record.step + 1,  # step N is the Nth trained step (the machine counts from 0)
            scored=scored,
            train=train,
            tokens=[r.tokens for r in trained],
            step_s=record.finished_s - record.started_s,
            staleness=record.step - min(r.weight_version for r in trained),
            length_rank=spearman([(r.predicted, math.log(max(r.tokens, 1))) for r in trained if r.predicted is not None]),
        )

    def write(
        self,
        *,
        stream: str,
        t: float,
        step: int,
        scored,
        train,
        tokens: list[int],
        step_s: float,
        staleness: int,
        length_rank: float | None = None,
    ) -> dict:
        """Append the step's line; GPU-seconds are those held since the stream's previous line."""
        held = self.clock.advance(t)
        gpu_s = held - self._last_gpu_s.get(stream, 0.0)
        self._last_gpu_s[stream] = held
        line = step_metrics(
            step=step,
            scored=scored,
            train=train,
            tokens=tokens,
            step_s=step_s,
            gpu_s=gpu_s,
            staleness=staleness,
            length_rank=length_rank,
        )
        if stream:
            line = {"adapter": stream, **line}
        try:
            if not self._still_there():
                self.close()  # its folder was moved or removed: opened again where it is asked for
            self._open()
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()
            if self._tb is not None:
                self._scalars(stream, step, line)
        except Exception as exc:  # noqa: BLE001 -- OSError, or TensorBoard's own (tf.errors) where TensorFlow is installed
            self.problem = self.problem or f"its step {step} metrics could not be written to {self.dir} ({_why(exc)})"
            self.close()  # opened again for the next line
        return line

    def _still_there(self) -> bool:
        """Whether the open metrics.jsonl is still the file at its path (True when none is open)."""
        if self._file is None:
            return True
        try:
            return os.stat(self.dir / "metrics.jsonl").st_ino == os.fstat(self._file.fileno()).st_ino
        except OSError:
            return False

    def _open(self) -> None:
        if self._file is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "metrics.jsonl"
        carried = read_lines(path)
        self._file = open(path, "a", encoding="utf-8")  # a resumed job continues the lines its checkpoint holds
        if _ends_mid_line(path):  # a line cut short (the disk filled): the next one starts on a line of its own
            self._file.write("\n")
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            return  # TensorBoard is optional
        fresh = not any(self.dir.glob("events.out.tfevents.*"))
        self._tb = EventFileWriter(str(self.dir))
        for line in carried if fresh else ():  # fresh events mirror the whole file
            self._scalars(line.get("adapter", ""), line["step"], line)

    def _scalars(self, stream: str, step: int, line: dict) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        prefix = f"{stream}/" if stream else ""
        values = [
            Summary.Value(tag=prefix + k, simple_value=float(v))
            for k, v in line.items()
            if isinstance(v, (int, float)) and k not in ("step",)
        ]
        self._tb.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self._tb.flush()

    def close(self) -> None:
        file, tb, self._file, self._tb = self._file, self._tb, None, None
        for handle in (file, tb):
            if handle is not None:
                try:
                    handle.close()
                except Exception as exc:  # noqa: BLE001 -- some file systems say a write failed only at its close
                    self.problem = self.problem or f"its last metrics could not be written to {self.dir} ({_why(exc)})"
