"""Executor layer: ``rlix``, the tools of the cluster's shared scheduler service.

    rlix scheduler start [--address A] [--policy P] [--set KNOB=VALUE ...] [--nodes N --gpus G]
                         [--metrics-port P] [--history PATH] [--keep-ended AGE]
    rlix scheduler stop [--address A] [--force]
    rlix status [JOB] [--address A] [--json] [--watch [S]]
    rlix history [--user U] [--since T] [--json] [--db PATH] [--address A]
    rlix logs JOB [--follow] [--address A]
    rlix cancel JOB [--address A] [--force]
    rlix timeline [--address A] [--plot out.png]

``--address`` defaults to ``RAY_ADDRESS``, else ``auto`` (the cluster this
machine belongs to). Exit status: 0 done, 1 refused (a stop while jobs run,
a cancel of an unknown job), 2 bad input or no Ray cluster / no scheduler there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from rlix.config import OneLineParser, ray_address
from rlix.exec.service.history import KEEP_ENDED_MIN_S, KEEP_ENDED_S
from rlix.protocol import VersionMismatch


class UserError(Exception):
    """Bad input, or nothing to talk to: one line, exit 2."""


def port(text: str) -> int:
    """A TCP port, 1 to 65535 (argparse says so in one line otherwise)."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1 to 65535)")
    return int(text)


def count(text: str) -> int:
    """A whole number >= 1 (nodes, GPUs per node)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return int(text)


def seconds(text: str) -> float:
    """A positive, finite number of seconds (at most a day: ``--watch inf`` would never refresh)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0 and at most 86400")
    return value


AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """A number of seconds, or of minutes, hours or days with their unit (30m, 6h, 2d); 0 or more."""
    scale = AGE_UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in AGE_UNITS else text
    try:
        value = float(number) * scale
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not an age: write seconds (600), or 30m, 6h, 2d")
    return value


