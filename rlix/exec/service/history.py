"""Executor layer: the jobs a scheduler service saw end, in an SQLite database on its node (as ``sacct`` reads Slurm's).

One row per job id: its name, who submitted it and from which config, every
phase it went through with its time (Unix seconds), its GPU-seconds used,
lent and borrowed, and how it ended. The database is a file (``rlix
scheduler start --history PATH``; default ``~/.rlix/history.sqlite`` on the
head node), so it outlives the scheduler's restarts and the service itself.
``rlix history`` reads it through the scheduler, or straight from the file
with ``--db PATH``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rlix.exec.service.jobs import JobRecord
from rlix.exec.service.usage import ClusterUsage
from rlix.protocol import HistoryRow

DEFAULT_PATH = "~/.rlix/history.sqlite"
KEEP_ENDED_MIN_S = 60.0  # at least: a submitter learns how its job ended (it renews every few seconds) before
KEEP_ENDED_S = 3600.0  # how long an ended job stays in the status once it is here (rlix scheduler start --keep-ended)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    user TEXT NOT NULL,
    submitter TEXT NOT NULL,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    phases TEXT NOT NULL,
    steps_done INTEGER NOT NULL,
    steps_total INTEGER NOT NULL,
    gpu_s REAL NOT NULL,
    lent_s REAL NOT NULL,
    borrowed_s REAL NOT NULL,
    log TEXT NOT NULL DEFAULT ''
)
"""
COLUMNS = tuple(HistoryRow.__dataclass_fields__)
ADDED = {"log": "TEXT NOT NULL DEFAULT ''"}  # columns a history written by an earlier rlix lacks (added on open)


class History:
    """The database of ended jobs (one connection, used from the scheduler's event loop only)."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        """``readonly``: to read a file that is there (``rlix history --db``), changing nothing."""
        self.path = Path(path).expanduser()
        if readonly:
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            self.db.execute("SELECT id FROM jobs LIMIT 1")  # sqlite3.Error if it is not a history
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=10)
            self.db.execute(SCHEMA)
            for name in ADDED.keys() - self._columns():
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {ADDED[name]}")
            self.db.commit()
        self.columns = tuple(c for c in COLUMNS if c in self._columns())  # what it holds (read-only: maybe fewer)

    def _columns(self) -> set[str]:
        return {name for _, name, *_ in self.db.execute("PRAGMA table_info(jobs)")}

    def write(self, row: HistoryRow) -> None:
        """Add the job's row (or replace it: a job written again has its final figures)."""
        values = [json.dumps(v) if k == "phases" else v for k, v in zip(COLUMNS, _values(row))]
        marks = ",".join("?" * len(COLUMNS))
        self.db.execute(f"INSERT OR REPLACE INTO jobs ({','.join(COLUMNS)}) VALUES ({marks})", values)
        self.db.commit()

    def written(self) -> set[str]:
        return {job for (job,) in self.db.execute("SELECT id FROM jobs")}

    def query(self, *, user: str = "", since: float = 0.0) -> list[HistoryRow]:
        """Ended jobs, oldest first; ``user``: only theirs (a name, or user@host); ``since``: ended at or after (Unix s)."""
        sql, args = f"SELECT {','.join(self.columns)} FROM jobs WHERE ended_at >= ?", [since]
        if user:
            sql += " AND (user = ? OR user LIKE ?)"
            args += [user, f"{user}@%"]
        rows = self.db.execute(sql + " ORDER BY ended_at, id", args).fetchall()
        return [self._row(r) for r in rows]

    def find(self, job: str) -> HistoryRow | None:
        """The job of this id, or the last to end of this name (None: neither is here)."""
        sql = f"SELECT {','.join(self.columns)} FROM jobs WHERE id = ? OR name = ? ORDER BY id = ? DESC, ended_at DESC, id DESC"
        found = self.db.execute(sql + " LIMIT 1", (job, job, job)).fetchone()
        return self._row(found) if found is not None else None

    def _row(self, values: tuple) -> HistoryRow:
        plain = dict(zip(self.columns, values))
        plain["phases"] = tuple(tuple(p) for p in json.loads(plain["phases"]))
        return HistoryRow(**plain)

    def close(self) -> None:
        self.db.close()


def history_row(record: JobRecord, usage: ClusterUsage, t0: float) -> HistoryRow:
    """An ended job's row: its record, with its times on the clock of the world (``t0``: the service's zero)."""
    note = record.note
    phases = tuple((phase, t0 + t) for phase, t in record.phases)
    return HistoryRow(
        id=record.id,
        name=record.name,
        user=record.user,
        submitter=record.submitter,
        config=record.config,
        state=record.phase.value,
        reason=record.error,
        submitted_at=phases[0][1],
        ended_at=phases[-1][1],
        phases=phases,
        steps_done=note.steps_done if note is not None else 0,
        steps_total=record.steps_total,
        gpu_s=usage.used.get(record.id, 0.0),
        lent_s=usage.lent.get(record.id, 0.0),
        borrowed_s=usage.borrowed.get(record.id, 0.0),
        log=record.log,
    )


def _values(row: HistoryRow) -> list:
    return [getattr(row, k) for k in COLUMNS]
