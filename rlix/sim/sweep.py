"""Simulator layer: a grid of replays run in parallel on Ray (``rlix-sim sweep``).

Every combination of traces x knob values x seeds x policies is one replay,
and each replay is one Ray task running :func:`run_cell`, the same function a
single process would call, so a cell's numbers do not depend on where it ran.
Rows come back in the order they finish and are sorted by the grid's own
order before anything is written, so the same sweep writes the same bytes.
Ray is imported only here, when the sweep runs (the ``exec`` extra).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from rlix.config import read_document
from rlix.metrics import RunMetrics
from rlix.ray_runtime import worker_pythonpath
from rlix.sim.simulator import replay, replay_refusal
from rlix.trace import Trace, TraceError, parse_trace

SWEEP_FORMAT = "rlix-sweep"
KnobValue = float | bool | None  # a scheduler knob's value once validated (heartbeat_s may be None)


class SweepError(ValueError):
    """A sweep that cannot run as asked; the message is one line naming the flag and the fix."""


@dataclass(frozen=True, kw_only=True)
class Knob:
    """A scheduler knob and the values to try, as given on the command line."""

    name: str
    values: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One replay of the grid; ``at`` is its position per axis (trace, policy, each knob, seed), the sort key."""

    index: int  # position in the whole grid: unique
    source: str  # the trace's path as given
    policy: str
    seed: int | None  # None: the trace's own seeds
    knobs: tuple[tuple[str, str], ...]  # (knob, value as given)
    at: tuple[int, ...]

    def sort_key(self) -> tuple[int, ...]:
        return (*self.at, self.index)

    def trace(self, text: str) -> Trace:
        """The trace this cell replays, from the trace file's text: reseeded, then its knobs set."""
        trace = parse_trace(json.loads(text), source=self.source)
        if self.seed is not None:
            trace = trace.reseeded(self.seed)
        return trace.with_scheduler(dict(self.knobs)) if self.knobs else trace


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One replay's result: where it sits in the grid and the metrics that say how it went."""

    index: int
    sort_key: tuple[int, ...]
    trace: str
    source: str
    policy: str
    seed: int | None
    knobs: tuple[tuple[str, KnobValue], ...]  # (knob, validated value)
    makespan_s: float
    makespan_lower_bound_s: float
    makespan_over_bound: float  # makespan / its lower bound (1.0 is the limit)
    gpu_utilization: float
    slot_utilization: float
    idle_fraction: float
    switch_overhead_fraction: float
    stranded_fraction: float
    throughput_steps_per_hour: float
    mean_jct_s: float
    max_jct_s: float  # the worst job's JCT
    max_jct_pipeline: str
    queue_delay_mean_s: float
    preemptions: int
    trajectories_lost: int
    plans: int

    def columns(self) -> dict[str, object]:
        """The row as flat columns: grid position, each knob by name, then the metrics."""
        out: dict[str, object] = {"trace": self.trace, "source": self.source, "policy": self.policy, "seed": self.seed}
        out.update(self.knobs)
        out.update((name, getattr(self, name)) for name in METRICS)
        return out


GRID_FIELDS = ("index", "sort_key", "trace", "source", "policy", "seed", "knobs")
METRICS = tuple(f.name for f in fields(SweepRow) if f.name not in GRID_FIELDS)  # the metric columns, in order


def run_cell(cell: Cell, text: str) -> SweepRow:
    """Replay one cell (this is the Ray task's body; a single process calls it the same way)."""
    trace = cell.trace(text)
    return to_row(cell, trace, replay(trace, cell.policy))


