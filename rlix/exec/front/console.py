"""Executor layer: live per-job progress on the console (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table


class ProgressView:
    """A table refreshed on every poll: step, reward, GPUs held, re-queued trajectories."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live: Live | None = None

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
        table = Table(title=f"rlix-run  policy={session.config.policy}  t={session.now():.1f}s")
        for col in ("job", "status", "step", "reward", "GPUs held", "re-queued"):
            table.add_column(col)
        for pid, p in sorted(session.pipelines.items()):
            prog = p.progress
            status = p.result.status.value if p.result else (prog.status.value if prog else "waiting")
            step = f"{prog.step}/{prog.steps}" if prog else f"0/{p.job.steps}"
            reward = f"{prog.last_reward:.3f}" if prog and prog.last_reward is not None else "-"
            held = str(prog.gpus_held) if prog and not p.result else "0"
            table.add_row(pid, status, step, reward, held, str(prog.requeued if prog else 0))
        self.live.update(table)
