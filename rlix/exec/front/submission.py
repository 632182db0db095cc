"""Executor layer: a run's jobs submitted to the cluster's shared scheduler service.

``rlix-run CONFIG --address A`` (or inside ``ray job submit``, where Ray sets
``RAY_ADDRESS``) joins the cluster's rlix scheduler, starting it if none
runs, instead of starting a private one. Before anything starts: the
config's ``cluster`` block (if it has one) must be the scheduler's, and the
job names must be free on the cluster; either failing is a one-line config
error. While the run lasts, the submission renews its lease (a submitter
that dies loses its jobs, and their GPUs go back to the others) and learns
which of its jobs ``rlix cancel`` asked to stop before they started.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import uuid

from rlix import protocol, transport
from rlix.exec.config import ConfigError, RunConfig, check_topology
from rlix.exec.front.joblines import default_steps
from rlix.exec.service import connect
from rlix.protocol import JobClaim, NameTaken, Stopped, VersionMismatch

TAG_ENV = "RLIX_RUN_TAG"  # a detached submission's tag (the end of its submitter's name): how it finds its jobs
RENEW_S = 2.0  # seconds between lease renewals (the service's lease is several times longer)


class Submission:
    """One ``rlix-run``'s claim on the shared scheduler: its jobs' names, renewed while it runs."""

    def __init__(self, config: RunConfig, source: str = "") -> None:
        """Find or start the service; :class:`ConfigError` if the config's cluster or a job name clashes with it.
        ``source``: the config's file (for ``rlix history``)."""
        given = "cluster" in config.model_fields_set
        service = transport.find()
        if service is None:  # the first submission starts the service, once its jobs are known to fit
            cluster = config.cluster.spec() if given else connect.ray_cluster()
            cluster_block = config.cluster.model_copy(update={"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node})
            check_topology(config.model_copy(update={"cluster": cluster_block}))
            service = connect.start(cluster, config.policy, config.scheduler)
        self.scheduler = service
        self.info = info = service.call_sync(protocol.Info())
        have = (info.nodes, info.gpus_per_node)
        if given and (config.cluster.nodes, config.cluster.gpus_per_node) != have:
            raise ConfigError(
                f"cluster: the config says {config.cluster.nodes} nodes x {config.cluster.gpus_per_node} GPUs, but the "
                f"rlix scheduler on this Ray cluster manages {have[0]} x {have[1]}; "
                "remove the cluster block to use the scheduler's"
            )
        if "policy" in config.model_fields_set and config.policy != info.policy:
            raise ConfigError(
                f"policy: the config asks for '{config.policy}', but the rlix scheduler on this Ray cluster runs "
                f"'{info.policy}'; remove policy (and --policy) to use the scheduler's"
            )
        cluster = config.cluster.model_copy(update={"nodes": info.nodes, "gpus_per_node": info.gpus_per_node})
        self.config = config.model_copy(update={"cluster": cluster, "policy": info.policy})
        check_topology(self.config, settings=False)  # the jobs' GPU mappings fit the scheduler's cluster (it keeps its settings)
        tag = os.environ.get(TAG_ENV) or uuid.uuid4().hex[:6]  # a detached run's is its submitter's
        self.submitter = f"{socket.gethostname()}:{os.getpid()}:{tag}"
        self.user = protocol.asker()
        claims = tuple(JobClaim(name=j.name, priority=j.priority, steps=default_steps(j), config=source) for j in config.jobs)
        try:
            ids = service.call_sync(protocol.Claim(submitter=self.submitter, jobs=claims, user=self.user))
        except NameTaken as exc:
            message = str(exc)
            names = [j.name for j in config.jobs]
            index = next((i for i, n in enumerate(names) if f"'{n}'" in message), 0)
            raise ConfigError(f"jobs[{index}].name: {message}") from None
        self.jobs = tuple(dataclasses.replace(c, id=i) for c, i in zip(claims, ids))  # with the ids the scheduler gave
        self.ids = {c.name: c.id for c in self.jobs}
        self.open = self.jobs  # the jobs this run has not seen end (what a renewal keeps claimed)
        self.cancelled: dict[str, Stopped] = {}  # jobs whose cancel was asked for, and why (read by the run's poll)
        self._done = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="rlix-lease", daemon=True)
        self._renewer.start()

    @classmethod
    def join(cls, config: RunConfig, address: str, where: str, source: str = "") -> Submission:
        """Join the Ray cluster at ``address`` (named by ``where``) and submit there; Ray is left again on failure."""
        import ray
        from ray.exceptions import RayError

        given = "cluster" in config.model_fields_set
        transport.join(address, config.cluster.spec().num_gpus if given else 0, where)
        try:
            return cls(config, source)
        except VersionMismatch as exc:
            ray.shutdown()
            raise connect.ServiceError(f"{where} {address}: {exc}") from None
        except RayError as exc:
            ray.shutdown()
            raise connect.ServiceError(
                f"{where} {address}: the rlix scheduler there did not answer ({type(exc).__name__}); "
                "see 'rlix status', or restart it with 'rlix scheduler stop --force'"
            ) from None
        except BaseException:
            ray.shutdown()
            raise

    def run_name(self) -> str:
        """The name of the run's output directory: its first job's id (the ids of one submission are consecutive),
        so no two runs through the scheduler share one."""
        return self.jobs[0].id

    def log_at(self, log: str) -> None:
        """Tell the scheduler where the run's log is (``host:path``, for ``rlix logs``); said at once."""
        self.jobs = tuple(dataclasses.replace(c, log=log) for c in self.jobs)
        self.open = tuple(dataclasses.replace(c, log=log) for c in self.open)
        self.scheduler.call_sync(protocol.Renew(submitter=self.submitter, jobs=self.open, user=self.user))

    def take_cancelled(self) -> list[tuple[str, Stopped]]:
        """The jobs whose cancel was asked for since the last call, and why."""
        return [(name, self.cancelled.pop(name)) for name in sorted(self.cancelled)]

    def ended(self, names) -> None:
        """The run saw these jobs end: renewals no longer claim them (the name is free for others)."""
        gone = set(names)
        self.open = tuple(j for j in self.open if j.name not in gone)

    def _renew(self) -> None:
        """Renew the lease every ``RENEW_S`` from its own thread, however long the run's poll takes."""
        while not self._done.wait(RENEW_S):
            try:
                renewal = protocol.Renew(submitter=self.submitter, jobs=self.open, user=self.user)
                asked = self.scheduler.call_sync(renewal)
                self.cancelled.update(asked)
            except Exception:  # noqa: BLE001 -- the service is restarting: the next renewal claims again
                pass

    def leave(self) -> None:
        self._done.set()
        try:
            self.scheduler.call_sync(protocol.Leave(submitter=self.submitter))
        except Exception:  # noqa: BLE001 -- the service is gone: nothing to leave
            pass

    def to_run_clock(self, t: float, run_t0: float) -> float:
        """A time of the service's clock (seconds since it started) on the run's (seconds since the run started)."""
        return t + self.info.started_at - run_t0


def joins_shared(address: str | None, config: RunConfig) -> str | None:
    """The Ray address a run joins the shared scheduler at (None: a private local run)."""
    return address or config.ray.address or os.environ.get("RAY_ADDRESS") or None
