"""Executor layer: a job's lines of its run's log (``rlix logs JOB [--follow]``).

A job's record names its run's log as ``host:path`` (written by
:mod:`rlix.exec.front.runlog`, a line ``<time> <job>: ...`` per change). The ``rlix`` tool reads it itself on that
host; elsewhere it asks the scheduler, which reads it when the log is on its
own node (a detached run's is: it runs on the head node, as the scheduler).
"""

from __future__ import annotations

import socket
from pathlib import Path

from rlix.exec.records import JobStatus
from rlix.exec.service.jobs import ENDED as ENDED_PHASES
from rlix.protocol import LogChunk

NAME = "rlix-run.log"  # a run's log, in its output directory
CHUNK = 1 << 20  # the most bytes one read returns
ENDED = frozenset(p.value for p in ENDED_PHASES)  # a job record's end states, as the scheduler says them
LAST_STATES = frozenset(s.value for s in JobStatus) - {JobStatus.PENDING.value, JobStatus.RUNNING.value}  # a last line's


def job_of(line: str) -> str:
    """The job a log line (``<time> <job>: ...``) is about ("" for a line about the run)."""
    words = line.split(" ", 2)
    return words[1].removesuffix(":") if len(words) > 2 and words[1].endswith(":") else ""


def state_of(line: str) -> str:
    """What a job's log line (``<time> <job>: <state> ...``) says it is doing ("" for a line about the run)."""
    words = line.split(" ", 3)
    return words[2] if len(words) > 2 and job_of(line) else ""


def local_path(log: str) -> Path | None:
    """The log's path if it is on this host ("host:path"), else None."""
    host, _, path = log.partition(":")
    return Path(path) if path and host == socket.gethostname() else None


def read_chunk(path: Path, offset: int) -> tuple[str, int]:
    """Whole lines of the file from byte ``offset``, and the offset after them ("" where none is new)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(CHUNK)
    except FileNotFoundError:
        return "", offset
    whole = raw[: raw.rfind(b"\n") + 1]  # a line still being written waits for the next read
    return whole.decode(errors="replace"), offset + len(whole)


def lines_of(text: str, name: str) -> list[str]:
    """The lines of ``text`` about job ``name``."""
    return [line for line in text.splitlines() if job_of(line) == name]


def chunk_here(log: str, offset: int, ended: bool) -> LogChunk:
    """What the scheduler answers for a log on its own node (``found`` False: the log is elsewhere)."""
    path = local_path(log)
    if path is None:
        return LogChunk(found=False, text="", offset=offset, ended=ended)
    text, offset = read_chunk(path, offset)
    return LogChunk(found=True, text=text, offset=offset, ended=ended)
