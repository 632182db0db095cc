"""Executor layer: one pipeline's rollout worker processes, started and lost.

Processes start *warm*, asleep on their bundles (no device memory held), so a
plan's expand is a wake and a weight sync, never a cold start. A process that
cannot start, dies or misses a deadline is killed and counted lost: its GPUs
go back to the scheduler (``WorkerLost``, which cools the bundle down), and
the rollout control continues its trajectories elsewhere. A wake its device
refuses keeps the process, asleep, and gives the GPUs back the same way.
"""

from __future__ import annotations

import asyncio
import logging

from rlix.exec.deadline import call
from rlix.exec.recorder import Recorder
from rlix.exec.records import SwitchKind
from rlix.exec.rollout.dispatch import book_worker
from rlix.exec.rollout.hooks import Deadlines, Hooks, Processes
from rlix.exec.rollout.pool import Worker, WorkerPool, WorkerState
from rlix.job import WorkerPhase

LOG = logging.getLogger("rlix.rollout")  # why a worker was lost (in the job's Ray log; RLIX_WORKER_LOGS=1 shows it)
GRANT_POLL_S = 0.25  # how often a spare start waiting for the home's processes looks whether it was granted


class WorkerLifecycle:
    """Start, kill and count lost the worker processes of one pipeline (see the module docstring)."""

    def __init__(
        self, *, pool: WorkerPool, recorder: Recorder, hooks: Hooks, deadlines: Deadlines, model_dir: str, procs: Processes
    ) -> None:
        self.pool = pool
        self.rec = recorder
        self.hooks = hooks
        self.deadlines = deadlines
        self.model_dir = model_dir
        self.procs = procs
        self.starting: dict[int, asyncio.Task] = {}
        self.spawned: set[int] = set()  # bundles that had a process (a replacement runs without faults)
        self.sure: list[asyncio.Task] = []  # warm starts that are not spare: the spare ones start after them
        self.ended = False  # the job is over: its processes are being killed on purpose, none is lost

    def warm(self, bundles, *, spare: bool = False) -> None:
        """Start a sleeping process on every bundle, in the background (no GPU held, no waiting);
        ``spare``: bundles the job may never use, started once its other warm starts are up."""
        for gpus in bundles:
            task = self.start(self.pool.get(tuple(gpus)), spare=spare)
            if not spare:
                self.sure.append(task)

    def start(self, w: Worker, *, spare: bool = False) -> asyncio.Task:
        """The task starting ``w``'s process (begun now unless one runs, or ran and left it dead): True once up."""
        task = self.starting.get(w.first)
        if task is None or (task.done() and w.state is WorkerState.DEAD):
            self.pool.move(w, WorkerState.STARTING)  # at once: the next demand report names it starting
            task = self.starting[w.first] = asyncio.get_running_loop().create_task(self._boot(w, spare))
        return task

    async def _boot(self, w: Worker, spare: bool) -> bool:
        # The processes the job will use come first: a spare never slows their start (unless granted meanwhile).
        while spare and not w.granted and (sure := [task for task in self.sure if not task.done()]):
            await asyncio.wait(sure, timeout=GRANT_POLL_S)
        if w.state is not WorkerState.STARTING:
            return False  # killed meanwhile (the job ended): start nothing
        t, background = self.hooks.now(), not w.granted  # warming (no GPU held), or a cold start for an expand
        try:
            w.handle = self.hooks.spawn(w.gpus, w.first not in self.spawned, spare and background)
            self.spawned.add(w.first)
            await call(w.handle.prepare.remote(self.model_dir), self.deadlines.call_s, "worker start-up")
        except Exception as exc:  # noqa: BLE001 -- any failure to start means no worker here
            self.kill(w, f"start-up failed: {type(exc).__name__}")
            return False
        if background:  # the start-up a replay models (a cold start is booked by the expand)
            self.rec.switch(SwitchKind.PROCESS_START, t, self.hooks.now() - t)
        self.pool.move(w, WorkerState.ASLEEP)
        self.hooks.changed()  # up: a worker may go there now
        return True

    def kill(self, w: Worker, why: str) -> None:
        """The worker is gone: kill its process, give its GPUs back, continue its work elsewhere."""
        if w.state is WorkerState.DEAD:
            return
        if w.handle is not None:
            self.procs.kill(w.handle)
        self._lose(w, WorkerState.DEAD, f"lost: {why}", give_back=w.granted)

    def stand_down(self, w: Worker, gen: int, why: str) -> None:
        """A wake its device refused (short of memory): the process stays asleep, its GPUs go back as a
        lost worker's do, so the scheduler places no worker of this job there for a while (a backoff).
        If a plan call came meanwhile (a shrink has given the GPUs back already, and a newer expand
        will wake it again), only the process's state changes."""
        self._lose(w, WorkerState.ASLEEP, f"did not wake, kept asleep: {why}", give_back=w.generation == gen)

    def _lose(self, w: Worker, state: WorkerState, why: str, *, give_back: bool) -> None:
        """Count the worker lost, move its process to ``state``, and (``give_back``: its GPUs are still
        the job's) report them lost to the scheduler, which cools the bundle down. Once the job has
        ended, a call failing because teardown killed its process loses nothing: only the state moves."""
        self.pool.move(w, state)
        if self.ended:
            return
        LOG.warning("%s: rollout worker on GPUs %s %s", self.rec.pid, list(w.gpus), why)
        self.rec.counters.workers_lost += 1
        if give_back:
            w.granted = False
            book_worker(self.rec, self.hooks.now(), w, WorkerPhase.GONE)
            self.hooks.lost(w.gpus, True)
        self.hooks.changed()

    def end(self) -> list:
        """The job is over: every worker process it started, for teardown to kill (dead ones included:
        killing twice is harmless). A wake or sleep still in flight then fails quietly, counting no
        worker lost and reporting nothing to the scheduler (unregistering frees every GPU)."""
        self.ended = True
        return [w.handle for _, w in sorted(self.pool.workers.items()) if w.handle is not None]
