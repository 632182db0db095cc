"""Simulator layer: replays a trace through the policy core with SimPy.

The simulator translates SimPy happenings into core events, asks
:class:`rlix.core.Scheduler` for a plan, and carries the plan out, charging
the trace's switching costs. It decides nothing itself. Gang requests,
releases, arrivals, departures and a pipeline's rollout demand starting or
stopping are planned at once; finer demand changes are reported on the
scheduler's control-loop tick, as heartbeats would be. Both periods are the
trace's (``scheduler.plan_interval_s`` and ``scheduler.heartbeat_s``), so a
recorded run replays at its own cadence.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

import simpy

from rlix.core import Event, Plan, Policy, Scheduler, check_ledger, make_policy
from rlix.job import WorkerPhase, lower_bounds, worker_booking
from rlix.metrics import Activity, PipelineTally, RunMetrics, UsageRecorder, summarize
from rlix.sim.engine import book_worker
from rlix.sim.pipeline import Host, SimPipeline
from rlix.trace import Trace, TraceError

Progress = Callable[[float, int, int], None]  # (sim seconds, trajectories done, trajectories total)


class Simulation:
    """One replay of ``trace`` under one policy (a registered name or a :class:`Policy` object)."""

    def __init__(
        self,
        trace: Trace,
        policy: str | Policy,
        *,
        keep_segments: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self.trace = trace
        self.policy = policy if isinstance(policy, str) else policy.name
        self.plan_interval_s = trace.model.scheduler.plan_interval_s  # seconds between the control loop's plans
        self.heartbeat_s = trace.model.scheduler.heartbeat()  # seconds between re-sent demand reports
        self.progress = progress
        self.env = simpy.Environment()
        self.sched = Scheduler(trace.cluster, policy, trace.model.scheduler.to_config())
        self.usage = UsageRecorder(trace.cluster.num_gpus, keep_segments=keep_segments)
        self.gpu_ready = [0.0] * trace.cluster.num_gpus  # seconds: when each GPU's last offload ends
        self._offload_stamp = [0] * trace.cluster.num_gpus
        self.parked: dict[int, str] = {}  # GPU -> pipeline whose released gang's model is still on it
        self.demand_dirty: set[str] = set()
        self._plan_scheduled = False
        self._all_done = self.env.event()
        self.total_trajectories = trace.total_trajectories()
        host = Host(
            env=self.env,
            usage=self.usage,
            submit=self.submit,
            request_plan=self.request_plan,
            demand_changed=self.demand_dirty.add,
            waiting_changed=self._waiting_changed,
            finished=self._pipeline_finished,
            park=self._park,
        )
        self.pipelines = {p.id: SimPipeline(host, p, trace.spec(p), trace.streams[p.id]) for p in trace.pipelines}
        self._remaining = len(self.pipelines)
        self.env.process(self._ticker())

    # ------------------------------------------------------------ driving

    def run(self) -> RunMetrics:
        with _collector_paused():
            self.env.run(until=self._all_done)
        end = self.env.now
        self.usage.close(end)
        check_ledger(self.sched.ledger)
        return self._metrics(end)

    def submit(self, event: Event) -> None:
        self.sched.submit(event, self.env.now)

    def request_plan(self) -> None:
        """Plan at the current instant, once, after everything else happening now."""
        if not self._plan_scheduled:
            self._plan_scheduled = True
            self.env.process(self._plan_soon())

    def _waiting_changed(self, pipeline_id: str, waiting: bool) -> None:
        self.usage.set_waiting(self.env.now, pipeline_id, waiting)

    def _park(self, pipeline_id: str, gpus: tuple[int, ...], offload_s: float) -> None:
        """A released gang left its model on ``gpus``: its next stage there skips the load; anyone else waits for the offload."""
        ready = self.env.now + offload_s
        for g in gpus:
            self.parked[g] = pipeline_id
            self.gpu_ready[g] = max(self.gpu_ready[g], ready)

    def _pipeline_finished(self, pipeline_id: str) -> None:
        self._remaining -= 1
        if self._remaining == 0:
            self._all_done.succeed()

    def _plan_soon(self):
        yield self.env.timeout(0)
        self._plan_scheduled = False
        self._plan()

    def _ticker(self):
        env = self.env
        interval = self.plan_interval_s
        last_beat = 0.0
        while not self._all_done.triggered:
            yield env.timeout(interval)
            if env.now - last_beat >= self.heartbeat_s:
                last_beat = env.now
                self.demand_dirty.update(pid for pid, p in self.pipelines.items() if p.engine.open_n and not p.done)
            if self.demand_dirty:
                self._plan()
            if self.progress is not None:
                done = sum(p.engine.book.completed for p in self.pipelines.values())
                self.progress(env.now, done, self.total_trajectories)
            if env.peek() - env.now > 2 * interval and self._quiet():
                skip = idle_ticks(env.now, interval, env.peek(), last_beat, self.heartbeat_s)
                if skip is not None:  # the ticks before the next happening do nothing: pass them at once
                    until, last_beat = skip
                    yield env.timeout(until - env.now)

    def _quiet(self) -> bool:
        """Would a tick do nothing now: no demand to report, no job with trajectories open (no heartbeat)?"""
        return not self.demand_dirty and not any(p.engine.open_n and not p.done for p in self.pipelines.values())

    # ------------------------------------------------------------ plans

    def _plan(self) -> None:
        now = self.env.now
        for pid in sorted(self.demand_dirty):
            p = self.pipelines[pid]
            if not p.done:
                self.sched.submit(p.demand_report(), now)
        self.demand_dirty.clear()
        plan = self.sched.plan(now)
        if not plan.empty:
            self._carry_out(plan)

    def _carry_out(self, plan: Plan) -> None:
        now = self.env.now
        usage = self.usage
        for s in plan.shrinks:
            p = self.pipelines[s.worker.pipeline_id]
            p.engine.remove_worker(s.worker)
            p.tally.preemptions = p.engine.book.preemptions  # shrinks that interrupted running trajectories
            offload = p.model.switch.offload_s
            ready = now + offload
            for g in s.worker.gpus:
                self.gpu_ready[g] = ready
                self._offload_stamp[g] += 1
            if offload > 0:
                book_worker(usage, s.worker.gpus, now, WorkerPhase.OFFLOAD, p.pid)
                self.env.process(self._free_after(s.worker.gpus, ready, [self._offload_stamp[g] for g in s.worker.gpus]))
            else:
                book_worker(usage, s.worker.gpus, now, WorkerPhase.GONE)
        for grant in plan.grants:
            warm = all(self.parked.get(g) == grant.pipeline_id for g in grant.gpus)
            ready = now if warm else max(self.gpu_ready[g] for g in grant.gpus)
            for g in grant.gpus:
                self._offload_stamp[g] += 1
                self.parked.pop(g, None)
                if warm:
                    self.gpu_ready[g] = now  # the offload owed to a stranger is never paid
            self.pipelines[grant.pipeline_id].grant(grant.stage, grant.gpus, ready, warm)
        for e in plan.expands:
            w = e.worker
            p = self.pipelines[w.pipeline_id]
            for g in w.gpus:
                self._offload_stamp[g] += 1
                self.parked.pop(g, None)
            versions, sync_s = p.new_worker_versions()
            free, process = max(now, max(self.gpu_ready[g] for g in w.gpus)), p.process_up(w.gpus)
            ready = max(free, process) + p.model.switch.load_s + sync_s
            if process > free + 1e-9:  # placed before its process is up: the GPUs wait for it, then the worker wakes
                book_worker(usage, w.gpus, now, WorkerPhase.START, p.pid)
                self.env.process(self._load_after(w.gpus, process, p.pid))
            else:
                book_worker(usage, w.gpus, now, WorkerPhase.LOAD, p.pid)
            p.engine.add_worker(w, ready, versions)

    def _load_after(self, gpus: tuple[int, ...], at: float, pipeline_id: str):
        """At ``at`` the process is up: GPUs still waiting for it (not shrunk, not yet generating) load."""
        yield self.env.timeout(at - self.env.now)
        waiting = (Activity.SWITCH, pipeline_id, worker_booking(WorkerPhase.START)[1])
        if all(self.usage.doing(g) == waiting for g in gpus):
            book_worker(self.usage, gpus, self.env.now, WorkerPhase.LOAD, pipeline_id)

    def _free_after(self, gpus: tuple[int, ...], at: float, stamps: list[int]):
        yield self.env.timeout(at - self.env.now)
        still = [g for g, st in zip(gpus, stamps) if self._offload_stamp[g] == st]
        if still:
            book_worker(self.usage, still, self.env.now, WorkerPhase.GONE)

    # ------------------------------------------------------------ results

    def _metrics(self, end: float) -> RunMetrics:
        tallies: dict[str, PipelineTally] = {}
        for pid, p in sorted(self.pipelines.items()):
            tallies[pid] = p.tally
            # Adapter loads inside busy workers were timed as work; book them as switching.
            self.usage.rebook(pid, p.engine.weights.switch_extra, Activity.WORK, Activity.SWITCH)
        completed = sum(p.engine.book.completed for p in self.pipelines.values())
        work_lb, path_lb = lower_bounds(self.trace.job_shapes(), self.trace.cluster.num_gpus)
        return summarize(
            policy=self.policy,
            usage=self.usage,
            start=0.0,
            end=end,
            tallies=tallies,
            lower_bound_work_s=work_lb,
            lower_bound_critical_path_s=path_lb,
            trajectories_requeued=sum(p.engine.book.requeued for p in self.pipelines.values()),
            trajectories_lost=self.total_trajectories - completed,
            plans=self.sched.plans_made,
        )


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a replay runs.

    A replay allocates about a million trajectory objects that live for a
    while and are freed by reference counting, never in cycles (a large trace
    leaves a few hundred cyclic objects, SimPy's finished processes, collected
    after the replay); the collector would walk them again and again, about a
    tenth of a large replay's time. Results do not depend on it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def idle_ticks(now: float, interval: float, until: float, last_beat: float, heartbeat: float) -> tuple[float, float] | None:
    """The control loop's ticks from ``now`` (a tick) up to before ``until`` (the next happening), where
    none does anything: (the last of them, the last heartbeat's time as of it), or None if fewer than two.

    Exactly as ticking one by one would give them (``now + interval``, again and again, in floats):
    computed only where every such sum is exact (the times and the interval dyadic, with few enough
    bits: the default 5 s from 0 always are), else None and the loop ticks on. The heartbeat falls on
    the first tick at least ``heartbeat`` after the last, so its ticks recur every
    ``ceil(heartbeat / interval)``. So a trace with a late arrival replays in the time of its work,
    not of its clock (an arrival at 1e7 s took 6 s of idle ticks per replay).
    """
    if not math.isfinite(until):
        return None
    t0, step, end, beat = Fraction(now), Fraction(interval), Fraction(until), Fraction(last_beat)
    last = math.ceil((end - t0) / step) - 1  # the last tick index k with now + k x interval < until
    scale = max(t0.denominator, step.denominator, beat.denominator)  # powers of two: their lcm is the largest
    if last < 2 or (t0 + last * step) * scale >= 2**53:
        return None
    first = max(1, math.ceil((beat + Fraction(heartbeat) - t0) / step))  # the next heartbeat's tick
    if first <= last:
        stride = math.ceil(Fraction(heartbeat) / step)
        beat = t0 + (first + (last - first) // stride * stride) * step
    tick = float(t0 + last * step)
    return (tick, float(beat)) if now + (tick - now) == tick else None


def replay_refusal(trace: Trace, policies: list[str]) -> str | None:
    """Why ``trace`` cannot be replayed under ``policies`` (found before any replay), naming its file, or None:
    a stream whose draw passes any clock, or a job a policy cannot place (:func:`policy_misfit`)."""
    try:
        trace.streams  # noqa: B018 -- drawn now: a draw past any clock is refused here, not mid-replay
    except TraceError as exc:
        return str(exc)  # it names the trace's file
    misfit = policy_misfit(trace, policies)
    return misfit and f"{trace.source}: {misfit}"


def policy_misfit(trace: Trace, policies: list[str]) -> str | None:
    """Why a job of ``trace`` could not roll out under one of ``policies`` (found before any replay: the
    simulator would fail at its arrival), or None. Under ``static`` and ``partial_overlap`` a job rolls out
    only on the ``actor_infer`` bundles inside its home."""
    for name in policies:
        policy = make_policy(name)
        for i, p in enumerate(trace.pipelines):
            if not policy.rollout_bundles(trace.spec(p)):
                return (
                    f"pipelines[{i}] ('{p.id}'): no actor_infer bundle lies inside its home GPUs, so it cannot roll out "
                    f"under {name}; widen its home or move its actor_infer mapping into it, or leave {name} out (--policy)"
                )
    return None


def replay(trace: Trace, policy: str | Policy, **kwargs) -> RunMetrics:
    return Simulation(trace, policy, **kwargs).run()
