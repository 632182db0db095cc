"""Executor layer: ``rlix-run CONFIG`` (the CLI; :mod:`rlix.exec.front.api` is the same in Python).

Exit status, what happened to the run's jobs:

- 0 every job finished;
- 1 some job failed or was killed;
- 2 bad config, or a Ray cluster that is not there or too small (a one-line
  error; no actor was started), or a job failed on the user's input at run
  time (a reward function that raised or returned the wrong values: one line
  on stderr naming it, after the other jobs finished);
- 3 a job was cancelled (``rlix cancel``; who asked is on stderr);
- 4 the shared scheduler was stopped under a job (``rlix scheduler stop --force``);
- 130 interrupted (Ctrl-C): the outputs so far are written (nothing, where no job had started).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

from rlix.config import OneLineParser, ray_address


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="rlix-run", description="Run RL jobs that share GPUs through the rlix scheduler.")
    p.add_argument("config", help="YAML run config (see examples/)")
    p.add_argument(
        "--address",
        type=ray_address,
        default=None,
        help="join this Ray cluster ('auto' or host:port) instead of starting a local one",
    )
    p.add_argument("--policy", default=None, help="override the config's policy (rlix, static, partial_overlap)")
    p.add_argument("--out", default=None, help="output directory (default: the config's output.dir)")
    p.add_argument("--no-console", action="store_true", help="no live progress table")
    p.add_argument("--json", default=None, help="also write the metrics to this path")
    p.add_argument("--detach", action="store_true", help="with --address: run on the cluster's head node and return")
    p.add_argument("--source", default=None, help=argparse.SUPPRESS)  # a detached run's config, as submitted
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rlix.exec.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, policy=args.policy)
    except ConfigError as exc:
        print(f"rlix-run: config error: {exc}", file=sys.stderr)
        return 2
    missing = [name for name in ("ray", "torch", "transformers", "peft", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"rlix-run: the executor needs the exec extra ({', '.join(missing)} not installed); pip install -e '.[exec]'",
            file=sys.stderr,
        )
        return 2
    from rlix.exec.front import api
    from rlix.exec.front.console import ProgressView
    from rlix.exec.front.submission import joins_shared

    source = args.source or api.config_source(args.config)
    if args.detach:
        return detached(cfg, args, source)
    problem = unwritable_outputs(args, cfg)
    if problem is not None:
        print(f"rlix-run: error: {problem}", file=sys.stderr)
        return 2
    interrupts = Interrupts()
    try:
        with interrupts, ProgressView(enabled=cfg.output.console and not args.no_console) as view:
            view.note = ctrl_c_note(shared=joins_shared(args.address, cfg) is not None)
            outputs = api.run(
                cfg, address=args.address, out_dir=args.out, on_progress=view, stop=interrupts.requested, source=source
            )
    except api.ClusterError as exc:
        print(f"rlix-run: cluster error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # data that reads but cannot train (found when tokenized, before any actor)
        print(f"rlix-run: config error: {exc}", file=sys.stderr)
        return 2
    except api.Interrupted:  # Ctrl-C while the data jobs were prepared: nothing had started
        print("rlix-run: stopped by Ctrl-C before any job started; nothing written", file=sys.stderr)
        return 130
    report(outputs, args.json)
    if interrupts.count and cut_short(outputs.results):
        print(f"rlix-run: stopped by Ctrl-C; the outputs above cover the {outputs.wall_s:.0f} s run (partial)", file=sys.stderr)
        return 130
    if interrupts.count:  # it came after the last job finished: nothing was cut
        print("rlix-run: Ctrl-C came once every job had finished; the outputs above are whole", file=sys.stderr)
    return exit_status(outputs.results)


def unwritable_outputs(args, cfg) -> str | None:
    """The run's output folder, the models folder beside it, ``--json`` and each job's checkpoint folder,
    checked before Ray starts: a line saying which could not be written, or None."""
    from rlix.config import overwrites, unwritable

    flag, out = ("--out", args.out) if args.out else ("output.dir", cfg.output.dir)
    problem = unwritable(out, folder=True)
    if problem is None:  # models built from a size are kept beside the run's folder
        models = Path(out).resolve().parent / "_models"
        problem = None if unwritable(models, folder=True) is None else f"{models}, where models are built, could not be made"
    if problem is None and args.json is not None:
        flag, out = "--json", args.json
        problem = unwritable(args.json) or overwrites(args.json, {"the config": args.config})
    for i, job in enumerate(cfg.jobs):  # each checkpoint is written after a step's training: checked now
        if problem is None and job.checkpoint_dir:
            flag, out, problem = f"jobs[{i}].checkpoint_dir", job.checkpoint_dir, unwritable(job.checkpoint_dir, folder=True)
    return None if problem is None else f"{flag} {out}: {problem}"


def detached(cfg, args, source: str) -> int:
    """``--detach``: the run goes to the shared scheduler's head node; returns once its jobs are submitted."""
    from rlix.exec.front import api
    from rlix.exec.front.detach import submit
    from rlix.exec.front.submission import joins_shared

    address = joins_shared(args.address, cfg)
    if address is None:
        print("rlix-run: --detach runs on a Ray cluster's head node: give --address (or RAY_ADDRESS)", file=sys.stderr)
        return 2
    extra = ["--policy", args.policy] if args.policy else []
    try:
        return submit(cfg, address=address, out=args.out, source=source, extra=extra)
    except api.ClusterError as exc:
        print(f"rlix-run: cluster error: {exc}", file=sys.stderr)
        return 2