def keep_age(text: str) -> float:
    """``--keep-ended``: an age of at least a minute (a job's submitter learns how it ended before it is forgotten)."""
    value = duration(text)
    if value < KEEP_ENDED_MIN_S:
        raise argparse.ArgumentTypeError(f"{text}: keep an ended job at least {KEEP_ENDED_MIN_S:.0f} s (60, 10m, 1h)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="rlix", description="The rlix scheduler shared by every job on a Ray cluster.")
    sub = p.add_subparsers(dest="command", required=True)
    sched = sub.add_parser("scheduler", help="start or stop the cluster's scheduler service")
    act = sched.add_subparsers(dest="action", required=True)
    start = act.add_parser("start", help="start the service (the first rlix-run --address starts one too)")
    start.add_argument("--policy", default="rlix", help="scheduling policy (rlix, static, partial_overlap)")
    start.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="a scheduler knob (repeatable)")
    start.add_argument("--nodes", type=count, default=None, help="nodes it manages (default: the Ray cluster's GPU nodes)")
    start.add_argument("--gpus", type=count, default=None, help="GPUs per node (default: read from Ray)")
    start.add_argument("--metrics-port", type=port, default=None, help="serve Prometheus metrics at :PORT/metrics")
    start.add_argument("--history", default=None, help="the SQLite file of ended jobs (default ~/.rlix/history.sqlite)")
    start.add_argument(
        "--keep-ended",
        type=keep_age,
        default=KEEP_ENDED_S,
        metavar="AGE",
        help="how long an ended job stays in rlix status once it is in the history: 600, 30m, 1h, 2d (default 1h; at least 60 s)",
    )
    stop = act.add_parser("stop", help="stop the service (refused while jobs run)")
    stop.add_argument("--force", action="store_true", help="cancel every job cleanly first")
    status = sub.add_parser("status", help="jobs, the GPUs they hold, and the cluster's use")
    status.add_argument("job", nargs="?", default=None, help="one job's detail (its id, or its name)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument("--watch", type=seconds, nargs="?", const=2.0, default=None, metavar="S", help="refresh every S s")
    logs = sub.add_parser("logs", help="a job's lines of its run's log")
    logs.add_argument("job", help="its job id, or its name")
    logs.add_argument("--follow", "-f", action="store_true", help="go on printing until the job ends")
    history = sub.add_parser("history", help="the jobs that ended (as sacct)")
    history.add_argument("--user", default="", help="only this user's jobs (a name, or user@host)")
    history.add_argument("--since", default="", help="ended since: 2026-11-27, '2026-11-27 14:00', or 30m, 6h, 2d ago")
    history.add_argument("--json", action="store_true", help="print the jobs as JSON")
    history.add_argument("--db", default=None, help="read this history file directly (on the head node; no Ray)")
    cancel = sub.add_parser("cancel", help="cancel a job (it ends cancelled, keeping what it did)")
    cancel.add_argument("job", help="its job id, or its name while it has not ended")
    cancel.add_argument("--force", action="store_true", help="cancel another user's job")
    timeline = sub.add_parser("timeline", help="the cluster's GPU-by-time chart since the service started")
    timeline.add_argument("--plot", default=None, help="write the chart here (PNG); default: print the segments as JSON")
    for q in (start, stop, status, cancel, timeline, history, logs):
        q.add_argument("--address", type=ray_address, default=None, help="the Ray cluster (default: RAY_ADDRESS, else auto)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status" and (read := _over_http(args)) is not None:  # no Ray to import: fast
            return _status(read, args)
        if (args.command, getattr(args, "action", None)) == ("scheduler", "start"):
            _start_flags(args)  # before Ray is joined: a bad flag is named at once
        service = None if getattr(args, "db", None) else _connect(args)
        code = COMMANDS[(args.command, getattr(args, "action", None))](service, args)
        if args.command in READ_ONLY and argv is None:  # a tool's reading: leave without Ray's slow teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except KeyboardInterrupt:  # Ctrl-C: how a user stops `logs --follow`; quietly where it only read
        if args.command not in READ_ONLY:
            print(f"rlix: {args.command} interrupted; see rlix status for where things stand", file=sys.stderr)
        if argv is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)  # without Ray's slow teardown
        return 130
    except UserError as exc:
        print(f"rlix: {exc}", file=sys.stderr)
        return 2
    except VersionMismatch as exc:
        print(f"rlix: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a Ray error: the service died, is restarting, or did not answer in time
        from ray.exceptions import RayError

        if not isinstance(exc, RayError):
            raise
        print(f"rlix: the rlix scheduler did not answer ({type(exc).__name__}); try again, or see 'rlix status'", file=sys.stderr)
        return 2


def _connect(args):
    """Join the Ray cluster; the transport to its scheduler service (None only for ``scheduler start``
    when none runs)."""
    from rlix import transport

    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        transport.join(address, 0, "--address", quiet=True)
    except transport.ClusterError as exc:
        raise UserError(str(exc)) from None
    service = transport.find()
    if service is None and (args.command, getattr(args, "action", None)) != ("scheduler", "start"):
        raise UserError(f"no rlix scheduler runs on the Ray cluster at {address}; start one with 'rlix scheduler start'")
    return service


def _start(service, args) -> int:
    from rlix import protocol
    from rlix.core import ClusterSpec
    from rlix.exec.service import connect

    if service is not None:
        info = service.call_sync(protocol.Info())
        print(f"rlix scheduler already runs: {info.nodes} x {info.gpus_per_node} GPUs, policy {info.policy}")
        return 0
    knobs = _start_flags(args)
    try:
        cluster = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus) if args.nodes is not None else connect.ray_cluster()
    except connect.ServiceError as exc:
        raise UserError(str(exc)) from None
    problem = settings_error(cluster, knobs, source="--nodes x --gpus" if args.nodes is not None else "the Ray cluster's GPUs")
    if problem is not None:
        raise UserError(problem)
    try:
        connect.start(cluster, args.policy, knobs, args.metrics_port, args.history or connect.DEFAULT_HISTORY, args.keep_ended)
    except connect.ClusterError as exc:  # its GPUs could not be reserved in Ray
        raise UserError(str(exc)) from None
    served = f"; metrics at :{args.metrics_port}/metrics" if args.metrics_port else ""
    print(f"rlix scheduler started: {cluster.nodes} x {cluster.gpus_per_node} GPUs, policy {args.policy}{served}")
    return 0


def _start_flags(args):
    """``scheduler start``'s policy and knobs, and its cluster where --nodes and --gpus give it; the knobs."""
    from rlix.core import POLICIES, ClusterSpec

    if args.policy not in POLICIES:
        raise UserError(f"--policy {args.policy}: unknown; choose one of {', '.join(sorted(POLICIES))}")
    knobs = _knobs(args.set)
    if (args.nodes is None) != (args.gpus is None):
        raise UserError("--nodes and --gpus go together; give both, or neither to read the cluster from Ray")
    if args.nodes is not None and (problem := settings_error(ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus), knobs)):
        raise UserError(problem)
    return knobs


