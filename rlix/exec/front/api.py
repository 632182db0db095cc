"""Executor layer: the Python API behind ``rlix-run`` (for notebooks and other frameworks).

    from rlix.exec.front import api
    session = api.init("examples/cpu_two_jobs.yaml")      # or a RunConfig; address= joins a cluster
    pid = session.register(session.config.jobs[0])       # allocate an id, register the topology
    session.admit(pid)                                   # start its coordinator
    outputs = session.run()                              # admits the rest at their arrival, waits, writes outputs
    session.shutdown()

``api.run(config)`` does all of it. ``session.kill(pid)`` stops a pipeline;
its GPUs go back to the others.

With an address (``address=``, the config's ``ray.address``, or Ray's
``RAY_ADDRESS``), the run's jobs go to the cluster's shared scheduler
service (:mod:`rlix.exec.front.submission`) and share its GPUs with every other
submitter's; without one, the run starts a local Ray and a private scheduler.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rlix import protocol
from rlix.exec.config import ConfigError, JobConfig, RunConfig, absolute_paths, check_topology, load_config
from rlix.exec.control.gpu_reservation import release
from rlix.exec.deadline import Interrupted
from rlix.exec.error_text import describe
from rlix.exec.front.host_memory import available_gb, with_host_memory
from rlix.exec.front.joblines import job_line
from rlix.exec.front.rerun import check_resume_shapes, nothing_left, prepare_rerun, resume_steps
from rlix.exec.front.runlog import RunLog
from rlix.exec.front.submission import Submission, joins_shared
from rlix.exec.messages import LOAD_WAIT, JobProgress, JobResult
from rlix.exec.records import ActivityChange, JobStatus
from rlix.exec.service.connect import SHRINK_CALL_S
from rlix.exec.service.logs import NAME as RUN_LOG
from rlix.protocol import GpuMap, SchedulerStats, Stopped
from rlix.ray_runtime import init_local_ray, worker_pythonpath
from rlix.transport import SCHEDULER_CALL_S, ClusterError, RayTransport, answers  # noqa: F401 -- rlix-run catches api.ClusterError, api.Interrupted

# Seconds a stopped job has to end its run before its coordinator is killed.
STOP_GRACE_S = 8.0


@dataclass(kw_only=True)
class _Pipeline:
    pipeline_id: str
    job: JobConfig
    coordinator: object | None = None
    run_ref: object | None = None
    result: JobResult | None = None
    progress: JobProgress | None = None
    killed_at: float | None = None
    admission: str | None = None  # why its model load waits for its queues (None: it does not)

    def poll(self, events: list[ActivityChange]) -> None:
        """Ask the coordinator for its progress (its activity changes go to ``events``)."""
        import ray

        try:
            prog = ray.get(self.coordinator.progress.remote(), timeout=10)
        except Exception:
            return
        self.progress = prog
        events.extend(prog.events)

    def collect(self, session: Session) -> None:
        """Its result once its run returned (a crashed or killed coordinator's made here), else its progress."""
        import ray

        if self.result is not None or self.coordinator is None:
            return
        done, _ = ray.wait([self.run_ref], timeout=0)
        if not done:
            self.poll(session.events)
            if self.progress is not None and self.progress.phase == LOAD_WAIT:  # queued for admission? say why
                self.admission = session.scheduler.call_sync(protocol.AdmissionRefusal(pipeline_id=self.pipeline_id), 10)
            else:
                self.admission = None
            return
        try:
            self.result = ray.get(self.run_ref)
            session.events.extend(self.result.events)
        except Exception as exc:  # killed or crashed coordinator process
            # A crashed job never unregistered itself: its GPUs and its admission go back now
            # (idempotent after a kill), or a queued job waiting for its home would wait forever.
            session.scheduler.send(protocol.Unregister(pipeline_id=self.pipeline_id))
            killed = self.killed_at is not None
            t = self.killed_at if killed else session.now()
            error = "" if killed else describe(exc, session.out_dir / self.pipeline_id)
            status = JobStatus.KILLED if killed else JobStatus.FAILED
            last = self.progress  # its counts as of its last progress poll: the coordinator's own are gone
            self.result = JobResult(
                pipeline_id=self.pipeline_id,
                status=status,
                error=error,
                arrival_s=self.job.arrival_s,
                finish_s=t,
                requeued=last.requeued if last is not None else 0,
                workers_lost=last.workers_lost if last is not None else 0,
            )
            if self.progress is not None:  # it held GPUs: they are free from the moment it was killed
                session.events.append(
                    ActivityChange(t=t, gpus=(), activity=_free(), pipeline_id=f"!{self.pipeline_id}", stage="")
                )


def start_local_ray(config: RunConfig, num_gpus: int) -> None:
    """A Ray of this run's own: the config's CPUs (the machine's by default) and ``num_gpus`` GPUs,
    worker logs on the driver only with ``RLIX_WORKER_LOGS``, workers importing this checkout's rlix."""
    init_local_ray(
        num_cpus=config.ray.num_cpus or os.cpu_count(),
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=bool(os.environ.get("RLIX_WORKER_LOGS")),
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
        # Every rlix worker is an actor with an environment of its own, so the idle workers Ray starts for
        # tasks (one per CPU) would only cost a Python start each and their memory.
        _system_config={"prestart_worker_first_driver": False},
    )


class Session:
    """One run: a scheduler actor, and a coordinator per admitted pipeline."""

    def __init__(
        self,
        config: RunConfig,
        *,
        address: str | None = None,
        policy: str | None = None,
        out_dir: str | None = None,
        source: str = "",
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """``source``: the config's file, if it came from one (a shared scheduler's history names it);
        ``stop``: asked while the data jobs are prepared (a Ctrl-C then raises
        :class:`~rlix.exec.deadline.Interrupted`: no job has started)."""
        import ray

        if policy is not None:
            config = config.model_copy(update={"policy": policy})
        self.config = config = absolute_paths(config, Path.cwd())  # actors' working directory is Ray's, not ours
        self.out_dir = Path(out_dir).resolve() if out_dir else Path(config.output.dir)
        where = "--address" if address else ("ray.address" if config.ray.address else "RAY_ADDRESS")
        self._own_ray = not ray.is_initialized()
        address = joins_shared(address, config) if self._own_ray else None
        if address:  # a cluster that is not there is said at once, before any model is built
            answers(address, where)
        elif problem := config.scheduler.tenant_error([j.tenant for j in config.jobs], "jobs"):
            raise ConfigError(problem)  # a private run's scheduler is the config's own: its tenants are all there are
        # Jobs whose checkpoints hold all their steps train nothing: no model, data or memory of theirs is checked.
        self.resumes = {j.name: resume_steps(j) for j in config.jobs}
        done = frozenset(j.name for j in config.jobs if self.trained_already(j))
        models = self.out_dir.parent / "_models"
        self.models = {j.name: str(j.model.directory(models)) for j in config.jobs if j.name not in done}
        if not address:  # a private scheduler on the config's cluster (the default one if it has no cluster block)
            check_topology(config)
            self.config = config = with_host_memory(config, self.models, available_gb(), done)  # co-tenants share the host
            check_topology(config)  # again, with each job's resident memory now known: a queue that never admits it
        check_resume_shapes(config, self.models, self.resumes)
        check_lora_targets(config, self.models, done)
        check_completion_room(config, self.models, done)
        # data jobs: read and tokenized before any actor starts (Interrupted by a Ctrl-C meanwhile)
        self.recipes = prepare_recipes(config, self.models, done, stop)
        self.submission = Submission.join(config, address, where, source) if address else None
        if self.submission is not None:  # the shared scheduler's cluster (checked against the config's)
            self.config = config = self.submission.config
            self.out_dir = self.out_dir / self.submission.run_name()  # a run through the scheduler writes under its id
            ids = ", ".join(f"{c.name} as {c.id}" for c in self.submission.jobs)
            print(f"rlix-run: submitted to the rlix scheduler at {address}: {ids}; outputs in {self.out_dir}", file=sys.stderr)
        self.cluster = config.cluster.spec()
        self.gpu_map = GpuMap()  # the GPUs reserved in Ray (once started)
        try:
            if self.submission is not None:  # where rlix logs finds the run's lines
                self.submission.log_at(f"{socket.gethostname()}:{self.out_dir.resolve() / RUN_LOG}")
            self._start(config, address)
        except BaseException:
            if self.submission is not None:  # its claims go at once, not when their lease runs out
                self.submission.leave()
            elif self.gpu_map.groups:  # its own reservation (a Ray it joined may run other work after it)
                release(self.gpu_map)
            if self._own_ray:
                ray.shutdown()
            raise

    def _start(self, config: RunConfig, address: str | None) -> None:
        """Fresh logs, then the local Ray (no address), the GPUs reserved, and a private scheduler (no service)."""

        from rlix.exec.control.gpu_reservation import own_devices, reserve
        from rlix.exec.service.scheduler_actor import SchedulerActor

        runs = self.out_dir.parent if self.submission is not None else None  # where earlier runs through it wrote
        prepare_rerun(config, self.out_dir, runs, self.resumes)  # says which jobs resume (stderr); fresh logs
        self.pipelines: dict[str, _Pipeline] = {}
        self.events: list[ActivityChange] = []
        self._seq = 0
        self.stopped_at: float | None = None  # when stop() was called
        self.scheduler: RayTransport | None = None
        if self.submission is None and all(self.trained_already(j) for j in config.jobs):
            self.t0 = time.time()  # every job's checkpoints hold all its steps: no Ray, no scheduler, nothing to run
            print("rlix-run: every job's checkpoints hold all its steps: nothing to train", file=sys.stderr)
            return
        devices = None  # the GPUs' ids, when this run's own Ray has them all (else each bundle is asked)
        if self._own_ray and not address:
            start_local_ray(config, self.cluster.num_gpus)
            devices = own_devices(self.cluster.num_gpus)
        # The GPUs, reserved in Ray: the service's (it reserved them when it started), or this run's own.
        if self.submission is not None:
            self.gpu_map = self.submission.info.gpus
        else:
            self.gpu_map = reserve(self.cluster, devices=devices)
        self.t0 = time.time()
        if self.submission is not None:
            self.scheduler = self.submission.scheduler
        else:
            actor = SchedulerActor.remote(
                self.cluster, config.policy, config.scheduler.core(), self.t0, config.scheduler.plan_interval_s, SHRINK_CALL_S
            )
            self.scheduler = RayTransport(actor)
            self.scheduler.call_sync(protocol.Start())

    def now(self) -> float:
        return time.time() - self.t0

    # ------------------------------------------------------------ lifecycle

    def register(self, job: JobConfig) -> str:
        """Allocate a pipeline id for ``job``; the coordinator registers its topology on admit."""
        self._seq += 1
        pid = f"{job.name}" if all(p.job.name != job.name for p in self.pipelines.values()) else f"{job.name}-{self._seq}"
        self.pipelines[pid] = _Pipeline(pipeline_id=pid, job=job)
        return pid

    def trained_already(self, job: JobConfig) -> bool:
        """Its checkpoints hold all its steps (earlier runs trained them): it has nothing left to train."""
        return nothing_left(job, self.resumes.get(job.name, {}))

    def admit(self, pipeline_id: str) -> None:
        """Start the pipeline's coordinator; it registers with the scheduler and runs its steps. A job
        :meth:`trained_already` starts nothing and claims no GPU: it has finished (a shared scheduler is told so)."""
        p = self.pipelines[pipeline_id]
        if self.trained_already(p.job):
            now, trained = self.now(), sum(self.resumes[p.job.name].values())
            p.result = JobResult(
                pipeline_id=pipeline_id,
                status=JobStatus.FINISHED,
                arrival_s=now,
                finish_s=now,
                steps_before=trained,
                steps_planned=trained,
                trained_already=True,
            )
            if self.submission is not None:  # its claim ends finished, not cancelled when the run leaves
                self.scheduler.call_sync(protocol.Unregister(pipeline_id=pipeline_id, status=protocol.Outcome.FINISHED))
            return
        from rlix.exec.job.coordinator import PipelineCoordinator

        p.coordinator = PipelineCoordinator.options(name=None).remote(
            pipeline_id=pipeline_id,
            job=p.job,
            model_dir=self.models[p.job.name],
            cluster=self.cluster,
            gpu_map=self.gpu_map,
            scheduler=self.scheduler,
            emulation=self.config.emulation.value(),
            t0=self.t0,
            recipe=self.recipes.get(p.job.name),
            steplog=step_log(self.out_dir / p.pipeline_id, self.recipes.get(p.job.name)),
            heartbeat_s=self.config.scheduler.heartbeat(),
            submitter=self.submission.submitter if self.submission is not None else "",
        )
        p.run_ref = p.coordinator.run.remote()

    def kill(self, pipeline_id: str) -> None:
        """Kill a running pipeline; its GPUs are released and the others carry on."""
        import ray

        p = self.pipelines[pipeline_id]
        p.killed_at = self.now()
        if p.coordinator is not None:
            p.poll(self.events)
            ray.kill(p.coordinator)  # its worker actors die with it (Ray owner fate-sharing)
        if self.scheduler is None:  # nothing was started (nothing to train)
            return
        gone = protocol.Unregister(pipeline_id=pipeline_id)
        self.scheduler.call_sync(gone, SCHEDULER_CALL_S + SHRINK_CALL_S)  # returns once its workers are shrunk

    def holdings(self) -> dict[str, tuple[int, ...]]:
        """The GPUs each pipeline holds now ({} in a run with nothing to train: no scheduler started)."""
        return self.scheduler.call_sync(protocol.Holdings()) if self.scheduler is not None else {}

    # ------------------------------------------------------------ running

    def run(self, *, on_progress=None, kill_at: dict[str, float] | None = None, poll_s: float = 0.5, stop=None):
        """Admit jobs at their arrival times, wait for all, and write the outputs.

        ``stop``: a callable; once it returns True every job is stopped (as
        :meth:`stop` does) and the outputs say they are partial. A
        KeyboardInterrupt while waiting does the same; a second one is raised.
        """
        for j in self.config.jobs:
            if not any(p.job is j for p in self.pipelines.values()):
                self.register(j)
        kill_at = dict(kill_at or {})
        log = RunLog(self.out_dir)  # every job's changes, as the live view shows them (rlix logs follows it)

        def progress(session) -> None:
            log(session)
            if on_progress is not None:
                on_progress(session)

        try:
            while True:
                try:
                    if stop is not None and stop() and self.stopped_at is None:
                        self.stop()
                    if self._tick(progress, kill_at):
                        break
                    time.sleep(poll_s)
                except KeyboardInterrupt:
                    if self.stopped_at is not None:
                        raise
                    self.stop()
            return self._outputs()
        finally:
            log.close()

    def _tick(self, on_progress, kill_at: dict[str, float]) -> bool:
        """One poll: admit, kill, collect, show; True once every job has its result."""
        now = self.now()
        if self.submission is not None:  # jobs `rlix cancel` stopped: not started never start, started ones stop
            for pid, why in self.submission.take_cancelled():
                self._cancel(pid, now, why)
        for p in self.pipelines.values():
            due = now >= p.job.arrival_s or self.trained_already(p.job)  # nothing to train: it ends at once
            if p.coordinator is None and p.result is None and p.killed_at is None and due:
                self.admit(p.pipeline_id)
        for pid, t in list(kill_at.items()):
            if now >= t:
                self.kill(pid)
                del kill_at[pid]
        if self.stopped_at is not None and now - self.stopped_at > STOP_GRACE_S:
            for p in self.pipelines.values():  # a job that did not stop in time is killed
                if p.result is None and p.killed_at is None:
                    self.kill(p.pipeline_id)
        for p in self.pipelines.values():
            p.collect(self)
        if self.submission is not None:
            self.submission.ended(p.job.name for p in self.pipelines.values() if p.result is not None)
        if on_progress is not None:
            on_progress(self)
        return all(p.result is not None for p in self.pipelines.values())

    def _cancel(self, pipeline_id: str, now: float, why: Stopped | None = None) -> None:
        """End one job cancelled (``why``: through the scheduler, by whom; None: by this run): one not
        started never starts; a running one stops (its run ends cancelled)."""
        p = self.pipelines.get(pipeline_id)
        if p is None or p.result is not None:
            return
        if p.coordinator is None:
            error = why.line() if why is not None else ""
            p.result = JobResult(
                pipeline_id=p.pipeline_id, status=JobStatus.CANCELLED, error=error, arrival_s=now, finish_s=now, stopped=why
            )
        else:
            p.coordinator.stop.remote(why)

    def stop(self) -> None:
        """Stop every job now, keeping what each has done (status cancelled; the outputs say they are partial).

        Jobs not admitted yet never start; running ones end their run at once
        (killed if they have not within ``STOP_GRACE_S``).
        """
        self.stopped_at = now = self.now()
        for pid in list(self.pipelines):
            self._cancel(pid, now)

    def _outputs(self):
        return session_outputs(self)

    def shutdown(self) -> None:
        import ray

        if self.submission is not None:  # the shared scheduler stays; this run's claim ends
            self.submission.leave()
            ray.shutdown()
            return
        if self.scheduler is None:  # nothing was started (nothing to train)
            return
        try:
            self.scheduler.call_sync(protocol.Stop(), 5)
            ray.kill(self.scheduler.actor)
        except Exception:
            pass
        release(self.gpu_map)  # this run's GPU reservation (a Ray it joined may run other work after it)
        if self._own_ray:
            ray.shutdown()


def step_log(job_dir: Path, recipe):
    """A job's per-step log (its data report written first, for a data job)."""
    from rlix.exec.job.steplog import StepLog

    log = StepLog(job_dir)
    if recipe is not None:
        log.write_data_report(data_report(recipe))
    return log


def session_outputs(session: Session):
    """Every output of a session whose jobs all have their results (:class:`rlix.exec.front.outputs.RunOutputs`)."""
    import ray

    from rlix.exec.front.outputs import build_outputs

    pipelines = session.pipelines
    end = max(max((p.result.finish_s for p in pipelines.values()), default=0.0), 1e-3)
    stats = SchedulerStats(plans=0, plan_s=0.0)  # no scheduler (nothing to train), or one stopped: no counts
    try:
        if session.scheduler is not None:
            stats = session.scheduler.call_sync(protocol.Stats())
    except ray.exceptions.RayActorError:  # a shared scheduler stopped (rlix scheduler stop --force)
        pass
    if session.submission is not None:  # the shared scheduler's clock started before this run
        unmet = ((session.submission.to_run_clock(t, session.t0), w) for t, w in stats.unmet)
        stats = replace(stats, unmet=tuple((max(t, 0.0), w) for t, w in unmet))
    results = {pid: p.result for pid, p in pipelines.items()}
    names = {pid: p.job.name for pid, p in pipelines.items()}
    events = freed_at_kills(session.events)
    out = build_outputs(
        session.config,
        results,
        names,
        events,
        stats,
        end,
        session.out_dir,
        session.stopped_at,
        started_at=session.t0,
        shared=session.submission is not None,
    )
    return replace(out, lines=tuple(job_line(p, end) for _, p in sorted(pipelines.items())))


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


def check_lora_targets(config: RunConfig, models: dict[str, str], skip: frozenset[str] = frozenset()) -> None:
    """:class:`ConfigError` where none of a multi-LoRA job's ``lora.target_modules`` names a module of its
    model, as peft refuses them (found before any actor, not by the trainer after its model load). ``skip``:
    jobs left unchecked (by name: those with nothing left to train)."""
    from rlix.exec.data.model import missing_targets, module_names

    for i, job in enumerate(config.jobs):
        if job.kind != "multi_lora" or job.name in skip:
            continue
        try:
            names = module_names(models[job.name])
        except Exception:  # noqa: BLE001 -- a model transformers cannot build from its config alone: its trainer says why
            continue
        targets = job.lora.target_modules
        if len(missing_targets(targets, names)) == len(targets):  # peft's own refusal: not one of them matches
            linear = sorted({n.rpartition(".")[2] for n in names if n.rpartition(".")[2].endswith("proj")})
            raise ConfigError(
                f"jobs[{i}].lora.target_modules: job '{job.name}': none of {', '.join(targets)} names a module of its "
                f"model; name its layers, e.g. {', '.join(linear[:8]) or 'the names of model.named_modules()'}"
            )


def check_completion_room(config: RunConfig, models: dict[str, str], skip: frozenset[str] = frozenset()) -> None:
    """:class:`ConfigError` where a job's ``max_new_tokens`` leaves no room for a prompt in its model's
    positions (a data job's prompts are measured against the limit as they are tokenized). ``skip``: as
    :func:`check_lora_targets`'s."""
    from rlix.exec.data.sources import model_limit

    for i, job in enumerate(config.jobs):
        if job.name in skip:
            continue
        limit = model_limit(models[job.name])
        if job.max_new_tokens >= limit:
            raise ConfigError(
                f"jobs[{i}].max_new_tokens: job '{job.name}': {job.max_new_tokens} tokens leave no room for a prompt in "
                f"its model's {limit} positions; give fewer"
            )


def prepare_recipes(
    config: RunConfig, models: dict[str, str], skip: frozenset[str] = frozenset(), stop: Callable[[], bool] | None = None
) -> dict:
    """The recipe of every data job not in ``skip`` (its prompts tokenized with the checkpoint's tokenizer, its
    reward functions tried on a few of them); :class:`ConfigError` if one cannot train;
    :class:`~rlix.exec.deadline.Interrupted` once ``stop()`` says so.

    Prints, per job, how many prompts were left out for being longer than the model's limit, and how
    many have characters the tokenizer cannot represent.
    """
    import sys

    from rlix.exec.data.recipe import DRY_ROWS, Recipe
    from rlix.exec.data.rewards import RewardError
    from rlix.exec.data.sources import DataError

    out = {}
    for i, job in enumerate(config.jobs):
        if job.data is None or job.name in skip:
            continue
        if stop is not None and stop():
            raise Interrupted
        try:
            out[job.name] = recipe = Recipe.from_data(job, models[job.name])
        except DataError as exc:
            raise ConfigError(f"jobs[{i}].data.{exc.field}: job '{job.name}': {exc}") from None
        # The dry run's deadline: DRY_TIMEOUT_S, or the job's own reward deadline where its config sets one.
        given = job.limits.reward_timeout_s if "reward_timeout_s" in job.limits.model_fields_set else None
        try:
            recipe.dry_check(timeout_s=given, stop=stop)
        except RewardError as exc:
            field = f"rewards[{exc.index}].function" if exc.index >= 0 else "rewards"
            raise ConfigError(
                f"jobs[{i}].{field}: job '{job.name}': {exc}, on a dry run over the first {DRY_ROWS} "
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
            f"cannot represent ({prepared.lost_chars} in all, each now its unknown token); see docs/executor.md on the "
            "built-in tokenizer's alphabet"
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


def init(
    config: RunConfig | str | Path,
    *,
    address: str | None = None,
    policy: str | None = None,
    out_dir: str | None = None,
    source: str = "",
    stop: Callable[[], bool] | None = None,
) -> Session:
    """Validate ``config`` (a path or a RunConfig) and start the control plane. ``source``: where the config
    came from (default: the path given, on this host), for a shared scheduler's history; ``stop``: as
    :class:`Session`'s."""
    if not isinstance(config, RunConfig):
        source = source or config_source(config)
        config = load_config(config)
    return Session(config, address=address, policy=policy, out_dir=out_dir, source=source, stop=stop)


def config_source(path: str | Path) -> str:
    """A config file as history names it: ``host:/absolute/path``."""
    return f"{socket.gethostname()}:{Path(path).resolve()}"


def run(config: RunConfig | str | Path, **kwargs):
    """init + run + shutdown; returns :class:`rlix.exec.front.outputs.RunOutputs`."""
    on_progress = kwargs.pop("on_progress", None)
    kill_at = kwargs.pop("kill_at", None)
    stop = kwargs.pop("stop", None)
    session = init(config, stop=stop, **kwargs)
    try:
        return session.run(on_progress=on_progress, kill_at=kill_at, stop=stop)
    finally:
        session.shutdown()
