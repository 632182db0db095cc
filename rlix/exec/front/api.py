"""Executor layer: the Python API behind ``rlix-run`` (for notebooks and other frameworks).

    from rlix.exec.front import api
    session = api.init("examples/cpu_two_jobs.yaml")      # or a RunConfig; address= joins a cluster
    pid = session.register(session.config.jobs[0])       # allocate an id, register the topology
    session.admit(pid)                                   # start its coordinator
    outputs = session.run()                              # admits the rest at their arrival, waits, writes outputs
    session.shutdown()

``api.run(config)`` does all of it. ``session.kill(pid)`` stops a pipeline;
its GPUs go back to the others.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rlix.exec.control.actor_placement import ClusterError
from rlix.exec.front.config import ConfigError, JobConfig, RunConfig, load_config
from rlix.exec.job.records import ActivityChange, JobStatus
from rlix.exec.messages import JobProgress, JobResult

# Deadlines (s) of the driver's calls to the scheduler actor: quick book-keeping calls, and
# the deadline the scheduler actor gives a coordinator's shrink or expand (an unreachable
# coordinator's pipeline is then unregistered).
SCHEDULER_CALL_S = 60.0
SHRINK_CALL_S = 300.0


def _join(address: str, gpus_needed: int, where: str) -> None:
    """Connect to an existing Ray cluster, failing fast with one line if it is not there.

    ``where`` names the setting the address came from (``--address`` or ``ray.address``).
    """
    import ray

    hint = "start one with 'ray start --head --num-gpus N', or leave --address out to start a local one"
    if address != "auto":
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError):
            raise ClusterError(f"{where} {address}: no Ray cluster answers there; {hint}") from None
    try:
        ray.init(address=address, log_to_driver=False)
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


@dataclass(kw_only=True)
class _Pipeline:
    pipeline_id: str
    job: JobConfig
    coordinator: object | None = None
    run_ref: object | None = None
    result: JobResult | None = None
    progress: JobProgress | None = None
    killed_at: float | None = None


class Session:
    """One run: a scheduler actor, and a coordinator per admitted pipeline."""

    def __init__(
        self, config: RunConfig, *, address: str | None = None, policy: str | None = None, out_dir: str | None = None
    ) -> None:
        import ray

        from rlix.exec.control.actor_placement import node_ids
        from rlix.exec.control.scheduler_actor import SchedulerActor

        if policy is not None:
            config = config.model_copy(update={"policy": policy})
        self.config = config
        self.out_dir = Path(out_dir or config.output.dir)
        self.cluster = config.cluster.spec()
        self.models = {j.name: str(j.model.directory(self.out_dir.parent / "_models")) for j in config.jobs}
        self.recipes = prepare_recipes(config, self.models)  # data jobs: read and tokenized before any actor starts
        where = "--address" if address else "ray.address"
        address = address or config.ray.address
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            if address:
                _join(address, self.cluster.num_gpus, where)
            else:
                ray.init(
                    num_cpus=config.ray.num_cpus or os.cpu_count(),
                    num_gpus=self.cluster.num_gpus,
                    include_dashboard=False,
                    log_to_driver=bool(os.environ.get("RLIX_WORKER_LOGS")),
                    runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}},
                )
        try:
            self.nodes = node_ids(self.cluster)
        except ClusterError:
            if self._own_ray:
                ray.shutdown()
            raise
        self.t0 = time.time()
        self.scheduler = SchedulerActor.remote(
            self.cluster, config.policy, config.scheduler.core(), self.t0, config.scheduler.plan_interval_s, SHRINK_CALL_S
        )
        ray.get(self.scheduler.start.remote(), timeout=SCHEDULER_CALL_S)
        self.pipelines: dict[str, _Pipeline] = {}
        self.events: list[ActivityChange] = []
        self._seq = 0

    def now(self) -> float:
        return time.time() - self.t0

    # ------------------------------------------------------------ lifecycle

    def register(self, job: JobConfig) -> str:
        """Allocate a pipeline id for ``job``; the coordinator registers its topology on admit."""
        self._seq += 1
        pid = f"{job.name}" if all(p.job.name != job.name for p in self.pipelines.values()) else f"{job.name}-{self._seq}"
        self.pipelines[pid] = _Pipeline(pipeline_id=pid, job=job)
        return pid

    def admit(self, pipeline_id: str) -> None:
        """Start the pipeline's coordinator; it registers with the scheduler and runs its steps."""
        from rlix.exec.job.coordinator import PipelineCoordinator

        p = self.pipelines[pipeline_id]
        p.coordinator = PipelineCoordinator.options(name=None).remote(
            pipeline_id=pipeline_id,
            job=p.job,
            model_dir=self.models[p.job.name],
            cluster=self.cluster,
            nodes=self.nodes,
            scheduler=self.scheduler,
            emulation=self.config.emulation.value(),
            t0=self.t0,
            recipe=self.recipes.get(p.job.name),
            steplog=self._steplog(p),
            heartbeat_s=self.config.scheduler.heartbeat(),
        )
        p.run_ref = p.coordinator.run.remote()

    def _steplog(self, p: _Pipeline):
        from rlix.exec.front.steplog import StepLog

        log = StepLog(self.out_dir / p.pipeline_id)
        recipe = self.recipes.get(p.job.name)
        if recipe is not None:
            log.write_data_report(data_report(recipe))
        return log

    def kill(self, pipeline_id: str) -> None:
        """Kill a running pipeline; its GPUs are released and the others carry on."""
        import ray

        p = self.pipelines[pipeline_id]
        p.killed_at = self.now()
        if p.coordinator is not None:
            self._poll(p)
            ray.kill(p.coordinator)  # its worker actors die with it (Ray owner fate-sharing)
        ray.get(self.scheduler.unregister.remote(pipeline_id), timeout=SCHEDULER_CALL_S + SHRINK_CALL_S)  # waits for its shrinks

    def holdings(self) -> dict[str, tuple[int, ...]]:
        import ray

        return ray.get(self.scheduler.holdings.remote(), timeout=SCHEDULER_CALL_S)

    # ------------------------------------------------------------ running

    def run(self, *, on_progress=None, kill_at: dict[str, float] | None = None, poll_s: float = 0.5):
        """Admit jobs at their arrival times, wait for all, and write the outputs."""
        import ray

        from rlix.exec.front.outputs import build_outputs

        for j in self.config.jobs:
            if not any(p.job is j for p in self.pipelines.values()):
                self.register(j)
        kill_at = dict(kill_at or {})
        while True:
            now = self.now()
            for p in self.pipelines.values():
                if p.coordinator is None and p.killed_at is None and now >= p.job.arrival_s:
                    self.admit(p.pipeline_id)
            for pid, t in list(kill_at.items()):
                if now >= t:
                    self.kill(pid)
                    del kill_at[pid]
            for p in self.pipelines.values():
                self._collect(p)
            if on_progress is not None:
                on_progress(self)
            if all(p.result is not None for p in self.pipelines.values()):
                break
            time.sleep(poll_s)
        end = max(max((p.result.finish_s for p in self.pipelines.values()), default=0.0), 1e-3)
        stats = ray.get(self.scheduler.stats.remote(), timeout=SCHEDULER_CALL_S)
        results = {pid: p.result for pid, p in self.pipelines.items()}
        names = {pid: p.job.name for pid, p in self.pipelines.items()}
        return build_outputs(self.config, results, names, freed_at_kills(self.events), stats, end, self.out_dir)

    def _poll(self, p: _Pipeline) -> None:
        import ray

        try:
            prog = ray.get(p.coordinator.progress.remote(), timeout=10)
        except Exception:
            return
        p.progress = prog
        self.events.extend(prog.events)

    def _collect(self, p: _Pipeline) -> None:
        import ray

        if p.result is not None or p.coordinator is None:
            return
        done, _ = ray.wait([p.run_ref], timeout=0)
        if not done:
            self._poll(p)
            return
        try:
            p.result = ray.get(p.run_ref)
            self.events.extend(p.result.events)
        except Exception as exc:  # killed or crashed coordinator process
            # A crashed job never unregistered itself: its GPUs and its admission go back now
            # (idempotent after a kill), or a queued job waiting for its home would wait forever.
            self.scheduler.unregister.remote(p.pipeline_id)
            status = JobStatus.KILLED if p.killed_at is not None else JobStatus.FAILED
            t = p.killed_at if p.killed_at is not None else self.now()
            prev = p.progress
            p.result = JobResult(
                pipeline_id=p.pipeline_id, status=status, error=type(exc).__name__, arrival_s=p.job.arrival_s, finish_s=t
            )
            if prev is None:
                return
            # its GPUs are free from the moment it was killed
            self.events.append(ActivityChange(t=t, gpus=(), activity=_free(), pipeline_id=f"!{p.pipeline_id}", stage=""))

    def shutdown(self) -> None:
        import ray

        try:
            ray.get(self.scheduler.stop.remote(), timeout=5)
            ray.kill(self.scheduler)
        except Exception:
            pass
        if self._own_ray:
            ray.shutdown()