def ctrl_c_note(*, shared: bool) -> str:
    """What Ctrl-C does, for the live view's footer."""
    what = "stops this run's jobs (the cluster's other jobs go on)" if shared else "stops every job"
    return f"Ctrl-C {what} and writes the outputs so far; a second Ctrl-C exits at once"


def report(outputs, json_path: str | None) -> None:
    """The run's figures, one summary line per job (what its last live row showed), and the output files."""
    m = outputs.metrics
    print(
        f"makespan_s={m.makespan_s:.1f} gpu_utilization={m.gpu_utilization:.3f} idle_fraction={m.idle_fraction:.3f} "
        f"switch_overhead_fraction={m.switch_overhead_fraction:.3f} trajectories_lost={m.trajectories_lost} "
        f"control_overhead_fraction={outputs.control_overhead_fraction:.4f}"
    )
    for line in outputs.lines:
        print(f"  {line.summary()}")
    print("outputs: " + " ".join(f"{k}={v}" for k, v in outputs.files.items()))
    for pid, result in sorted(outputs.results.items()):
        for warning in result.warnings:
            print(f"rlix-run: job {pid}: warning: {warning}", file=sys.stderr)
    if outputs.moved:
        print(f"rlix-run: warning: {outputs.moved}", file=sys.stderr)
    if json_path:
        try:
            with open(json_path, "w") as f:
                json.dump(m.to_json(), f, indent=1)
        except OSError as exc:
            from rlix.exec.error_text import os_error

            print(f"rlix-run: warning: --json {json_path} could not be written ({os_error(exc)})", file=sys.stderr)


class Interrupts:
    """SIGINT while a run is on: the first asks every job to stop (outputs are still written), a second exits at once."""

    def __init__(self) -> None:
        self.count = 0
        self._previous = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def requested(self) -> bool:
        return self.count > 0

    def _on_sigint(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            print("\nrlix-run: stopping every job and writing what they did; Ctrl-C again to exit at once", file=sys.stderr)
            return
        print("rlix-run: stopped at once; outputs not written", file=sys.stderr)
        os._exit(130)


def cut_short(results: dict) -> bool:
    """Did the stop cut a job short (it ends cancelled)? A job that had failed before it keeps its own exit status."""
    from rlix.exec.records import JobStatus

    return any(r.status is JobStatus.CANCELLED for r in results.values())


def exit_status(results: dict) -> int:
    """What happened, as the exit status (docs/executor.md lists them): 2 a job failed on the user's input
    (said on stderr, one line each), 1 another failed or was killed, 4 the shared scheduler was
    stopped under a job, 3 a job was cancelled (by whom, on stderr), else 0."""
    from rlix.exec.records import JobStatus

    bad = sorted(pid for pid, r in results.items() if r.bad_input)
    for pid in bad:
        print(f"rlix-run: job {pid}: {results[pid].error}", file=sys.stderr)
    if bad:
        return 2
    if any(r.status in (JobStatus.FAILED, JobStatus.KILLED) for r in results.values()):
        return 1
    stopped = {pid: r.stopped for pid, r in sorted(results.items()) if r.stopped is not None}
    for pid, why in stopped.items():
        print(f"rlix-run: job {pid}: {why.line()}", file=sys.stderr)
    if any(why.scheduler_stopped for why in stopped.values()):
        return 4
    return 3 if any(r.status is JobStatus.CANCELLED for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
