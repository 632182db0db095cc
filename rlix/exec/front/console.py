"""Executor layer: live per-job progress on the console (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rlix.exec.front.joblines import job_line

COLUMNS = ("job", "status", "step", "reward", "GPUs held", "re-queued")


def rows(session) -> list[tuple[str, ...]]:
    """One row per pipeline, in name order: what the table shows (a job that ended shows its result)."""
    now = session.now()
    out = []
    for _, p in sorted(session.pipelines.items()):
        line = job_line(p, now)
        step = f"{line.step}/{line.steps}"
        out.append((line.name, line.status_text(), step, line.reward_text(), str(line.gpus_held), str(line.requeued)))
    return out


class ProgressView:
    """A table refreshed on every poll: state (and for how long), steps, reward, GPUs held, re-queued trajectories."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self.note = ""  # a line under the table (e.g. how to stop)

    def __enter__(self) -> ProgressView:
        if self.enabled:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, session) -> None:
        if self.live is None:
            return
        running = any(p.result is None for p in session.pipelines.values())
        table = Table(
            title=f"rlix-run  policy={session.config.policy}  t={session.now():.1f}s", caption=self.note if running else None
        )
        for col in COLUMNS:
            table.add_column(col)
        for row in rows(session):
            table.add_row(*row)
        self.live.update(table)