def freed_at_kills(events: list[ActivityChange]) -> list[ActivityChange]:
    """The events in time order, with a killed pipeline's GPUs set free at its kill time
    (a kill is marked by an event whose pipeline id is ``!`` + the pipeline's)."""
    out: list[ActivityChange] = []
    holder: dict[int, str] = {}
    for e in sorted(events, key=lambda e: e.t):
        if e.pipeline_id.startswith("!"):
            dead = e.pipeline_id[1:]
            gpus = tuple(g for g, pid in sorted(holder.items()) if pid == dead)
            if gpus:
                out.append(ActivityChange(t=e.t, gpus=gpus, activity=_free(), pipeline_id="", stage=""))
                for g in gpus:
                    holder.pop(g)
            continue
        for g in e.gpus:
            holder[g] = e.pipeline_id
        out.append(e)
    return out


def prepare_recipes(config: RunConfig, models: dict[str, str]) -> dict:
    """The recipe of every data job (its prompts tokenized with the checkpoint's tokenizer, its reward
    functions tried on a few of them); :class:`ConfigError` if one cannot train.

    Prints, per job, how many prompts were left out for being longer than the model's limit, and how
    many have characters the tokenizer cannot represent.
    """
    import sys

    from rlix.exec.data.recipe import DRY_ROWS, Recipe
    from rlix.exec.data.rewards import RewardError
    from rlix.exec.data.sources import DataError

    out = {}
    for i, job in enumerate(config.jobs):
        if job.data is None:
            continue
        try:
            out[job.name] = recipe = Recipe.from_data(job, models[job.name])
        except DataError as exc:
            raise ConfigError(f"jobs[{i}].data.{exc.field}: job '{job.name}': {exc}") from None
        try:
            recipe.dry_check()
        except RewardError as exc:
            raise ConfigError(
                f"jobs[{i}].rewards[{exc.index}].function: job '{job.name}': {exc}, on a dry run over the first {DRY_ROWS} "
                "prompts with dummy completions (empty, and the prompt's own text); fix the function"
            ) from None
        for prepared in recipe.report:
            for note in _data_notes(job, prepared):
                print(f"rlix-run: job {job.name}: {note}", file=sys.stderr)
    return out