def settings_error(cluster, knobs, *, source: str = "--nodes x --gpus") -> str | None:
    """What the scheduler would refuse as it starts (a cluster too large, tenants' guarantees or queues
    beyond it), as one line naming where the cluster came from (``source``); None if nothing."""
    from pydantic import ValidationError

    from rlix.config import ClusterModel, one_line
    from rlix.core import SchedulingError
    from rlix.core.scheduler import check_settings

    try:
        ClusterModel(nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node)
        check_settings(cluster, knobs.core())
    except ValidationError as exc:
        return f"{source}: {one_line(exc)}"
    except SchedulingError as exc:
        return f"--set {exc}"
    return None


def _knobs(pairs: list[str]):
    """The scheduler block with ``KNOB=VALUE`` settings (values read as YAML scalars)."""
    import yaml
    from pydantic import ValidationError

    from rlix.config import one_line
    from rlix.exec.config import SchedulerKnobs

    raw: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--set {pair}: write KNOB=VALUE, e.g. --set min_residency_s=5")
        try:
            raw[key] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError):  # ValueError: a number of more digits than Python reads
            raise UserError(f"--set {pair}: the value does not read as YAML; quote it or write a plain number") from None
    try:
        return SchedulerKnobs.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"--set {one_line(exc)}") from None


def _stop(service, args) -> int:
    from rlix.exec.service import connect

    try:
        print(connect.stop(service, force=args.force))
    except connect.ServiceError as exc:
        print(f"rlix: {exc}", file=sys.stderr)
        return 1
    return 0


def _status(read, args) -> int:
    """``rlix status``: ``read()`` gives the status (over HTTP, or through Ray: ``read`` is then the transport)."""
    if not callable(read):
        from rlix import protocol

        service = read
        read = lambda: service.call_sync(protocol.Status())  # noqa: E731
    status = read()
    if args.job is not None:
        return _one_job(read, status, args)
    if args.watch is not None:
        from rlix.exec.service.show import status_view

        return _watch(read, args.watch, status_view)
    if args.json:
        print(json.dumps(asdict(status), indent=1))
    else:
        from rlix.exec.service.show import status_table

        status_table(status)
    return 0


def _over_http(args):
    """A reader of the status over the service's HTTP page, where this host can read it so; else None."""
    from rlix import protocol, transport

    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    first = transport.status_over_http(address)
    if first is None:
        return None
    ready = [first]

    def read():
        data = ready.pop() if ready else transport.status_over_http(address)
        if data is None:
            raise UserError("the rlix scheduler stopped answering; see 'rlix status' again")
        return protocol.status_from_json(data)

    try:
        protocol.status_from_json(first)
    except (TypeError, KeyError):  # a page of another rlix version: through Ray, which checks the protocol
        return None
    return read


def _one_job(read, status, args) -> int:
    """``rlix status JOB``: the job by id, else the latest of that name (refreshed with ``--watch``)."""
    from rlix.exec.service.show import console, job_detail

    row = _job_row(status, args.job)
    if args.json:
        print(json.dumps(asdict(row), indent=1))
        return 0
    if args.watch is not None:
        return _watch(read, args.watch, lambda now: job_detail(_job_row(now, args.job), now.started_at))
    console().print(job_detail(row, status.started_at))
    return 0


def _job_row(status, job: str):
    rows = [r for r in status.jobs if r.id == job] or [r for r in status.jobs if r.name == job][-1:]
    if not rows:
        raise UserError(f"no job '{job}' on this cluster; 'rlix status' lists them, 'rlix history' those that ended")
    return rows[0]


