"""Executor layer: the user's reward functions in a process of their own, one per job's reward set.

A reward function is the user's code, and code stuck in C with the interpreter lock held (a regular
expression backtracking over a degenerate completion) stops every thread of its process. In the
job's coordinator that would stop the job's deadline too, and its answers to the scheduler: the
scheduler, hearing nothing, ends the job as unreachable and nobody learns why. So the functions run
in a child process, started at the first batch and kept for the reward set's life (a function's
module-level state lives as long as the job's stream, as it would in TRL). The caller waits with its
deadline; past it, :meth:`RewardProcess.stuck_at` reads the child's stacks (``faulthandler``, which
needs no lock) to name the line it is stuck at, and the child is killed with whatever it started.

The child speaks pickles on copies of its stdin and stdout; its own stdin reads nothing and its
stdout is its stderr, so the functions' prints (unbuffered: ``-u``) and the programs they start cannot
touch the conversation. Its stderr is the reward set's log (the job's ``rewards.log``, appended to
by every child the set starts), or the parent's where there is none. On Linux the child dies with the thread that started it
(``PR_SET_PDEATHSIG``): :meth:`RewardProcess.start` it from a thread that lives as long as the job.
"""

from __future__ import annotations

import contextlib
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

from rlix.exec.error_text import ending

# faulthandler's frame lines: ``  File "path", line N in name`` (innermost first).
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>\S+)')
DUMP_WAIT_S = 2.0  # how long the child's stacks may take to be written once asked for
_CHILD = "import sys; sys.path[:] = {path!r}; from {module} import {fn}; {fn}({dir!r})"
ENDED = ("error", "the reward functions' process was ended", -1, "")  # the answer once :meth:`RewardProcess.end` ran


