"""Simulator layer: a sweep's picture (matplotlib, headless) and its console summary.

The picture has one panel per knob (rows) and policy (columns): makespan /
lower bound against the knob's values, one colour per trace, every replay a
point (seeds, and the other knobs' values) and a line through their mean.
The y axis is shared, so panels compare at a glance; 1.0 is the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlix.plot import literal
from rlix.sim.report import write_json
from rlix.sim.sweep import Knob, SweepRow, sweep_csv, sweep_json

KNOB_AXIS = 2  # where the knobs' positions start in a row's sort key (after trace and policy)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def trace_labels(names: dict[str, str]) -> dict[str, str]:
    """Each trace file's label, from its trace's name (file -> name): the name, or the file where two
    files hold traces of one name."""
    shared = {n for n in names.values() if list(names.values()).count(n) > 1}
    return {source: source if name in shared else name for source, name in names.items()}


def plot_sweep(rows: list[SweepRow], knobs: Sequence[Knob], policies: Sequence[str], path: str | Path) -> None:
    sources = list(dict.fromkeys(r.source for r in rows))
    names = trace_labels({r.source: r.trace for r in rows})
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(sources)}
    ncols, nrows = len(policies), len(knobs)
    fig, axes = plt.subplots(
        nrows, ncols, squeeze=False, sharey=True, figsize=(max(6.0, 4.4 * ncols), 3.4 * nrows + 1.2), layout="constrained"
    )
    for k, knob in enumerate(knobs):
        for p, policy in enumerate(policies):
            ax = axes[k][p]
            for t, source in enumerate(sources):
                offset = 0.08 * (t - (len(sources) - 1) / 2)  # traces side by side, 0.08 of a step apart
                picked = [r for r in rows if r.policy == policy and r.source == source]
                by_value: dict[int, list[float]] = {}
                for r in picked:
                    by_value.setdefault(r.sort_key[KNOB_AXIS + k], []).append(r.makespan_over_bound)
                xs = sorted(by_value)
                for x in xs:
                    ax.scatter([x + offset] * len(by_value[x]), by_value[x], s=16, color=colours[source], alpha=0.55, lw=0)
                ax.plot(
                    [x + offset for x in xs],
                    [_mean(by_value[x]) for x in xs],
                    color=colours[source],
                    lw=1.8,
                    label=literal(names[source]),
                )
            ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
            ax.set_xticks(range(len(knob.values)), knob.values)
            ax.set_xlim(-0.5, len(knob.values) - 0.5)
            ax.set_xlabel(knob.name)
            ax.set_title(policy, fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        axes[k][0].set_ylabel("makespan / lower bound")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("makespan / lower bound per knob value\n(points: each replay; line: their mean; dashed: the bound)", fontsize=10)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(console: Console, rows: list[SweepRow], knobs: Sequence[Knob]) -> None:
    """Per trace, policy and knob values: the mean over seeds of makespan / bound, utilization and the worst JCT."""
    groups: dict[tuple, list[SweepRow]] = {}
    for r in rows:  # rows are sorted, seeds last: a group's rows are consecutive
        groups.setdefault((r.source, r.policy, r.sort_key[KNOB_AXIS:-2]), []).append(r)
    labels = trace_labels({r.source: r.trace for r in rows})
    table = Table(title="sweep: mean over seeds", title_justify="left")
    for header in ("trace", "policy", *(k.name for k in knobs), "replays", "makespan/bound", "gpu_util", "worst jct (s)"):
        table.add_column(header, justify="left" if header in ("trace", "policy") else "right")
    for group in groups.values():
        first = group[0]
        table.add_row(
            Text(labels[first.source]),
            first.policy,
            *(Text(str(v)) for _, v in first.knobs),
            str(len(group)),
            f"{_mean([r.makespan_over_bound for r in group]):.3f}",
            f"{_mean([r.gpu_utilization for r in group]):.3f}",
            f"{_mean([r.max_jct_s for r in group]):,.0f}",
        )
    console.print(table)


def write_outputs(out_dir: Path, knobs, seeds, policies, rows: list[SweepRow]) -> list[Path]:
    """The sweep's table (CSV, JSON) and its plot in ``out_dir``."""
    paths = [out_dir / "sweep.csv", out_dir / "sweep.json", out_dir / "sweep.png"]
    paths[0].write_text(sweep_csv(rows))
    write_json(sweep_json(knobs, seeds, policies, rows), paths[1])
    plot_sweep(rows, knobs, policies, paths[2])
    return paths
