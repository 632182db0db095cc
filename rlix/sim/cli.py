"""Simulator layer: the ``rlix-sim`` command.

    rlix-sim replay traces/mixed_agentic.json            # every policy, side by side
    rlix-sim replay TRACE --policy rlix --json out.json --plot out.png
    rlix-sim generate mixed_agentic -o traces/mixed_agentic.json
    rlix-sim whatif TRACE --add JOB.json --at 600      # one more job: every JCT before and after
    rlix-sim sweep TRACE ... --knob small_first=0,3 --seeds 0,1 --out sweep/   # a grid of replays on Ray
    rlix-sim validate TRACE
    rlix-sim schema

User errors print one line on stderr and exit 2; there is no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from rlix.config import overwrites, ray_address, unwritable
from rlix.core import POLICIES
from rlix.metrics import RunMetrics
from rlix.sim import scenarios, sweep
from rlix.sim.report import print_table, results_json, write_json
from rlix.trace import MAX_SECONDS, Trace, TraceError, dump_trace, json_schema, load_trace

PROG = "rlix-sim"


class UserError(Exception):
    """Bad input from the user: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + error
        raise UserError(f"{message} (see '{self.prog} --help')")


def _seed(text: str) -> int:
    """A ``--seed`` value: a whole number >= 0 (numpy's generators take no negative seed)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a seed >= 0") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"{seed} is negative; give a seed >= 0")
    return seed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Replay RL training traces through rlix's scheduling policies.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rp = sub.add_parser("replay", help="replay a trace under one or more policies and compare them")
    rp.add_argument("trace", help="path of an rlix-trace JSON file")
    rp.add_argument("--json", metavar="PATH", help="write the metrics as JSON")
    rp.add_argument("--plot", metavar="PATH", help="write a PNG: GPU-by-time chart and utilization per policy")
    _add_replay_options(rp)
    rp.add_argument("--quiet", action="store_true", help="no progress bar or table (use with --json)")
    rp.add_argument(
        "--no-alone",
        dest="alone",
        action="store_false",
        help="skip each job's replay alone (its slowdown against running alone on the same GPUs)",
    )

    wp = sub.add_parser("whatif", help="predict a new job's JCT and how every existing job's JCT would change")
    wp.add_argument("trace", help="path of an rlix-trace JSON file")
    wp.add_argument("--add", required=True, metavar="JOB.json", help="one pipeline, written as a pipeline entry of a trace")
    wp.add_argument("--at", type=float, metavar="T", help="the job's arrival (seconds; default: its own arrival_s)")
    _add_replay_options(wp)
    wp.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    wp.add_argument("--quiet", action="store_true", help="no progress or tables (use with --json)")

    sw = sub.add_parser("sweep", help="replay traces x knob values x seeds x policies in parallel on Ray")
    sw.add_argument("traces", nargs="+", metavar="TRACE", help="rlix-trace JSON files")
    sw.add_argument(
        "--knob", action="append", required=True, metavar="NAME=V1,V2,...", help="a scheduler knob and its values (repeatable)"
    )
    sw.add_argument(
        "--seeds",
        default=None,
        metavar="S1,S2,...",
        help="redraw generated streams with each seed, e.g. 0,1,2 or 0-7 (default: the traces' own)",
    )
    sw.add_argument(
        "--policy", action="append", metavar="NAME", help=f"policy to run (repeatable; default: all of {', '.join(POLICIES)})"
    )
    sw.add_argument(
        "--address", type=ray_address, metavar="ADDR", help="join this Ray cluster (default: start a local one for the sweep)"
    )
    sw.add_argument("--out", default="sweep", metavar="DIR", help="folder for sweep.csv, sweep.json, sweep.png (default: sweep/)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar or summary")

    gp = sub.add_parser("generate", help="write a trace for a named scenario")
    gp.add_argument("scenario", help=f"one of: {', '.join(scenarios.SCENARIOS)}")
    gp.add_argument("-o", "--output", metavar="PATH", help="file to write (default: traces/<scenario>.json)")
    gp.add_argument("--seed", type=_seed, default=0, help="seed of the scenario's distributions (default 0)")

    vp = sub.add_parser("validate", help="check a trace and print what it holds")
    vp.add_argument("trace")

    sub.add_parser("schema", help="print the trace JSON Schema")
    return parser


def _add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", action="append", metavar="NAME", help=f"policy to run (repeatable; default: all of {', '.join(POLICIES)})"
    )
    parser.add_argument(
        "--seed", type=_seed, help="redraw every generated stream with this seed (default: the trace's own seeds)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="override a scheduler knob of the trace (repeatable), e.g. --set weight_by_duration=true",
    )


def main(argv: list[str] | None = None) -> int:
    console = Console()
    err = Console(stderr=True)
    try:
        args = build_parser().parse_args(argv)
        commands = {"replay": _replay, "whatif": _whatif, "sweep": _sweep, "generate": _generate, "validate": _validate}
        return {**commands, "schema": _schema}[args.command](args, console, err)
    except (UserError, TraceError, sweep.SweepError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _policies(names: list[str] | None) -> list[str]:
    """The policies asked for (all by default), each known and named once."""
    policies = names or list(POLICIES)
    for name in policies:
        if name not in POLICIES:
            raise UserError(f"--policy {name}: unknown policy; choose from {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        raise UserError("--policy: a policy is named twice; name each once")
    return policies


def _checked_policies(args) -> list[str]:
    """The policies to replay (all by default); bad flags are refused before any work."""
    policies = _policies(args.policy)
    inputs = {"the trace": args.trace, "--add": getattr(args, "add", None)}
    if args.json is not None:
        check_output("--json", args.json, inputs=inputs)
    plot = getattr(args, "plot", None)
    if plot is not None:
        _check_plot(plot, {**inputs, "--json": args.json})
    return policies


@contextlib.contextmanager
def _writing(flag: str, path: str | Path) -> Iterator[None]:
    """Writing an output the checks before the run passed: a failure still gets one line (a full disk)."""
    try:
        yield
    except OSError as e:
        why = e.strerror or e
        raise UserError(
            f"{flag} {path}: not written ({why}); run it again with another path (it gives the same results)"
        ) from None


def _fitting(trace: Trace, policies: list[str]) -> Trace:
    """``trace``, once every job of it can roll out under each of ``policies``."""
    from rlix.sim.simulator import policy_misfit

    if (problem := policy_misfit(trace, policies)) is not None:
        raise UserError(problem)
    return trace


def _check_plot(plot: str, others: dict[str, str | None]) -> None:
    from rlix.plot import figure_path, figure_problem

    if (problem := figure_problem(plot) or overwrites(figure_path(plot), others)) is not None:
        raise UserError(f"--plot {plot}: {problem}")


def check_output(flag: str, path: str | Path, *, folder: bool = False, inputs: dict[str, str | None] | None = None) -> None:
    """Refuse, before any work, an output path that could not be written (its results would be lost), or
    that is one of ``inputs`` (what each names -> its path: it would be overwritten)."""
    problem = unwritable(path, folder=folder) or overwrites(path, inputs or {})
    if problem is not None:
        raise UserError(f"{flag} {path}: {problem}")


def _replay(args, console: Console, err: Console) -> int:
    from rlix.sim.simulator import Simulation

    policies = _checked_policies(args)
    trace = _fitting(_as_asked(load_trace(args.trace), args), policies)
    name = trace.model.name or Path(args.trace).stem
    total = trace.total_trajectories()
    show = not args.quiet
    if show:
        c = trace.cluster
        console.print(
            Text.assemble(
                (name, "bold"),
                f": {c.num_gpus} GPUs ({c.nodes}x{c.gpus_per_node}), {len(trace.pipelines)} pipelines, "
                f"{total:,} trajectories; policies: {', '.join(policies)}",
            )
        )
    runs: dict[str, RunMetrics] = {}
    usages = {}
    for policy in policies:
        started = time.perf_counter()
        with _bar(err, show) as bar:
            task = bar.add_task(f"replaying {policy}", total=total, sim="sim 0 s")

            def progress(now: float, done: int, _total: int, task=task, bar=bar) -> None:
                bar.update(task, completed=done, sim=f"sim {now:,.0f} s")

            sim = Simulation(trace, policy, keep_segments=bool(args.plot), progress=progress)
            runs[policy] = sim.run()
        usages[policy] = (sim.usage, runs[policy].makespan_s)
        if show:
            err.print(f"  {policy}: replayed in {time.perf_counter() - started:.1f} s wall, {runs[policy].plans:,} plans")
    alone = _alone(trace, policies, err, show) if args.alone else None
    if show:
        print_table(console, Text(f"{name} - metrics per policy"), runs, alone)
    if args.json:
        with _writing("--json", args.json):
            write_json(results_json(name, args.trace, trace.cluster.num_gpus, runs, alone), args.json)
        if show:
            console.print(f"wrote {args.json}", markup=False, highlight=False)
    if args.plot:
        from rlix.plot import plot_runs

        with _writing("--plot", args.plot):
            written = plot_runs(usages, [p.id for p in trace.pipelines], args.plot, name)
        if show:
            console.print(f"wrote {written}", markup=False, highlight=False)
    return 0


def _alone(trace: Trace, policies: list[str], err: Console, show: bool) -> dict[str, dict[str, float]]:
    """policy -> job -> its JCT replayed alone under that policy (one replay per job and policy)."""
    from rlix.sim.alone import alone_jcts

    started = time.perf_counter()
    out = {policy: alone_jcts(trace, policy) for policy in policies}
    if show:
        err.print(f"  each job alone: {len(trace.jobs) * len(policies)} replays in {time.perf_counter() - started:.1f} s wall")
    return out


def _as_asked(trace: Trace, args, *, refuse_undrawn: bool = True) -> Trace:
    """``trace`` with the command's ``--seed`` and ``--set`` applied; a seed on a trace it cannot redraw is
    refused unless ``refuse_undrawn`` is False (what-if's base, whose added job the seed may redraw)."""
    if args.seed is not None and trace.drawn:
        trace = trace.reseeded(args.seed)
    elif args.seed is not None and refuse_undrawn:
        raise UserError(f"--seed {args.seed}: {trace.source} writes every step out, so no seed redraws it; drop --seed")
    if args.set:
        trace = trace.with_scheduler(_knobs(args.set))
    return trace


def _whatif(args, console: Console, err: Console) -> int:
    from rlix.sim.whatif import add_job, load_job, print_whatif, whatif, whatif_json

    policies = _checked_policies(args)
    if args.at is not None and not 0 <= args.at <= MAX_SECONDS:
        limit = f"{MAX_SECONDS:g}"
        raise UserError(f"--at {args.at:g}: an arrival is seconds from the trace's start; give a number from 0 to {limit}")
    base = load_trace(args.trace)
    job = load_job(args.add, args.at)
    with_job = add_job(base, job, args.add)
    if args.seed is not None and not with_job.drawn:
        both = f"{args.trace} and {args.add}"
        raise UserError(f"--seed {args.seed}: {both} write every step out, so no seed redraws them; drop --seed")
    with_job = _fitting(_as_asked(with_job, args), policies)
    base = _as_asked(base, args, refuse_undrawn=False)  # the seed may redraw the added job alone
    name = base.model.name or Path(args.trace).stem
    show = not args.quiet
    if show:
        ids = ", ".join(job.job_ids())
        console.print(Text.assemble((name, "bold"), f" + {ids}: {base.cluster.num_gpus} GPUs; policies: {', '.join(policies)}"))
    with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("", total=None)
        results = whatif(
            base,
            with_job,
            job.job_ids(),
            policies,
            lambda policy, label: bar.update(task, description=f"replaying {policy} {label}"),
        )
    if show:
        print_whatif(console, results)
    if args.json:
        with _writing("--json", args.json):
            write_json(whatif_json(name, args.trace, args.add, results), args.json)
        if show:
            console.print(f"wrote {args.json}", markup=False, highlight=False)
    return 0


def _sweep(args, console: Console, err: Console) -> int:
    from rlix.sim.sweep_plot import print_summary

    try:
        import ray  # noqa: F401  (the exec extra)
    except ImportError:
        raise UserError("sweep runs its replays on Ray, which is not installed; pip install -e '.[exec]'") from None
    if args.address:
        from rlix.transport import ClusterError, answers

        try:
            answers(args.address, "--address")
        except ClusterError as e:
            raise UserError(str(e)) from None
    policies = _policies(args.policy)
    knobs = [sweep.parse_knob(k) for k in args.knob]
    if len({k.name for k in knobs}) != len(knobs):
        raise UserError("--knob: a knob is named twice; give each knob once with all its values")
    seeds = sweep.parse_seeds(args.seeds)
    texts = sweep.load_texts(args.traces, knobs, seeds, policies)
    check_output("--out", args.out, folder=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = sweep.grid(args.traces, knobs, seeds, policies)
    show = not args.quiet
    started = time.perf_counter()
    with _bar(err, show) as bar:
        task = bar.add_task("sweep", total=len(cells), sim="")

        def done(row: sweep.SweepRow) -> None:
            bar.update(task, advance=1, sim=f"{row.trace}/{row.policy}")

        rows = sweep.run_on_ray(cells, texts, args.address, done)
    from rlix.sim.sweep_plot import write_outputs

    with _writing("--out", args.out):
        paths = write_outputs(out, knobs, seeds, policies, rows)
    if show:
        print_summary(console, rows, knobs)
        wrote = ", ".join(map(str, paths))
        line = f"{len(rows)} replays in {time.perf_counter() - started:.1f} s wall; wrote {wrote}"
        console.print(line, markup=False, highlight=False)
    return 0


def _bar(err: Console, show: bool) -> Progress:
    """The progress bar of a replay or a sweep (on stderr; ``sim`` says what finished or how far the clock is)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[sim]}", markup=False),  # a trace's name is the user's text
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not show,
    )


def _knobs(pairs: list[str]) -> dict[str, str]:
    knobs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--set {pair}: write KNOB=VALUE, e.g. --set backlog_weight=2")
        if key in knobs:
            raise UserError(f"--set {key}: given twice; set each knob once")
        knobs[key] = value
    return knobs


def _generate(args, console: Console, err: Console) -> int:
    if args.scenario not in scenarios.SCENARIOS:
        raise UserError(f"scenario {args.scenario!r} is unknown; choose from {', '.join(scenarios.SCENARIOS)}")
    model = scenarios.build(args.scenario, args.seed)
    out = Path(args.output or f"traces/{args.scenario}.json")
    check_output("--output", out)
    with _writing("--output", out):
        dump_trace(model, out)
    trace = Trace(model, str(out))
    console.print(
        f"wrote {out}: {len(trace.pipelines)} pipelines, {trace.total_trajectories():,} trajectories, "
        f"{trace.cluster.num_gpus} GPUs",
        markup=False,
        highlight=False,
    )
    return 0


def _validate(args, console: Console, err: Console) -> int:
    trace = load_trace(args.trace)
    trace.streams  # noqa: B018 -- drawn now: a draw past any clock is refused here, not at the replay
    c = trace.cluster
    console.print(
        f"{args.trace}: ok — {c.num_gpus} GPUs, {len(trace.pipelines)} pipelines, {trace.total_trajectories():,} trajectories",
        markup=False,
        highlight=False,
    )
    from rlix.sim.simulator import policy_misfit

    for policy in POLICIES:  # valid, yet a policy a replay runs by default may not place every job
        if (problem := policy_misfit(trace, [policy])) is not None:
            console.print(f"  note: {problem}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _schema(args, console: Console, err: Console) -> int:
    sys.stdout.write(json.dumps(json_schema(), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
