"""Simulator layer: results as JSON and as a side-by-side console table."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlix.metrics import RunMetrics
from rlix.sim.alone import slowdowns as slowdowns_of

RESULTS_FORMAT = "rlix-results"

# (key, label, format) rows of the console table, in the brief's vocabulary.
ROWS = (
    ("makespan_s", "makespan (s)", "{:,.0f}"),
    ("makespan_lower_bound_s", "  lower bound (s)", "{:,.0f}"),
    ("gpu_utilization", "gpu_utilization", "{:.3f}"),
    ("idle_fraction", "idle_fraction", "{:.3f}"),
    ("held_idle_fraction", "held_idle_fraction", "{:.3f}"),
    ("switch_overhead_fraction", "switch_overhead_fraction", "{:.3f}"),
    ("stranded_fraction", "stranded_fraction", "{:.3f}"),
    ("throughput_steps_per_hour", "throughput_steps_per_hour", "{:.2f}"),
    ("trajectories_per_hour", "trajectories_per_hour", "{:,.0f}"),
    ("tasks_per_hour", "tasks_per_hour", "{:.2f}"),
    ("mean_jct_s", "mean jct_s", "{:,.0f}"),
    ("queue_delay_mean_s", "queue_delay_mean_s", "{:,.0f}"),
    ("preemptions", "preemptions", "{:,}"),
    ("trajectories_requeued", "trajectories_requeued", "{:,}"),
    ("trajectories_lost", "trajectories_lost", "{:,}"),
    ("plans", "plans", "{:,}"),
)


Alone = dict[str, dict[str, float]]  # policy -> job -> its JCT replayed alone (rlix.sim.alone)


def results_json(trace_name: str, source: str, gpus: int, runs: dict[str, RunMetrics], alone: Alone | None = None) -> dict:
    """The runs as JSON; with ``alone``, each job also carries ``alone_jct_s`` and ``slowdown`` (JCT over it)."""
    policies = {name: run.to_json() for name, run in runs.items()}
    for name, jcts in (alone or {}).items():
        for pid, job in policies[name]["pipelines"].items():
            job["alone_jct_s"] = jcts[pid]
            job["slowdown"] = job["jct_s"] / jcts[pid] if jcts[pid] else None
    return {"format": RESULTS_FORMAT, "version": 1, "trace": trace_name, "source": source, "gpus": gpus, "policies": policies}


def write_json(data: dict, path: str | Path) -> None:
    # sort_keys + repr floats: the same run writes the same bytes.
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _value(run: RunMetrics, key: str):
    if key == "mean_jct_s":
        jcts = [p.jct_s for p in run.pipelines.values()]
        return sum(jcts) / len(jcts) if jcts else 0.0
    return getattr(run, key)


def print_table(console: Console, title: str | Text, runs: dict[str, RunMetrics], alone: Alone | None = None) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for name in runs:
        table.add_column(name, justify="right")
    for key, label, fmt in ROWS:
        table.add_row(label, *(fmt.format(_value(run, key)) for run in runs.values()))
    if "static" in runs and len(runs) > 1:
        base = runs["static"].throughput_steps_per_hour
        table.add_row(
            "throughput vs static", *(f"{r.throughput_steps_per_hour / base:.2f}x" if base else "-" for r in runs.values())
        )
    console.print(table)
    _per_pipeline(
        console,
        "per pipeline: jct_s / step latency p50 / p99 (s)",
        runs,
        lambda p: f"{p.jct_s:,.0f} / {p.step_latency_p50_s:,.0f} / {p.step_latency_p99_s:,.0f}",
    )
    if alone:
        slowdowns = {name: slowdowns_of(run, alone[name]) for name, run in runs.items()}
        table = Table(title="per pipeline: slowdown (JCT over its JCT replayed alone on the same GPUs)", title_justify="left")
        table.add_column("pipeline")
        for name in runs:
            table.add_column(name, justify="right")
        for pid in next(iter(runs.values())).pipelines:
            table.add_row(Text(pid), *(f"{slowdowns[name][pid]:.2f}x" if pid in slowdowns[name] else "-" for name in runs))
        table.add_row(
            "worst / mean",
            *(f"{max(s.values()) / (sum(s.values()) / len(s)):.2f}x" if s else "-" for s in slowdowns.values()),
        )
        console.print(table)
    _per_pipeline(
        console,
        "per pipeline: GPU-seconds used / lent (its home, held by others) / borrowed (outside its home)",
        runs,
        lambda p: f"{p.gpu_seconds_used:,.0f} / {p.gpu_seconds_lent:,.0f} / {p.gpu_seconds_borrowed:,.0f}",
    )
    first = next(iter(runs.values()))
    if first.tenants:
        tenants = Table(title="per tenant: jobs, GPU-seconds used / lent / borrowed", title_justify="left")
        tenants.add_column("tenant")
        for name in runs:
            tenants.add_column(name, justify="right")
        for name in first.tenants:
            cells = [run.tenants[name] for run in runs.values()]
            tenants.add_row(
                Text(name),
                *(
                    f"{t.jobs}: {t.gpu_seconds_used:,.0f} / {t.gpu_seconds_lent:,.0f} / {t.gpu_seconds_borrowed:,.0f}"
                    for t in cells
                ),
            )
        console.print(tenants)


def _per_pipeline(console: Console, title: str, runs: dict[str, RunMetrics], cell) -> None:
    """One row per pipeline, one column per run: ``cell(PipelineMetrics)``."""
    jobs = Table(title=title, title_justify="left")
    jobs.add_column("pipeline")
    for name in runs:
        jobs.add_column(name, justify="right")
    for pid in next(iter(runs.values())).pipelines:
        jobs.add_row(Text(pid), *(cell(run.pipelines[pid]) for run in runs.values()))
    console.print(jobs)
