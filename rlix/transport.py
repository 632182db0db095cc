"""How a request of :mod:`rlix.protocol` reaches the cluster's scheduler, and its reply comes back: Ray.

The scheduler is a named Ray actor (``rlix-scheduler`` in the ``rlix``
namespace) with one call, ``handle(request, version)``. :class:`RayTransport`
sends a request there, stamped with this client's ``PROTOCOL_VERSION``, from
a coroutine (pipelines) or blocking (the ``rlix`` tool, a submitter's
driver). :func:`join` joins a Ray cluster at an address, failing fast with
one line if nothing answers there. Nothing here imports the executor.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from rlix.protocol import PROTOCOL_VERSION, Request, VersionMismatch

SERVICE_NAME = "rlix-scheduler"  # the scheduler service's actor name
NAMESPACE = "rlix"  # the Ray namespace it lives in
SCHEDULER_CALL_S = 30.0  # deadline of a blocking call to the scheduler (s)

HINT = "start one with 'ray start --head --num-gpus N', or leave --address out to start a local one"
# For a tool that only reaches a cluster (rlix status, cancel, ...; a TRL job or outside pipeline given an address).
REACH_HINT = "start one with 'ray start --head --num-gpus N', then the scheduler with 'rlix scheduler start'"


class ClusterError(RuntimeError):
    """The Ray cluster is unreachable or smaller than the config's cluster: one line, nothing started."""


