"""Executor layer: ``rlix status`` as a table (in the manner of ``squeue``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rlix.protocol import ClusterStatus, JobRow


def gpu_text(row: JobRow) -> str:
    """The GPUs a job holds, grouped by what holds them: ``rollout 2,3 actor_train 0,1``."""
    by: dict[str, list[int]] = {}
    for g, label in row.gpus:
        by.setdefault(label, []).append(g)
    return " ".join(f"{label} {','.join(map(str, gs))}" for label, gs in sorted(by.items())) or "-"


def status_table(status: ClusterStatus, console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 160)
    console.print(
        f"rlix scheduler: {status.nodes} x {status.gpus_per_node} GPUs, policy {status.policy}, up {status.uptime_s:.0f} s"
        f"{f', restarted {status.restarts}x' if status.restarts else ''}; utilization {status.utilization:.3f}, "
        f"idle {status.idle_fraction:.3f}, queued {status.queue_length}"
    )
    table = Table(show_edge=False, pad_edge=False)
    tenants = any(r.tenant for r in status.jobs)
    columns = ("ID", "NAME", "TENANT") if tenants else ("ID", "NAME")
    numbers = ("PRI", "GPU-S", "FAIR", "LENT", "BORROWED", "QUEUE")
    for name in (*columns, "STATE", "PRI", "GPUS", "STEPS", "GPU-S", "FAIR", "LENT", "BORROWED", "QUEUE", "USER"):
        table.add_column(name, justify="right" if name in numbers else "left")
    for r in status.jobs:
        table.add_row(
            *((r.id, r.name, r.tenant or "-") if tenants else (r.id, r.name)),
            r.state + (f" ({r.error})" if r.error else ""),
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
    console.print(table)