def _data_notes(job: JobConfig, prepared) -> list[str]:
    """What preparing one split of a job's data changed: prompts left out, characters lost."""
    notes = []
    if prepared.too_long:
        notes.append(
            f"{prepared.too_long} of {prepared.rows} prompts in {prepared.source} are longer than the model's "
            f"{prepared.limit} tokens with max_new_tokens {job.max_new_tokens}; left out"
        )
    if prepared.lost_prompts:
        notes.append(
            f"{prepared.lost_prompts} of {len(prepared.items)} prompts in {prepared.source} have characters the tokenizer "
            f"cannot represent ({prepared.lost_chars} in all, each now its unknown token); see the README on the built-in "
            "tokenizer's alphabet"
        )
    return notes


def data_report(recipe) -> dict:
    """What preparing a data job's prompts found (written to its data.json)."""
    names = ("train", "eval")
    return {
        name: {
            "source": p.source,
            "rows": p.rows,
            "prompts": len(p.items),
            "too_long": p.too_long,
            "limit_tokens": p.limit,
            "lost_prompts": p.lost_prompts,
            "lost_chars": p.lost_chars,
        }
        for name, p in zip(names, recipe.report)
    }


def _free():
    from rlix.metrics import Activity

    return Activity.FREE


def _pythonpath() -> str:
    """Workers import rlix from wherever the driver did (editable or not)."""
    import rlix

    root = str(Path(rlix.__file__).resolve().parent.parent)
    return os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)


def init(
    config: RunConfig | str | Path, *, address: str | None = None, policy: str | None = None, out_dir: str | None = None
) -> Session:
    """Validate ``config`` (a path or a RunConfig) and start the control plane."""
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    return Session(cfg, address=address, policy=policy, out_dir=out_dir)


def run(config: RunConfig | str | Path, **kwargs):
    """init + run + shutdown; returns :class:`rlix.exec.front.outputs.RunOutputs`."""
    on_progress = kwargs.pop("on_progress", None)
    kill_at = kwargs.pop("kill_at", None)
    session = init(config, **kwargs)
    try:
        return session.run(on_progress=on_progress, kill_at=kill_at)
    finally:
        session.shutdown()