class RayTransport:
    """Requests to the scheduler actor behind ``actor`` (a Ray actor handle), and their replies."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def send(self, request: Request):
        """The request sent; its reply's Ray object ref (awaitable). :class:`VersionMismatch` for a scheduler
        older than this protocol (it has no ``handle``)."""
        try:
            handle = self.actor.handle
        except AttributeError:
            raise VersionMismatch(
                f"the rlix scheduler running predates rlix protocol {PROTOCOL_VERSION}; restart it with this rlix "
                "('rlix scheduler stop' and 'rlix scheduler start')"
            ) from None
        return handle.remote(request, PROTOCOL_VERSION)

    async def call(self, request: Request, timeout_s: float | None = None):
        """The reply to ``request`` (no deadline with ``timeout_s`` None: a gang request waits for GPUs). An
        error the scheduler answered with is raised as itself, as :meth:`call_sync` raises it."""
        from ray.exceptions import RayTaskError

        ref = self.send(request)
        try:
            return await (ref if timeout_s is None else asyncio.wait_for(ref, timeout_s))
        except RayTaskError as exc:
            raise _answered(exc) from None

    def call_sync(self, request: Request, timeout_s: float | None = SCHEDULER_CALL_S):
        """The reply to ``request``, blocking (a Ray ``GetTimeoutError`` after ``timeout_s``). An error the
        scheduler answered with is raised as itself (one of :mod:`rlix.protocol`'s), without Ray's wrapping."""
        import ray
        from ray.exceptions import RayTaskError

        try:
            return ray.get(self.send(request), timeout=timeout_s)
        except RayTaskError as exc:
            raise _answered(exc) from None


def _answered(exc: BaseException) -> BaseException:
    """The error a scheduler's call answered with, without Ray's wrapping (its traceback from the actor)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def page_file(gcs_port: int) -> Path:
    """Where the scheduler service of the Ray cluster whose GCS listens on ``gcs_port`` writes the address of its
    HTTP pages, on its node (the head node)."""
    return Path.home() / ".rlix" / f"scheduler-{gcs_port}.json"


def ray_address_file() -> Path:
    """Where ``ray start`` writes the address that ``auto`` means: under ``RAY_TMPDIR``, else ``TMPDIR``
    (on Linux), else ``/tmp``, as Ray 2.x reads it."""
    import os
    import sys

    base = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return Path(base or "/tmp") / "ray" / "ray_current_cluster"


def status_over_http(address: str, timeout_s: float = 2.0) -> dict | None:
    """``rlix status --json`` as the scheduler serves it over HTTP, without Ray: found through the file its
    node holds (:func:`page_file`); None where it cannot be read so (another node, no service, an old one)."""
    import http.client
    import json
    import urllib.request

    if address == "auto":  # the cluster this host belongs to, as Ray's own 'auto' finds it
        try:
            address = ray_address_file().read_text().strip()
        except OSError:
            return None
    try:
        url = json.loads(page_file(int(address.rpartition(":")[2])).read_text())["url"]
        with urllib.request.urlopen(f"{url}/status", timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        return None


def find() -> RayTransport | None:
    """The transport to the cluster's scheduler service, or None if none runs (Ray joined already)."""
    import ray

    try:
        return RayTransport(ray.get_actor(SERVICE_NAME, namespace=NAMESPACE))
    except ValueError:
        return None


def joined_elsewhere(address: str, where: str) -> None:
    """For a process joined to Ray already: raise one line (:class:`ClusterError`) if ``address`` names a GCS
    port other than the joined cluster's, which is surely another cluster; warn if only its host differs
    (it may be another cluster, or the same one by another name: a service in front of the head, a public
    address). ``auto``, ``local`` and ``ray://`` client addresses are taken as the one joined."""
    import warnings

    import ray

    if address in ("auto", "local") or address.startswith("ray://"):
        return
    here = ray.get_runtime_context().gcs_address
    (host, _, port), (here_host, _, here_port) = address.rpartition(":"), here.rpartition(":")
    if port != here_port:
        raise ClusterError(
            f"{where} {address}: this process is connected to the Ray cluster at {here} already; "
            "use that address, or call ray.shutdown() before connecting to another"
        )
    if not _same_host(host, here_host):
        warnings.warn(
            f"{where} {address}: this process is connected to the Ray cluster at {here} already, and rlix uses it; "
            "call ray.shutdown() first to connect to another",
            stacklevel=3,
        )


def _same_host(a: str, b: str) -> bool:
    """Whether two hosts are one machine: they share an address, or one is a loopback address and the other
    an address of this machine."""
    ips_a, ips_b = _addresses(a), _addresses(b)
    if ips_a & ips_b:
        return True
    return (any(ip.is_loopback for ip in ips_a) and any(_is_local(ip) for ip in ips_b)) or (
        any(ip.is_loopback for ip in ips_b) and any(_is_local(ip) for ip in ips_a)
    )


def _addresses(host: str) -> set:
    """The IP addresses ``host`` (a name, or an IPv4 or bracketed IPv6 literal) resolves to (none if it does not)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(host.strip("[]") or "127.0.0.1", None)
    except (OSError, UnicodeError):
        return set()
    return {ipaddress.ip_address(info[4][0].partition("%")[0]) for info in infos}


def _is_local(ip) -> bool:
    """Whether ``ip`` is an address of this machine (a socket can be bound to it)."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


def answers(address: str, where: str, hint: str = HINT) -> None:
    """Raise one line (:class:`ClusterError`) unless something listens at ``address`` (``auto``: not checked
    here); ``where`` names the setting it came from, ``hint`` what to do. Cheap: a run checks it before anything else."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError, OverflowError):  # OverflowError: a port past any C long
        raise ClusterError(f"{where} {address}: no Ray cluster answers there; {hint}") from None


def join(address: str, gpus_needed: int, where: str, *, quiet: bool = False) -> None:
    """Connect to an existing Ray cluster, failing fast with one line if it is not there.

    ``where`` names the setting the address came from (``--address`` or ``ray.address``);
    ``quiet``: without Ray's notices on connecting, for a caller that only reaches a cluster (the ``rlix``
    tools, a client): its hint does not offer a local cluster.
    """
    import logging

    import ray

    hint = REACH_HINT if quiet else HINT
    answers(address, where, hint)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING if quiet else logging.INFO)
    except ConnectionError:
        raise ClusterError(
            f"{where} {address}: no Ray cluster accepted the connection; {hint} "
            "(a cluster with token authentication also needs RAY_AUTH_MODE=token and its token, e.g. in ~/.ray/auth_token)"
        ) from None
    have = int(ray.cluster_resources().get("GPU", 0))
    if have < gpus_needed:
        ray.shutdown()
        raise ClusterError(
            f"{where} {address}: the Ray cluster has {have} GPUs but cluster in the config needs {gpus_needed}; "
            "add nodes or lower cluster.nodes / cluster.gpus_per_node"
        )
