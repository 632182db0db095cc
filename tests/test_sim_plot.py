"""The replay plot: its time axis in a unit that suits the run, each GPU's label in the middle of its band.

Figures are built headless (Agg) and read back from matplotlib's Axes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from rlix.metrics import Activity, UsageRecorder
from rlix.plot import gpu_ticks, plot_runs, runs_figure, time_unit


def _usage(num_gpus: int, makespan: float) -> UsageRecorder:
    """Pipeline a works on the first half of the GPUs, then b switches in and works on all of them."""
    rec = UsageRecorder(num_gpus)
    half = range(num_gpus // 2 or 1)
    rec.set(half, 0.0, Activity.WORK, "a", "rollout")
    rec.set(range(num_gpus), makespan / 2, Activity.SWITCH, "b")
    rec.set(range(num_gpus), makespan * 0.6, Activity.WORK, "b", "actor_train")
    rec.close(makespan)
    return rec


@pytest.fixture
def figure():
    figs = []

    def build(num_gpus: int, makespan: float, policies=("static", "rlix")):
        runs = {p: (_usage(num_gpus, makespan * (1 + i)), makespan * (1 + i)) for i, p in enumerate(policies)}
        fig = runs_figure(runs, ["a", "b"], "test")
        figs.append(fig)
        return fig

    yield build
    for fig in figs:
        plt.close(fig)


@pytest.mark.parametrize(
    ("span_s", "unit", "per"),
    [(0.0, "s", 1.0), (120.0, "s", 1.0), (179.9, "s", 1.0), (180.0, "min", 60.0), (7_000.0, "min", 60.0)]
    + [(3 * 3600.0, "h", 3600.0), (40 * 3600.0, "h", 3600.0)],
)
def test_time_unit_suits_the_span(span_s, unit, per):
    assert time_unit(span_s) == (unit, per)


def test_a_two_minute_run_is_drawn_in_seconds(figure):
    fig = figure(8, 60.0)  # static 60 s, rlix 120 s: one axis to the longest
    axes = fig.axes
    assert len(axes) == 4
    for ux in axes[1::2]:
        assert ux.get_xlabel() == "time (s)"
    for ax in axes:
        assert ax.get_xlim() == pytest.approx((0.0, 120.0))
    # the image spans the run's own makespan in the axis' unit
    assert axes[0].images[0].get_extent()[:2] == pytest.approx([0.0, 60.0])
    assert axes[2].images[0].get_extent()[:2] == pytest.approx([0.0, 120.0])
    assert "makespan 120 s" in axes[2].get_title(loc="left")


def test_medium_and_long_runs_are_drawn_in_minutes_and_hours(figure):
    medium = figure(8, 1_800.0)  # the longest run is 3,600 s
    assert medium.axes[1].get_xlabel() == "time (min)"
    assert medium.axes[0].get_xlim() == pytest.approx((0.0, 60.0))
    assert "makespan 60.0 min (3,600 s)" in medium.axes[2].get_title(loc="left")
    long = figure(8, 18_000.0, policies=("rlix",))
    assert long.axes[1].get_xlabel() == "time (h)"
    assert long.axes[0].get_xlim() == pytest.approx((0.0, 5.0))
    assert long.axes[0].images[0].get_extent()[:2] == pytest.approx([0.0, 5.0])


def test_gpu_labels_sit_in_the_middle_of_their_bands(figure):
    ax = figure(8, 60.0).axes[0]
    left, right, bottom, top = ax.images[0].get_extent()
    assert (bottom, top) == (8, 0)  # GPU g is drawn as the band [g, g + 1], GPU 0 at the top
    assert list(ax.get_yticks()) == pytest.approx([g + 0.5 for g in range(8)])
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(g) for g in range(8)]
    # a label's text sits at its tick, in the middle of the band it names (data y g + 0.5 on screen)
    fig = ax.figure
    fig.canvas.draw()
    for g, label in zip(range(8), ax.get_yticklabels()):
        y = label.get_window_extent().transformed(ax.transData.inverted())
        assert (y.y0 + y.y1) / 2 == pytest.approx(g + 0.5, abs=0.15)  # an edge would be 0.5 off
    assert ax.get_ylabel() == "GPU"


def test_gpu_labels_are_thinned_for_large_clusters(figure):
    assert gpu_ticks(8) == list(range(8))
    assert gpu_ticks(16) == list(range(0, 16, 2))
    assert gpu_ticks(32) == list(range(0, 32, 4))
    assert gpu_ticks(1024) == list(range(0, 1024, 128))
    assert gpu_ticks(1) == [0]
    ax = figure(1024, 600.0, policies=("rlix",)).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(g) for g in range(0, 1024, 128)]
    assert list(ax.get_yticks()) == pytest.approx([g + 0.5 for g in range(0, 1024, 128)])


def test_plot_runs_writes_a_png(tmp_path):
    path = tmp_path / "r.png"
    plot_runs({"rlix": (_usage(4, 90.0), 90.0)}, ["a", "b"], path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums()  # the figure is closed once written


def test_a_segment_ending_at_a_makespan_whose_last_bin_rounds_past_the_raster_is_drawn():
    from rlix.plot import BINS, raster

    makespan = 45.425028562545776  # BINS / makespan x makespan rounds to just above BINS
    assert makespan * (BINS / makespan) > BINS
    usage = UsageRecorder(1)
    usage.set((0,), makespan - 0.1, Activity.WORK, "a", "rollout")
    usage.close(makespan)
    img, util = raster(usage, makespan, ["a"])
    assert img.shape[1] == BINS and util[-1] > 0  # the last bin holds the segment's work
