"""Shared layer: pictures of a replay (matplotlib, headless).

For each policy: a GPU-by-time chart coloured by pipeline (rollout lighter,
gang stages full colour, switching grey, held-but-idle pale) and GPU
utilization over time, on one time axis in seconds, minutes or hours as the
longest run suits, with each GPU's label in the middle of its band. Segments are rasterised onto a time grid so a
1,024-GPU replay draws as fast as a small one.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from rlix.config import unwritable
from rlix.metrics import Activity, UsageRecorder

BINS = 800  # time columns of the raster
SWITCH_RGB = np.array([0.55, 0.55, 0.55])
FREE_RGB = np.array([1.0, 1.0, 1.0])


def literal(text: str) -> str:
    """``text`` (a job id, a trace name: the user's) as matplotlib draws it, never as mathtext between ``$``s."""
    return text.replace("$", r"\$")


def palette(pipelines: list[str]) -> dict[str, np.ndarray]:
    """A colour per pipeline, never grey (grey means switching)."""
    cmap = plt.get_cmap("tab20")
    usable = [cmap(i)[:3] for i in list(range(0, 20, 2)) + list(range(1, 20, 2)) if i not in (14, 15)]
    return {pid: np.array(usable[i % len(usable)]) for i, pid in enumerate(pipelines)}


def raster(usage: UsageRecorder, makespan: float, pipelines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(RGB image [gpus, BINS, 3], work fraction per bin [BINS])."""
    gpus = usage.num_gpus
    colours = palette(pipelines)
    img = np.ones((gpus, BINS, 3))
    work = np.zeros((gpus, BINS))
    scale = BINS / max(makespan, 1e-9)
    for g, start, end, act, pid, stage in usage.segments:
        # bins [a, b) inside the raster: end x scale can round past BINS at the makespan itself
        a = min(int(start * scale), BINS - 1)
        b = min(max(int(np.ceil(end * scale)), a + 1), BINS)
        if act is Activity.SWITCH:
            rgb = SWITCH_RGB
        else:
            base = colours.get(pid, SWITCH_RGB)
            if act is Activity.HELD:
                rgb = 1 - 0.25 * (1 - base)
            elif stage == "rollout":
                rgb = 1 - 0.6 * (1 - base)
            else:
                rgb = base
        img[g, a:b] = rgb
        if act is Activity.WORK:
            # fraction of each bin the segment covers
            cover = np.clip(np.minimum(end * scale, np.arange(a, b) + 1) - np.maximum(start * scale, np.arange(a, b)), 0, 1)
            work[g, a:b] += cover
    return img, np.clip(work, 0, 1).mean(axis=0)


# (unit, seconds per unit, the longest span it is used for): seconds under 3 minutes, minutes under 3 hours
TIME_UNITS = (("s", 1.0, 180.0), ("min", 60.0, 3 * 3600.0), ("h", 3600.0, float("inf")))
MAX_GPU_LABELS = 8


def time_unit(span_s: float) -> tuple[str, float]:
    """(unit name, seconds per unit) that a time axis spanning ``span_s`` seconds reads best in."""
    return next((name, per) for name, per, below in TIME_UNITS if span_s < below)


def gpu_ticks(num_gpus: int) -> list[int]:
    """GPUs to label: every one up to 8, else every 2**k-th so at most 8 labels (0, 128, ... for 1,024)."""
    step = 1
    while num_gpus > step * MAX_GPU_LABELS:
        step *= 2
    return list(range(0, num_gpus, step))


def _span(seconds: float, unit: str, per: float) -> str:
    """A duration in the axis' unit, with its seconds when that unit is not seconds."""
    return f"{seconds:,.0f} s" if per == 1.0 else f"{seconds / per:,.1f} {unit} ({seconds:,.0f} s)"


def _draw_run(ax, ux, usage: UsageRecorder, makespan: float, pipelines: list[str], axis: tuple[str, float, float]) -> float:
    """One run's GPU-by-time chart on ``ax`` and its utilization on ``ux``; ``axis``: (unit, seconds per unit, x limit).
    Returns the run's mean utilization."""
    unit, per, right = axis
    img, util = raster(usage, makespan, pipelines)
    gpus = usage.num_gpus
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, makespan / per, gpus, 0))
    ticks = gpu_ticks(gpus)
    ax.set_yticks([g + 0.5 for g in ticks], [str(g) for g in ticks], fontsize=8)  # GPU g is the band [g, g + 1]: its middle
    ax.set_ylabel("GPU")
    t = np.linspace(0, makespan / per, len(util))
    ux.fill_between(t, util, step="mid", alpha=0.6)
    ux.set_ylim(0, 1.02)
    ux.set_ylabel("utilization")
    ux.set_xlabel(f"time ({unit})")
    for a in (ax, ux):
        a.set_xlim(0, right)
    return float(util.mean())


def runs_figure(runs: dict[str, tuple[UsageRecorder, float]], pipelines: list[str], title: str, span: str = "makespan") -> Figure:
    """``runs``: policy -> (usage with segments, makespan seconds). One time axis for all, in the unit the longest suits;
    ``span``: what each run's length is called (a live scheduler's is how long it has been up)."""
    n = len(runs)
    longest = max(m for _, m in runs.values())
    unit, per = time_unit(longest)
    right = max(longest / per, 1e-9)  # a run of no length still gets an axis
    fig, axes = plt.subplots(2 * n, 1, figsize=(12, 3.6 * n + 1.5), gridspec_kw={"height_ratios": [3, 1] * n}, squeeze=False)
    for i, (policy, (usage, makespan)) in enumerate(runs.items()):
        ax, ux = axes[2 * i][0], axes[2 * i + 1][0]
        util = _draw_run(ax, ux, usage, makespan, pipelines, (unit, per, right))
        ax.set_title(f"{policy}: {span} {_span(makespan, unit, per)}, GPUs working {util:.2f}", loc="left", fontsize=10)
    colours = palette(pipelines)
    handles = [Patch(color=colours[pid], label=literal(pid)) for pid in pipelines[:20]]
    handles += [Patch(color=SWITCH_RGB, label="switching"), Patch(facecolor="white", edgecolor="grey", label="free")]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=2)
    legend = "rollout lighter, training/log-probs full colour, held-idle pale"
    fig.suptitle(f"{literal(title)}  ({legend})", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 0.85, 0.97))
    return fig


def figure_path(path: str | Path) -> Path:
    """Where a figure asked for at ``path`` is written: a PNG where the name has no suffix."""
    path = Path(path)
    return path if path.suffix else path.with_suffix(".png")


def figure_problem(path: str | Path) -> str | None:
    """Why a figure could not be written at ``path`` (as :func:`figure_path` names it), or None:
    asked before any work, so that a run's figure is not lost at its end."""
    if not str(path).strip():
        return "is empty; give a path"
    written = figure_path(path)
    if written.suffix[1:].lower() not in FigureCanvasBase.get_supported_filetypes():
        return f"matplotlib cannot write '{written.suffix}'; end the name in .png, .svg or .pdf"
    return unwritable(written)


def plot_runs(
    runs: dict[str, tuple[UsageRecorder, float]], pipelines: list[str], path: str | Path, title: str, span: str = "makespan"
) -> Path:
    """Write :func:`runs_figure` at ``path`` (:func:`figure_path`); the path written."""
    path = figure_path(path)
    fig = runs_figure(runs, pipelines, title, span)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path