def to_row(cell: Cell, trace: Trace, run: RunMetrics) -> SweepRow:
    jcts = sorted((p.jct_s, pid) for pid, p in run.pipelines.items())
    scheduler = trace.model.scheduler
    return SweepRow(
        index=cell.index,
        sort_key=cell.sort_key(),
        trace=trace.model.name or Path(cell.source).stem,
        source=cell.source,
        policy=cell.policy,
        seed=cell.seed,
        knobs=tuple((name, getattr(scheduler, name)) for name, _ in cell.knobs),
        makespan_s=run.makespan_s,
        makespan_lower_bound_s=run.makespan_lower_bound_s,
        makespan_over_bound=run.makespan_s / run.makespan_lower_bound_s if run.makespan_lower_bound_s > 0 else 0.0,
        gpu_utilization=run.gpu_utilization,
        slot_utilization=run.slot_utilization,
        idle_fraction=run.idle_fraction,
        switch_overhead_fraction=run.switch_overhead_fraction,
        stranded_fraction=run.stranded_fraction,
        throughput_steps_per_hour=run.throughput_steps_per_hour,
        mean_jct_s=sum(j for j, _ in jcts) / len(jcts),
        max_jct_s=jcts[-1][0],
        max_jct_pipeline=jcts[-1][1],
        queue_delay_mean_s=run.queue_delay_mean_s,
        preemptions=run.preemptions,
        trajectories_lost=run.trajectories_lost,
        plans=run.plans,
    )


# ------------------------------------------------------------------ the grid


def parse_knob(text: str) -> Knob:
    name, sep, values = text.partition("=")
    parts = tuple(v.strip() for v in values.split(","))
    if not sep or not name or not all(parts):
        raise SweepError(f"--knob {text}: write NAME=V1,V2,..., e.g. --knob small_first=0,1,3")
    if len(set(parts)) != len(parts):
        raise SweepError(f"--knob {name}: a value is given twice; list each value once")
    return Knob(name=name, values=parts)


MAX_SEEDS = 10_000  # more replays than any sweep runs; "0-100000000" would fill the memory first


def parse_seeds(text: str | None) -> tuple[int | None, ...]:
    """``--seeds``: whole numbers and inclusive ranges separated by commas (``0,1,2``, ``0-7``, ``0-3,8``)."""
    if text is None:
        return (None,)
    seeds: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo and dash:
            raise SweepError(f"--seeds {text}: seeds are whole numbers >= 0; drop the minus sign")
        bounds = (lo.strip(), hi.strip() if dash else lo.strip())
        # int() would also take 1_000, +3 and other scripts' digits, and refuses past 4,300 digits
        if not all(b.isascii() and b.isdigit() and len(b) <= 30 for b in bounds):
            raise SweepError(f"--seeds {text}: write whole numbers or ranges separated by commas, e.g. --seeds 0,1,2 or 0-7")
        first, last = map(int, bounds)
        if last < first:
            raise SweepError(f"--seeds {text}: '{part.strip()}' runs backwards; write the lower seed first, e.g. 0-7")
        if len(seeds) + last - first + 1 > MAX_SEEDS:  # counted before the range is made: no int too large for it
            raise SweepError(f"--seeds {text}: more than {MAX_SEEDS:,} seeds; sweep fewer")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds {text}: a seed is given twice; list each seed once")
    return tuple(seeds)


def grid(sources: Sequence[str], knobs: Sequence[Knob], seeds: Sequence[int | None], policies: Sequence[str]) -> list[Cell]:
    """Every combination, in the grid's order (trace, policy, each knob's values, seed)."""
    axes = [list(enumerate(sources)), list(enumerate(policies))]
    axes += [list(enumerate(k.values)) for k in knobs]
    axes.append(list(enumerate(seeds)))
    cells = []
    for index, combo in enumerate(itertools.product(*axes)):
        (ti, source), (pi, policy), *knob_values, (si, seed) = combo
        cells.append(
            Cell(
                index=index,
                source=source,
                policy=policy,
                seed=seed,
                knobs=tuple((k.name, v) for k, (_, v) in zip(knobs, knob_values)),
                at=(ti, pi, *(i for i, _ in knob_values), si),
            )
        )
    return cells


