"""Executor layer: the user's reward functions in a process of their own, one per job's reward set.

A reward function is the user's code, and code stuck in C with the interpreter lock held (a regular
expression backtracking over a degenerate completion) stops every thread of its process. In the
job's coordinator that would stop the job's deadline too, and its answers to the scheduler: the
scheduler, hearing nothing, ends the job as unreachable and nobody learns why. So the functions run
in a child process, started at the first batch and kept for the job's life (a function's module-level
state lives as long as the job, as it would in TRL). The caller waits with its deadline; past it,
:meth:`RewardProcess.stuck_at` reads the child's stacks (``faulthandler``, which needs no lock) to
name the line it is stuck at, and the child is killed.

The child speaks pickles on its stdin and on a copy of its stdout; the functions' own prints go to
its stderr (the job's log).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

# faulthandler's frame lines: ``  File "path", line N in name`` (innermost first).
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>\S+)')
DUMP_WAIT_S = 2.0  # how long the child's stacks may take to appear once asked for


class RewardProcess:
    """The child process of one reward set: :meth:`call` scores a batch there."""

    def __init__(self, refs: tuple) -> None:
        self.refs = refs
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None  # the child's two files: its stacks when asked, the function it is calling
        self._lock = threading.Lock()  # one batch at a time (a pipe carries one conversation)
        self._shut: weakref.finalize | None = None

    def call(self, kwargs: dict) -> tuple:
        """Score one batch: ``("ok", RewardBatch)`` or ``("error", message, index, details)`` of a RewardError."""
        with self._lock:
            proc = self._started()
            try:
                pickle.dump(kwargs, proc.stdin)
                proc.stdin.flush()
                return pickle.load(proc.stdout)
            except (EOFError, BrokenPipeError, pickle.UnpicklingError, OSError, ValueError):  # its pipe closed under it
                code = proc.poll()
                self._proc = None
                how = f"exited with status {code}" if code is not None else "stopped answering"
                return ("error", f"the reward functions' process {how} (its output is in the job's log)", -1, "")

    def stuck_at(self) -> tuple[int, list[tuple[str, int]], list[str]]:
        """For a call past its deadline: the index of the function running (-1: none yet), the child's
        frames (file, line; innermost first) from the reward set's call inward, and each function's
        directory. The child is killed: its call will never be waited for again."""
        proc, directory = self._proc, self._dir
        if proc is None or directory is None:
            return -1, [], []
        dump = directory / "stacks"
        try:
            os.kill(proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + DUMP_WAIT_S
            while "most recent call first" not in _read(dump) and time.monotonic() < deadline:
                time.sleep(0.02)
        except OSError:
            pass
        frames = _frames(_read(dump))
        calling = _read(directory / "calling").splitlines()
        self.close()
        index = int(calling[0]) if calling and calling[0].lstrip("-").isdigit() else -1
        return index, frames, calling[1:]

    def close(self) -> None:
        """Kill the child (a later :meth:`call` starts another)."""
        proc, self._proc, self._dir = self._proc, None, None
        if proc is not None:
            proc.kill()
            self._shut()

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._dir = Path(tempfile.mkdtemp(prefix="rlix-rewards-"))
            cmd = [sys.executable, "-m", "rlix.exec.data.reward_process", str(self._dir)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # what this process imports
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            self._shut = weakref.finalize(self, _shut, self._proc, self._dir)  # dropped unclosed: its child is ended too
            pickle.dump(self.refs, self._proc.stdin)
        return self._proc


def _shut(proc: subprocess.Popen, directory: Path) -> None:
    """End a child: it exits once its input ends (killed if it does not within a second), is reaped, and
    its files go."""
    proc.stdin.close()
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    shutil.rmtree(directory, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _frames(dump: str) -> list[tuple[str, int]]:
    """The frames of the thread that called the reward functions, innermost first, down to the reward
    set's own call (excluded): what faulthandler wrote, read back."""
    for block in dump.split("\n\n"):
        frames = [(m["file"], int(m["line"]), m["name"]) for m in map(_FRAME.match, block.splitlines()) if m]
        inner = [i for i, (file, _, name) in enumerate(frames) if name == "call" and file.endswith("rewards.py")]
        if inner:
            return [(file, line) for file, line, _ in frames[: inner[0]]]
    return []


def _serve(files: Path) -> None:
    """The child: read the refs, then batches, until the parent closes the pipe."""
    import faulthandler

    from rlix.exec.data.rewards import RewardError, RewardSet

    out = os.fdopen(os.dup(1), "wb")  # the answers' pipe; fd 1 becomes stderr, for the functions' prints
    os.dup2(2, 1)
    stacks = open(files / "stacks", "w", encoding="utf-8")  # noqa: SIM115 -- faulthandler writes here until exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    inp = sys.stdin.buffer
    rewards = RewardSet(pickle.load(inp))
    calling = files / "calling"

    def note(k: int, homes: list[str]) -> None:
        calling.write_text("\n".join([str(k), *homes]) + "\n", encoding="utf-8")

    rewards.on_call = note
    while True:
        try:
            kwargs = pickle.load(inp)
        except EOFError:
            return
        try:
            answer: tuple = ("ok", rewards.call(**kwargs))
        except RewardError as exc:
            answer = ("error", str(exc), exc.index, exc.details)
        pickle.dump(answer, out)
        out.flush()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
