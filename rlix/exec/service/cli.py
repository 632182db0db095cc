"""Executor layer: ``rlix``, the tools of the cluster's shared scheduler service.

    rlix scheduler start [--address A] [--policy P] [--set KNOB=VALUE ...] [--nodes N --gpus G] [--metrics-port P]
    rlix scheduler stop [--address A] [--force]
    rlix status [--address A] [--json]
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

from rlix.protocol import VersionMismatch


class UserError(Exception):
    """Bad input, or nothing to talk to: one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlix", description="The rlix scheduler shared by every job on a Ray cluster.")
    sub = p.add_subparsers(dest="command", required=True)
    sched = sub.add_parser("scheduler", help="start or stop the cluster's scheduler service")
    act = sched.add_subparsers(dest="action", required=True)
    start = act.add_parser("start", help="start the service (the first rlix-run --address starts one too)")
    start.add_argument("--policy", default="rlix", help="scheduling policy (rlix, static, partial_overlap)")
    start.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="a scheduler knob (repeatable)")
    start.add_argument("--nodes", type=int, default=None, help="nodes it manages (default: the Ray cluster's GPU nodes)")
    start.add_argument("--gpus", type=int, default=None, help="GPUs per node (default: read from Ray)")
    start.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics at :PORT/metrics")
    stop = act.add_parser("stop", help="stop the service (refused while jobs run)")
    stop.add_argument("--force", action="store_true", help="cancel every job cleanly first")
    status = sub.add_parser("status", help="jobs, the GPUs they hold, and the cluster's use")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    cancel = sub.add_parser("cancel", help="cancel a job (it ends cancelled, keeping what it did)")
    cancel.add_argument("job", help="its job id, or its name while it has not ended")
    cancel.add_argument("--force", action="store_true", help="cancel another user's job")
    timeline = sub.add_parser("timeline", help="the cluster's GPU-by-time chart since the service started")
    timeline.add_argument("--plot", default=None, help="write the chart here (PNG); default: print the segments as JSON")
    for q in (start, stop, status, cancel, timeline):
        q.add_argument("--address", default=None, help="the Ray cluster (default: RAY_ADDRESS, else auto)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        service = _connect(args)
        code = COMMANDS[(args.command, getattr(args, "action", None))](service, args)
        if args.command in READ_ONLY and argv is None:  # a tool's reading: leave without Ray's slow teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
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
    from rlix.core import POLICIES

    if args.policy not in POLICIES:
        raise UserError(f"--policy {args.policy}: unknown; choose one of {', '.join(sorted(POLICIES))}")
    knobs = _knobs(args.set)
    if (args.nodes is None) != (args.gpus is None):
        raise UserError("--nodes and --gpus go together; give both, or neither to read the cluster from Ray")
    try:
        cluster = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus) if args.nodes else connect.ray_cluster()
    except connect.ServiceError as exc:
        raise UserError(str(exc)) from None
    try:
        connect.start(cluster, args.policy, knobs, args.metrics_port)
    except connect.ClusterError as exc:  # its GPUs could not be reserved in Ray
        raise UserError(str(exc)) from None
    served = f"; metrics at :{args.metrics_port}/metrics" if args.metrics_port else ""
    print(f"rlix scheduler started: {cluster.nodes} x {cluster.gpus_per_node} GPUs, policy {args.policy}{served}")
    return 0


def _knobs(pairs: list[str]):
    """The scheduler block with ``KNOB=VALUE`` settings (values read as YAML scalars)."""
    import yaml
    from pydantic import ValidationError

    from rlix.config import one_line
    from rlix.exec.front.config import SchedulerKnobs

    raw: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--set {pair}: write KNOB=VALUE, e.g. --set min_residency_s=5")
        raw[key] = yaml.safe_load(value)
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


def _status(service, args) -> int:
    from rlix import protocol
    from rlix.exec.service.show import status_table

    status = service.call_sync(protocol.Status())
    if args.json:
        print(json.dumps(asdict(status), indent=1))
    else:
        status_table(status)
    return 0


def _cancel(service, args) -> int:
    from rlix import protocol

    reply = service.call_sync(protocol.Cancel(job=args.job, by=protocol.asker(), force=args.force))
    done = reply.found and not reply.refused
    print(reply.message if done else f"rlix: {reply.message}", file=sys.stdout if done else sys.stderr)
    return 0 if done else 1


def _timeline(service, args) -> int:
    from rlix import protocol

    reply = service.call_sync(protocol.Timeline())
    rec, now, jobs = reply.recorder, reply.now, list(reply.jobs)
    if args.plot:
        from rlix.sim.plot import plot_runs

        plot_runs({"rlix scheduler": (rec, now)}, jobs, args.plot, f"rlix scheduler: {len(jobs)} jobs, {now:.0f} s")
        print(f"wrote {args.plot}")
        return 0
    segments = [
        {"gpu": s.gpu, "start": s.start, "end": s.end, "activity": s.activity.value, "job": s.pipeline_id, "stage": s.stage}
        for s in rec.iter_segments()
    ]
    print(json.dumps({"now_s": now, "num_gpus": rec.num_gpus, "segments": segments}, indent=1))
    return 0


READ_ONLY = ("status", "timeline")  # commands that change nothing on the service

COMMANDS = {
    ("scheduler", "start"): _start,
    ("scheduler", "stop"): _stop,
    ("status", None): _status,
    ("cancel", None): _cancel,
    ("timeline", None): _timeline,
}


if __name__ == "__main__":
    sys.exit(main())