def load_texts(
    sources: Sequence[str], knobs: Sequence[Knob], seeds: Sequence[int | None] = (None,), policies: Sequence[str] = ()
) -> dict[str, str]:
    """Each trace file's text, once every trace is valid with every combination of knob values, draws its
    streams under every seed and places every job under every policy (checked before Ray starts, as a
    replay checks them before it runs)."""
    if len({Path(s).resolve() for s in sources}) != len(sources):
        raise SweepError("TRACE: a trace is named twice; name each once")
    texts = {}
    for source in sources:
        raw = read_document(source, "json", TraceError, "a trace JSON (see traces/)")
        trace = parse_trace(raw, source=source)
        if any(s is not None for s in seeds) and not trace.drawn:
            raise SweepError(f"--seeds: {source} writes every step out, so no seed redraws it; drop --seeds or this trace")
        for seed in seeds:
            drawn = trace if seed is None else trace.reseeded(seed)
            if (refusal := replay_refusal(drawn, list(policies))) is not None:
                raise SweepError(refusal if seed is None else f"--seeds {seed}: {refusal}")
        read: dict[tuple[str, str], str] = {}  # (knob, value as read) -> the first value given that reads so
        for combo in itertools.product(*([(k.name, v) for v in k.values] for k in knobs)):
            try:
                scheduler = trace.with_scheduler(dict(combo)).model.scheduler
            except TraceError as e:
                raise SweepError(f"--knob {' '.join(f'{n}={v}' for n, v in combo)}: {source}: {e}") from None
            for name, given in combo:  # two spellings of one value (0 and 0.0, true and yes) replay one cell twice
                if not isinstance(getattr(scheduler, name), int | float | bool | None):
                    raise SweepError(
                        f"--knob {name}: a sweep varies knobs that are numbers or true/false; set {name} in the trace"
                    )
                same = read.setdefault((name, repr(getattr(scheduler, name))), given)
                if same != given:
                    raise SweepError(f"--knob {name}: {same} and {given} are the same value; list each value once")
        texts[source] = Path(source).read_text()
    return texts


def sorted_rows(rows: list[SweepRow]) -> list[SweepRow]:
    return sorted(rows, key=lambda r: r.sort_key)


# ------------------------------------------------------------------ Ray


def run_on_ray(
    cells: list[Cell], texts: dict[str, str], address: str | None, on_done: Callable[[SweepRow], None]
) -> list[SweepRow]:
    """Each cell as one Ray task on a local Ray this call starts (or the cluster at ``address``); rows sorted."""
    import ray

    from rlix.ray_runtime import init_local_ray

    # Ray's INFO lines ("Started a local Ray instance") would break up the progress bar; its warnings still show.
    common = {
        "runtime_env": {"env_vars": {"PYTHONPATH": worker_pythonpath()}},
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if address:
        ray.init(address=address, **common)
    else:
        # address="local": a new cluster of our own, even where `ray start` left one that ray.init() would join.
        init_local_ray(num_cpus=os.cpu_count(), include_dashboard=False, **common)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_cell)
        refs = {source: ray.put(text) for source, text in sorted(texts.items())}
        pending = {task.remote(cell, refs[cell.source]): cell for cell in cells}
        rows = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                del pending[ref]
                rows.append(ray.get(ref))
                on_done(rows[-1])
    finally:
        ray.shutdown()
    return sorted_rows(rows)


# ------------------------------------------------------------------ outputs


def sweep_json(knobs: Sequence[Knob], seeds: Sequence[int | None], policies: Sequence[str], rows: list[SweepRow]) -> dict:
    return {
        "format": SWEEP_FORMAT,
        "version": 1,
        "traces": list(dict.fromkeys(r.source for r in rows)),
        "policies": list(policies),
        "seeds": list(seeds),
        "knobs": {k.name: list(k.values) for k in knobs},
        "rows": [r.columns() for r in rows],
    }


def sweep_csv(rows: list[SweepRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(rows[0].columns())
    for r in rows:
        writer.writerow("" if v is None else repr(v) if isinstance(v, float) else v for v in r.columns().values())
    return out.getvalue()
