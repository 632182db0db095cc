"""Executor layer: a run's log, ``<output.dir>/rlix-run.log``: a line each time a job's state or step changes.

What the live view shows, kept: each line is ``<time> <job> <what it is doing>``
(``small: running steps=4/10 reward 0.21 -> 0.48 gpus=2``), flushed as
written, so ``rlix logs JOB --follow`` (or ``tail -f``) follows a job whether
its ``rlix-run`` is attached to a terminal or detached. The run's closing
report goes at its end.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlix.exec.front.joblines import job_line
from rlix.exec.service.logs import NAME


class RunLog:
    """Appends a session's job lines as they change (an ``on_progress`` hook)."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / NAME
        self.file = open(self.path, "w", buffering=1)  # this run's; line-buffered: a follower sees each line at once
        self.last: dict[str, tuple] = {}

    def __call__(self, session) -> None:
        now = session.now()
        for pid, p in sorted(session.pipelines.items()):
            line = job_line(p, now)
            key = (line.state, line.step, line.steps, line.gpus_held, line.error)
            if self.last.get(pid) != key:
                self.last[pid] = key
                gpus = f" gpus={line.gpus_held}" if line.gpus_held else ""
                self.write(f"{line.summary()}{gpus}")

    def write(self, text: str) -> None:
        """Append ``text``'s lines; where they cannot be written (its folder gone, the disk full) the log stops
        quietly: the run goes on, and says what became of its outputs at its end."""
        if self.file is None:
            return
        try:
            for line in text.splitlines():
                self.file.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        except OSError:
            self.close()

    def close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError:  # its last lines could not be written: nothing more to do
                pass