def _watch(read, every_s: float, view) -> int:
    """``view`` of the status, refreshed every ``every_s`` until Ctrl-C."""
    import time

    from rich.live import Live

    from rlix.exec.service.show import console

    with Live(view(read()), console=console(), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(every_s)
                live.update(view(read()), refresh=True)
        except KeyboardInterrupt:
            return 0


def _history(service, args) -> int:
    import sqlite3

    from rlix import protocol
    from rlix.exec.service.show import history_table

    since = _since(args.since)
    if args.db:
        from rlix.exec.service.history import History

        if not os.path.exists(os.path.expanduser(args.db)):
            raise UserError(f"--db {args.db}: no such file; the scheduler's is ~/.rlix/history.sqlite on the head node")
        try:
            rows = History(args.db, readonly=True).query(user=args.user, since=since)
        except sqlite3.Error as exc:
            raise UserError(f"--db {args.db}: not an rlix history ({exc})") from None
    else:
        rows = list(service.call_sync(protocol.JobHistory(user=args.user, since=since)))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        history_table(rows)
    return 0


LAST_LINE_WAIT_S = 15.0  # after a job ended, how long rlix logs --follow waits for its last line


def _job_or_ended(service, job: str):
    """The status row of a job (an id, or the name of the latest), else its history row once the status has
    forgotten it (its log stays where its run wrote it)."""
    from rlix import protocol

    def pick(rows):
        return [r for r in rows if r.id == job] or [r for r in rows if r.name == job][-1:]

    found = pick(service.call_sync(protocol.Status()).jobs) or pick(service.call_sync(protocol.JobHistory()))
    if not found:
        raise UserError(f"no job '{job}' on this cluster; see rlix status and rlix history")
    return found[0]


def _logs(service, args) -> int:
    """``rlix logs JOB``: the job's lines of its run's log, read here if it lies on this host, else by the
    scheduler on its node; ``--follow`` goes on until the job has ended."""
    import time

    from rlix import protocol
    from rlix.exec.service.logs import ENDED, LAST_STATES, lines_of, local_path, read_chunk, state_of

    row, offset = _job_or_ended(service, args.job), 0
    if not row.log:
        raise UserError(f"job {row.id} keeps no run log (a pipeline of its own); see rlix status {row.id}")
    here = local_path(row.log)
    said_ended, ended_at = False, None  # whether its last line (it ended) was read; when the scheduler said it ended
    while True:
        if here is not None:
            text, offset = read_chunk(here, offset)
            ended = row.state in ENDED
        else:
            chunk = service.call_sync(protocol.ReadLog(job=row.id, offset=offset))
            if not chunk.found:
                host, _, path = row.log.partition(":")
                raise UserError(f"job {row.id}'s log is on {host} at {path}; run rlix logs there, or read that file")
            text, offset, ended = chunk.text, chunk.offset, chunk.ended
        for line in lines_of(text, row.name):
            print(line, flush=True)
            said_ended = said_ended or state_of(line) in LAST_STATES
        if not args.follow:
            if text:  # a long log comes in chunks
                continue
            return 0
        if ended and not text:  # its run writes the last line on its next poll: wait for it (a run gone writes none)
            ended_at = ended_at or time.monotonic()
            if said_ended or time.monotonic() - ended_at > LAST_LINE_WAIT_S:
                return 0
        if not text:
            time.sleep(1.0)
            row = next((r for r in service.call_sync(protocol.Status()).jobs if r.id == row.id), row)


def _since(text: str) -> float:
    """``--since`` as Unix seconds: a date, a date and time, or an age (30m, 6h, 2d); "" is the beginning."""
    import time
    from datetime import datetime

    if not text:
        return 0.0
    if text[-1:] in AGE_UNITS and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - duration(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UserError(
            f"--since {text}: write a date (2026-11-27), a date and time ('2026-11-27 14:00'), or 30m, 6h, 2d"
        ) from None


def _cancel(service, args) -> int:
    from rlix import protocol

    reply = service.call_sync(protocol.Cancel(job=args.job, by=protocol.asker(), force=args.force))
    done = reply.found and not reply.refused
    print(reply.message if done else f"rlix: {reply.message}", file=sys.stdout if done else sys.stderr)
    return 0 if done else 2  # no such job, or another user's without --force: a mistake in the command, as elsewhere


def _timeline(service, args) -> int:
    from rlix import protocol

    if args.plot is not None:
        from rlix.plot import figure_problem

        if (problem := figure_problem(args.plot)) is not None:
            raise UserError(f"--plot {args.plot}: {problem}")
    reply = service.call_sync(protocol.Timeline())
    rec, now, jobs = reply.recorder, reply.now, list(reply.jobs)
    if args.plot:
        from rlix.exec.service import connect
        from rlix.plot import plot_runs

        title = f"rlix scheduler: {connect.jobs(len(jobs))}, utilization {reply.utilization:.3f}"
        print(f"wrote {plot_runs({'rlix scheduler': (rec, now)}, jobs, args.plot, title, span='up')}")
        return 0
    segments = [
        {"gpu": s.gpu, "start": s.start, "end": s.end, "activity": s.activity.value, "job": s.pipeline_id, "stage": s.stage}
        for s in rec.iter_segments()
    ]
    out = {"now_s": now, "start_s": reply.start, "num_gpus": rec.num_gpus, "utilization": reply.utilization}
    out["segments"] = segments
    print(json.dumps(out, indent=1))
    return 0


READ_ONLY = ("status", "timeline", "history", "logs")  # commands that change nothing on the service

COMMANDS = {
    ("scheduler", "start"): _start,
    ("scheduler", "stop"): _stop,
    ("status", None): _status,
    ("cancel", None): _cancel,
    ("timeline", None): _timeline,
    ("history", None): _history,
    ("logs", None): _logs,
}


if __name__ == "__main__":
    sys.exit(main())
