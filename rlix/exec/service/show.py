"""Executor layer: ``rlix status`` and ``rlix history`` as tables (in the manner of ``squeue`` and ``sacct``)."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rlix.exec.service.connect import jobs
from rlix.protocol import ClusterStatus, HistoryRow, JobRow

NUMBERS = ("PRI", "GPU-S", "FAIR", "LENT", "BORROWED", "QUEUE", "STEPS", "ELAPSED")


def console() -> Console:
    return Console(width=None if Console().is_terminal else 160)


def gpu_text(row: JobRow) -> str:
    """The GPUs a job holds, grouped by what holds them: ``rollout 2,3 actor_train 0,1``."""
    by: dict[str, list[int]] = {}
    for g, label in row.gpus:
        by.setdefault(label, []).append(g)
    return " ".join(f"{label} {','.join(map(str, gs))}" for label, gs in sorted(by.items())) or "-"


def state_text(row: JobRow) -> str:
    """Its state, with why it ended or why it waits."""
    why = row.error or row.reason
    return row.state + (f" ({why})" if why else "")


def _table(columns: tuple[str, ...]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in NUMBERS else "left")
    return table


def status_view(status: ClusterStatus) -> Group:
    """The cluster's line, then a row per job."""
    head = Text(
        f"rlix scheduler: {status.nodes} x {status.gpus_per_node} GPUs, policy {status.policy}, up {status.uptime_s:.0f} s"
        f"{f', restarted {status.restarts}x' if status.restarts else ''}; utilization {status.utilization:.3f}, "
        f"idle {status.idle_fraction:.3f}, queued {status.queue_length}"
        + (f"; {jobs(status.forgotten_jobs)} ended earlier, in rlix history" if status.forgotten_jobs else "")
    )
    tenants = any(r.tenant for r in status.jobs)
    columns = ("ID", "NAME", "TENANT") if tenants else ("ID", "NAME")
    table = _table((*columns, "STATE", "PRI", "GPUS", "STEPS", "GPU-S", "FAIR", "LENT", "BORROWED", "QUEUE", "USER"))
    for r in status.jobs:
        table.add_row(
            *((r.id, r.name, r.tenant or "-") if tenants else (r.id, r.name)),
            state_text(r),
            str(r.priority),
            gpu_text(r),
            f"{r.steps_done}/{r.steps_total}",
            f"{r.gpu_s:.0f}",
            f"{r.fair_s:.0f}",
            f"{r.lent_s:.0f}",
            f"{r.borrowed_s:.0f}",
            str(r.queue_position) if r.queue_position is not None else "-",
            r.user or r.submitter,
        )
    return Group(head, table)


def status_table(status: ClusterStatus, out: Console | None = None) -> None:
    (out or console()).print(status_view(status))


def job_detail(row: JobRow, started_at: float) -> Group:
    """One job: every field of its row, and its phases with their times (``started_at``: the service's zero)."""
    fields = Table.grid(padding=(0, 2))
    for key, value in (
        ("job", f"{row.id} ({row.name})"),
        ("state", state_text(row)),
        ("user", row.user or "-"),
        ("submitter", row.submitter),
        ("priority", str(row.priority) + (f", tenant {row.tenant}" if row.tenant else "")),
        ("gpus", gpu_text(row)),
        ("steps", f"{row.steps_done}/{row.steps_total}"),
        ("gpu-seconds", f"{row.gpu_s:.1f} used, {row.fair_s:.1f} fair, {row.lent_s:.1f} lent, {row.borrowed_s:.1f} borrowed"),
        ("queue", str(row.queue_position) if row.queue_position is not None else "-"),
        ("log", row.log or "-"),  # host:path, in the directory its run writes its outputs
    ):
        fields.add_row(key, value)
    phases = _table(("PHASE", "SINCE", "FOR"))
    ends = [t for _, t in row.phases[1:]] + [None]
    for (phase, t), end in zip(row.phases, ends):
        span = f"{end - t:.1f} s" if end is not None else "-"
        phases.add_row(phase, clock(started_at + t), span)
    return Group(fields, Text(""), phases)


def history_table(rows: list[HistoryRow], out: Console | None = None) -> None:
    table = _table(
        ("ID", "NAME", "USER", "STATE", "SUBMITTED", "ENDED", "ELAPSED", "STEPS", "GPU-S", "LENT", "BORROWED", "CONFIG")
    )
    for r in rows:
        table.add_row(
            r.id,
            r.name,
            r.user or "-",
            r.state + (f" ({r.reason})" if r.reason else ""),
            clock(r.submitted_at),
            clock(r.ended_at),
            f"{r.ended_at - r.submitted_at:.0f} s",
            f"{r.steps_done}/{r.steps_total}",
            f"{r.gpu_s:.0f}",
            f"{r.lent_s:.0f}",
            f"{r.borrowed_s:.0f}",
            r.config or "-",
        )
    (out or console()).print(table)


def clock(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))