class RewardProcess:
    """The child process of one reward set: :meth:`call` scores a batch there. ``serve``: the child's
    loop, ``module:function`` (called with the child's directory); ``caller``: the file of the reward
    set's ``call``, the frame the user's code is called from; ``log``: the file its output is appended to
    (None: the parent's stderr)."""

    def __init__(self, refs: tuple, serve: str, caller: Path, log: Path | None = None) -> None:
        self.refs, self.serve, self.caller, self.log = refs, serve, caller, log
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None  # the child's two files: its stacks when asked, the function it is calling
        self._lock = threading.Lock()  # one batch at a time (a pipe carries one conversation)
        self._shut: weakref.finalize | None = None
        self._ended = False  # :meth:`end` was called: no child starts again

    def start(self) -> None:
        """Start the child now, if it is not running (:meth:`call` starts it otherwise)."""
        with self._lock:
            self._started()

    def call(self, kwargs: dict) -> tuple:
        """Score one batch: ``("ok", RewardBatch)`` or ``("error", message, index, details)`` of a RewardError."""
        try:
            batch = pickle.dumps(kwargs)
        except Exception as exc:  # noqa: BLE001 -- a column the dataset gave that cannot be sent
            return ("error", f"the batch cannot be sent to the reward functions: {type(exc).__name__}: {exc}", -1, "")
        with self._lock:
            if self._ended:
                return ENDED
            proc = self._started()
            if self._ended:  # ended while it started (end() takes no lock): it must not outlive that
                _kill(proc)
            try:
                proc.stdin.write(batch)
                proc.stdin.flush()
                return pickle.load(proc.stdout)
            except (EOFError, OSError, ValueError, pickle.UnpicklingError):  # it died, or was killed past its deadline
                return self._died(proc)

    def _died(self, proc: subprocess.Popen) -> tuple:
        """The answer for a child that ended mid-call (its pipes are closed here, by the reading thread)."""
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        index, _ = self._calling()
        if proc is self._proc:
            self.close(kill=True)
        proc.stdout.close()  # this thread was its only reader
        if code is None:
            how = "stopped answering"
        else:
            how = ("was " if code < 0 else "") + ending(code) + (" (out of memory?)" if code == -signal.SIGKILL else "")
        where = self.log if self.log is not None else "stderr"  # a dry run's: rlix-run's own
        return ("error", f"the reward functions' process {how}; its output is in {where}", index, "")

    def stuck_at(self) -> tuple[int, list[tuple[str, int]], list[str]]:
        """For a call past its deadline: the index of the function running (-1: none yet), the child's
        frames (file, line; innermost first) from the reward set's call inward, and each function's
        directory. The child is killed: its call will never be waited for again."""
        proc, directory = self._proc, self._dir
        if proc is None or directory is None:
            return -1, [], []
        dump, frames, size = directory / "stacks", [], -1
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + DUMP_WAIT_S
            while time.monotonic() < deadline:  # written in many small pieces: read it once it stops growing
                time.sleep(0.05)
                text = _read(dump)
                if "most recent call first" in text and len(text) == size:
                    break
                size = len(text)
            frames = _frames(_read(dump), self.caller)
        index, homes = self._calling()
        self.close(kill=True)
        return index, frames, homes

    def end(self) -> None:
        """End the child at once, for good: a call waiting on it answers an error, and none starts another
        (set first, then the child read: a call starting one meanwhile sees the one or the other)."""
        self._ended = True
        self.close(kill=True)

    def close(self, *, kill: bool = False) -> None:
        """End the child (a later :meth:`call` starts another): it exits once its input ends, or at once
        with whatever it started (``kill``, or if it has not within a second)."""
        proc, self._proc = self._proc, None
        self._dir = None
        if proc is not None and kill:
            _kill(proc)
        if self._shut is not None and (shut := self._shut.detach()) is not None:
            _shut(*shut[2], output=False)  # a thread may still read its answers: that thread closes their pipe
        if proc is not None and self._lock.acquire(blocking=False):  # no thread reads its answers: close their pipe
            try:
                proc.stdout.close()
            finally:
                self._lock.release()

    def _calling(self) -> tuple[int, list[str]]:
        """The function the child called last (-1: none, or between calls) and each function's directory."""
        lines = _read(self._dir / "calling").splitlines() if self._dir is not None else []
        index = int(lines[0]) if lines and lines[0].lstrip("-").isdigit() else -1
        return index, lines[1:]

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self.close(kill=True)
            self._dir = Path(tempfile.mkdtemp(prefix="rlix-rewards-"))
            # The parent's import path exactly (python -I: no cwd first, no PYTHON* variables), so a
            # reference resolves there as it does here.
            module, fn = self.serve.split(":")
            child = _CHILD.format(path=list(sys.path), module=module, fn=fn, dir=str(self._dir))
            cmd = [sys.executable, "-I", "-u", "-c", child]  # -u: -I ignores PYTHONUNBUFFERED
            log = self._open_log()
            try:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=os.environ,
                    start_new_session=True,  # its own group: killed with whatever it started
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 -- one prctl call, no locks taken
                )
            finally:
                if log is not None:
                    log.close()  # the child holds its own copy
            self._shut = weakref.finalize(self, _shut, self._proc, self._dir)  # dropped unclosed: ended too
            pickle.dump(self.refs, self._proc.stdin)
            self._proc.stdin.flush()
        return self._proc

    def _open_log(self):
        """The log, opened to append (None: the parent's stderr, also where one cannot be opened: a log
        that cannot be written fails no job; the line saying so goes where the output will)."""
        if self.log is None:
            return None
        try:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            return open(self.log, "ab")  # noqa: SIM115 -- handed to the child, closed once it has it
        except OSError as exc:
            print(f"rlix: cannot write {self.log} ({exc.strerror}): the reward functions' output goes to stderr", file=sys.stderr)
            self.log = None
            return None


def _die_with_parent() -> None:
    """In the child, before it runs: the kernel kills it when the thread that started it ends (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child's whole group (what its functions started dies with it)."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def _shut(proc: subprocess.Popen, directory: Path, output: bool = True) -> None:
    """End a child: it exits once its input ends (killed if it has not within a second), is reaped, and
    its files go; ``output``: its answers' pipe is closed too (nothing can be reading it)."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    if output:
        proc.stdout.close()
    shutil.rmtree(directory, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _frames(dump: str, caller: Path) -> list[tuple[str, int]]:
    """The frames of the thread that called the reward functions, innermost first, down to the reward
    set's own ``call`` in ``caller`` (excluded): what faulthandler wrote, read back."""
    for block in dump.split("\n\n"):
        frames = [(m["file"], int(m["line"]), m["name"]) for m in map(_FRAME.match, block.splitlines()) if m]
        calls = [i for i, (file, _, name) in enumerate(frames) if name == "call" and _same(file, caller)]
        if calls:
            return [(file, line) for file, line, _ in frames[: calls[-1]]]
    return []


def _same(file: str, path: Path) -> bool:
    with contextlib.suppress(OSError):
        return Path(file).resolve() == path
    return False
