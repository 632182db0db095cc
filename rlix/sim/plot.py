"""Simulator layer: pictures of a replay (matplotlib, headless).

For each policy: a GPU-by-time chart coloured by pipeline (rollout lighter,
gang stages full colour, switching grey, held-but-idle pale) and GPU
utilization over time. Segments are rasterised onto a time grid so a
1,024-GPU replay draws as fast as a small one.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from rlix.metrics import Activity, UsageRecorder

BINS = 800  # time columns of the raster
SWITCH_RGB = np.array([0.55, 0.55, 0.55])
FREE_RGB = np.array([1.0, 1.0, 1.0])


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
        a, b = int(start * scale), int(np.ceil(end * scale))
        b = max(b, a + 1)
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


def plot_runs(runs: dict[str, tuple[UsageRecorder, float]], pipelines: list[str], path: str | Path, title: str) -> None:
    """``runs``: policy -> (usage with segments, makespan seconds)."""
    n = len(runs)
    longest = max(m for _, m in runs.values())
    fig, axes = plt.subplots(2 * n, 1, figsize=(12, 3.6 * n + 1.5), gridspec_kw={"height_ratios": [3, 1] * n}, squeeze=False)
    for i, (policy, (usage, makespan)) in enumerate(runs.items()):
        img, util = raster(usage, makespan, pipelines)
        ax, ux = axes[2 * i][0], axes[2 * i + 1][0]
        hours = makespan / 3600
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, hours, usage.num_gpus, 0))
        ax.set_xlim(0, longest / 3600)
        ax.set_ylabel("GPU")
        ax.set_title(f"{policy}: makespan {makespan:,.0f} s, mean utilization {util.mean():.2f}", loc="left", fontsize=10)
        t = np.linspace(0, hours, len(util))
        ux.fill_between(t, util, step="mid", alpha=0.6)
        ux.set_xlim(0, longest / 3600)
        ux.set_ylim(0, 1.02)
        ux.set_ylabel("utilization")
        ux.set_xlabel("hours")
    colours = palette(pipelines)
    handles = [Patch(color=colours[pid], label=pid) for pid in pipelines[:20]]
    handles += [Patch(color=SWITCH_RGB, label="switching"), Patch(facecolor="white", edgecolor="grey", label="free")]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=2)
    fig.suptitle(f"{title}  (rollout lighter, training/log-probs full colour, held-idle pale)", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 0.85, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
