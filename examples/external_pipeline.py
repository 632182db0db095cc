"""A pipeline written outside rlix's recipe, run under the cluster's shared rlix scheduler.

Its own task (a multi-armed bandit), its own policy (a softmax over the arms,
in torch), its own rollout engine (Ray actors it starts and stops when the
scheduler says) and its own short loop; it speaks to the scheduler only
through :mod:`rlix.client`:

    python examples/external_pipeline.py --address HOST:PORT --name bandit --steps 8 --gpus 2,3

The calls, in order (the :class:`BanditPipeline` actor makes them):

1. ``register(spec, endpoint)``: training on ``--gpus`` (its home), rollout on
   any GPU of the cluster, and the actor itself as the endpoint, which the
   scheduler calls with ``expand(gpus)``, ``shrink(gpus, reason)`` and ``stop()``;
2. ``request(INIT)`` (the model load's GPUs): the policy is built, then
   ``release(INIT, demand)`` announces the first batch;
3. each step: the rollout workers (as many as the scheduler expands, one at
   least) play the batch while its demand is reported; ``report`` of no demand;
   ``request(ACTOR_TRAIN)``; a REINFORCE update; ``release(ACTOR_TRAIN, demand)``
   announcing the next batch; ``note(...)`` for ``rlix status``;
4. ``unregister("finished")`` (or ``"failed"`` with the error, ``"cancelled"``).

A trajectory's outcome depends only on the seed, the step, its index and the
policy, never on the worker that played it: the rewards are those of
:func:`train_in_process`, however the scheduler moves the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import ray
import torch

from rlix import protocol
from rlix.client import Client, SchedulerGone, connect
from rlix.config import parse_gpus
from rlix.core import ClusterSpec, PipelineSpec, ReportDemand, Role, RoleSpec, SchedulingError, Stage, WorkerLoad
from rlix.core.topology import validate_pipeline
from rlix.core.types import Gpus
from rlix.protocol import JobNote, NameTaken
from rlix.transport import ClusterError

ARMS = 8
REPORT_S = 0.25  # seconds between demand reports while a batch is played
TRAIN_S = 0.2  # seconds an update holds its GPUs (stands in for a model's update on the device)

# ------------------------------------------------------------------ the task and the learning rule


@dataclass(frozen=True)
class Traj:
    idx: int
    arm: int
    reward: float
    gpu: int  # first GPU of the worker that played it (-1: in-process)


def arm_means(seed: int, arms: int = ARMS) -> tuple[float, ...]:
    """Each arm pays 1 with its own probability, drawn from the seed."""
    rng = random.Random(f"arms/{seed}")
    return tuple(round(rng.random(), 3) for _ in range(arms))


def play(probs: list[float], means: tuple[float, ...], seed: int, step: int, idx: int) -> tuple[int, float]:
    """One trajectory: an arm drawn from ``probs``, and its reward (1 with the arm's probability, else 0)."""
    rng = random.Random(f"{seed}/{step}/{idx}")
    arm = rng.choices(range(len(probs)), weights=probs)[0]
    return arm, float(rng.random() < means[arm])


class Policy:
    """A softmax over the arms, trained by REINFORCE with the batch's mean reward as baseline."""

    def __init__(self, arms: int = ARMS, lr: float = 0.3) -> None:
        self.logits = torch.zeros(arms, requires_grad=True)
        self.opt = torch.optim.Adam([self.logits], lr=lr)

    def probs(self) -> list[float]:
        return torch.softmax(self.logits.detach(), 0).tolist()

    def update(self, trajs: list[Traj]) -> float:
        arms = torch.tensor([t.arm for t in trajs])
        rewards = torch.tensor([t.reward for t in trajs])
        loss = -((rewards - rewards.mean()) * torch.log_softmax(self.logits, 0)[arms]).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def mean_reward(trajs: list[Traj]) -> float:
    return sum(t.reward for t in trajs) / len(trajs)


def train_in_process(steps: int, batch: int, seed: int, lr: float = 0.3) -> list[float]:
    """The same learning with no Ray and no scheduler: each step's mean reward."""
    policy, means, rewards = Policy(lr=lr), arm_means(seed), []
    for step in range(steps):
        probs = policy.probs()
        trajs = [Traj(i, *play(probs, means, seed, step, i), gpu=-1) for i in range(batch)]
        rewards.append(mean_reward(trajs))
        policy.update(trajs)
    return rewards


# ------------------------------------------------------------------ the rollout engine


class Player:
    """A rollout worker's engine; it holds its GPUs logically (it records their ids, and computes on the CPU)."""

    def __init__(self, gpus: Gpus, means: tuple[float, ...], seed: int, traj_s: float) -> None:
        self.gpus, self.means, self.seed, self.traj_s = gpus, means, seed, traj_s

    async def rollout(self, probs: list[float], step: int, idx: int) -> Traj:
        await asyncio.sleep(self.traj_s)  # stands in for generating on the device
        return Traj(idx, *play(probs, self.means, self.seed, step, idx), gpu=self.gpus[0])


class RayWorker:
    """A :class:`Player` in a Ray actor of its own: a process that can be stopped, or die, alone."""

    def __init__(self, gpus: Gpus, means: tuple[float, ...], seed: int, traj_s: float) -> None:
        self.actor = ray.remote(Player).options(num_cpus=0, num_gpus=0).remote(gpus, means, seed, traj_s)

    async def rollout(self, probs: list[float], step: int, idx: int) -> Traj:
        return await self.actor.rollout.remote(probs, step, idx)

    def stop(self) -> None:
        ray.kill(self.actor)


class Rollouts:
    """A batch's trajectories dealt out to whatever workers the scheduler gave, one at a time each.

    ``start(gpus)`` starts a worker, ``stop(worker)`` ends one, ``lost(gpus)``
    is told of a worker that died (its trajectory in flight is played again).
    """

    def __init__(self, pipeline_id: str, start, stop=lambda worker: None, lost=None, report_s: float = REPORT_S) -> None:
        self.pid, self.start, self.stop, self.lost, self.report_s = pipeline_id, start, stop, lost, report_s
        self.workers: dict[Gpus, object] = {}
        self.serving: dict[Gpus, asyncio.Task] = {}
        self.running: dict[Gpus, int] = {}  # worker -> the trajectory it plays
        self.queue: list[int] = []  # trajectories of the batch not yet dealt out
        self.results: dict[int, Traj] = {}
        self.finished = 0  # trajectories finished, all batches (reported: it ends the turn a starving job got)
        self.batch: tuple[list[float], int] = ([], 0)  # (policy, step) the batch is played with
        self.failure: BaseException | None = None
        self.changed = asyncio.Event()

    def expand(self, gpus: Gpus) -> None:
        self.workers[gpus] = self.start(gpus)
        self.serving[gpus] = asyncio.get_running_loop().create_task(self._serve(gpus))

    async def shrink(self, gpus: Gpus) -> None:
        """Stop the worker on ``gpus`` (its trajectory in flight goes back to the queue); returns once it is gone."""
        task = self.serving.pop(gpus, None)
        if task is None:
            return  # it died meanwhile: nothing runs there
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.stop(self.workers.pop(gpus))

    async def play(self, probs: list[float], step: int, size: int, report=None) -> list[Traj]:
        """Play a batch of ``size``; ``report(demand)`` is sent whenever the demand changed."""
        self.batch, self.queue, self.results = (probs, step), list(range(size)), {}
        self._changed()
        reporter = asyncio.get_running_loop().create_task(self._report(report, size)) if report else None
        try:
            await self._until(lambda: len(self.results) == size or self.failure is not None)
        finally:
            if reporter is not None:
                reporter.cancel()
        if self.failure is not None:
            raise self.failure
        return [self.results[i] for i in range(size)]

    def demand(self, batch_size: int, announce: int = 0) -> ReportDemand:
        """Trajectories waiting (``announce``: those of a batch about to start), and the running ones per worker."""
        loads = tuple(WorkerLoad(first_gpu=gpus[0], active=1) for gpus in sorted(self.running))
        pending = len(self.queue) + announce
        return ReportDemand(pipeline_id=self.pid, pending=pending, loads=loads, batch_size=batch_size, finished=self.finished)

    async def _serve(self, gpus: Gpus) -> None:
        while True:
            await self._until(lambda: bool(self.queue))
            idx = self.queue.pop(0)
            self.running[gpus] = idx
            try:
                traj = await self.workers[gpus].rollout(*self.batch, idx)
            except asyncio.CancelledError:  # shrunk: played again by another worker (same outcome)
                self.queue.insert(0, idx)
                raise
            except ray.exceptions.RayActorError:  # its process died: likewise, and the scheduler is told
                self.queue.insert(0, idx)
                return await self._died(gpus)
            except Exception as exc:  # noqa: BLE001 -- not a dead worker: the batch fails
                self.failure = exc
                return
            finally:
                self.running.pop(gpus)
                self._changed()
            self.results[idx] = traj
            self.finished += 1

    async def _died(self, gpus: Gpus) -> None:
        self.serving.pop(gpus, None)
        self.workers.pop(gpus, None)
        if self.lost is not None:
            await self.lost(gpus)

    async def _report(self, report, size: int) -> None:
        last = None
        while True:
            now = self.demand(size)
            if now != last:
                await report(now)
                last = now
            await asyncio.sleep(self.report_s)

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.changed.clear()
            await self.changed.wait()

    def _changed(self) -> None:
        self.changed.set()


# ------------------------------------------------------------------ the pipeline: its loop, and the scheduler's endpoint


@dataclass(frozen=True)
class Settings:
    steps: int = 8
    batch: int = 32
    lr: float = 0.3
    seed: int = 0
    traj_s: float = 0.05  # seconds one trajectory takes on its worker


@ray.remote(num_cpus=0)
class BanditPipeline:
    """The pipeline's driver, and its endpoint: the scheduler calls ``expand``, ``shrink`` and ``stop`` on it."""

    def __init__(self, scheduler, spec: PipelineSpec, settings: Settings) -> None:
        self.sched, self.spec, self.s = scheduler, spec, settings
        self.rewards: list[float] = []
        self.calls: Counter = Counter()  # expands and shrinks (by reason) the scheduler asked for
        self.per_gpu: Counter = Counter()  # trajectories played per rollout worker's first GPU
        self.gone = ""  # why the scheduler forgot this pipeline ("" = it did not)
        self.body: asyncio.Task | None = None  # the steps, once registered
        self.stopped = False

    async def run(self) -> dict:
        """Register, train, unregister; returns the status, the error, and each step's mean reward."""
        means, s = arm_means(self.s.seed), self.s
        self.rollouts = Rollouts(self.spec.pipeline_id, lambda gpus: RayWorker(gpus, means, s.seed, s.traj_s), RayWorker.stop)
        self.client = Client(self.sched, self.spec.pipeline_id, workers=lambda: tuple(self.rollouts.workers), on_gone=self._gone)
        self.rollouts.lost = self.client.lost
        try:
            await self.client.register(self.spec, ray.get_runtime_context().current_actor)
        except NameTaken as exc:  # nothing registered: nothing to give back
            return self._result("refused", str(exc))
        self.body = asyncio.get_running_loop().create_task(self._steps())
        if self.stopped:  # stop() came while it registered
            self.body.cancel()
        status, error = "finished", ""
        try:
            await self.body
        except asyncio.CancelledError:  # stop() was called, or the scheduler forgot this pipeline
            status, error = ("failed", self.gone) if self.gone else ("cancelled", "")
        except Exception as exc:  # noqa: BLE001 -- the run fails, and says why
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        await self._leave(status, error)
        return self._result(status, error)

    async def _steps(self) -> None:
        c, n, b, pid = self.client, self.s.steps, self.s.batch, self.spec.pipeline_id
        await c.note(JobNote(pipeline_id=pid, loaded=False, steps_done=0, steps_total=n))
        await c.request(Stage.INIT)  # the model load's GPUs
        policy = Policy(lr=self.s.lr)
        await c.release(Stage.INIT, self.rollouts.demand(b, announce=b))  # the first batch waits
        for step in range(n):
            await c.note(JobNote(pipeline_id=pid, loaded=True, steps_done=step, steps_total=n))
            trajs = await self.rollouts.play(policy.probs(), step, b, report=c.report)
            self.rewards.append(mean_reward(trajs))
            self.per_gpu.update(t.gpu for t in trajs)
            await c.report(self.rollouts.demand(b))  # nothing waits: the workers may serve others while this one trains
            await c.request(Stage.ACTOR_TRAIN)
            policy.update(trajs)
            await asyncio.sleep(TRAIN_S)
            more = b if step + 1 < n else 0
            await c.release(Stage.ACTOR_TRAIN, self.rollouts.demand(more, announce=more))
        await c.note(JobNote(pipeline_id=pid, loaded=True, steps_done=n, steps_total=n))

    async def _leave(self, status: str, error: str) -> None:
        try:  # the scheduler shrinks this pipeline's workers, then forgets it
            await self.client.unregister(status, error)
        except Exception:  # noqa: BLE001 -- already forgotten (cancelled, or the scheduler is gone)
            pass
        for gpus in list(self.rollouts.workers):
            await self.rollouts.shrink(gpus)

    def _gone(self, exc: BaseException) -> None:
        self.gone = f"{type(exc).__name__}: {exc}"
        self.stop_now()

    def _result(self, status: str, error: str) -> dict:
        per_gpu = dict(sorted(self.per_gpu.items()))
        return {"status": status, "error": error, "rewards": self.rewards, "per_gpu": per_gpu, "calls": dict(self.calls)}

    # ------------------------------------------------------------ the endpoint

    async def expand(self, gpus: Gpus) -> None:
        self.calls["expand"] += 1
        self.rollouts.expand(tuple(gpus))

    async def shrink(self, gpus: Gpus, reason: str) -> None:
        self.calls[f"shrink ({reason})"] += 1
        await self.rollouts.shrink(tuple(gpus))

    async def stop(self, why=None) -> None:  # why: who cancelled it (a rlix.protocol.Stopped)
        self.stop_now()

    def stop_now(self) -> None:
        self.stopped = True
        if self.body is not None:
            self.body.cancel()


# ------------------------------------------------------------------ the command


def pipeline_spec(name: str, home: Gpus, cluster: ClusterSpec, priority: int, batch: int = 0) -> PipelineSpec:
    """Training on ``home``; rollout workers on any GPU of the cluster (borrowed from idle jobs, lent when idle).

    One batch of ``batch`` trajectories is open at a time, one after another: the demand
    the scheduler will credit (0: undeclared).
    """
    roles = (RoleSpec(role=Role.ACTOR_TRAIN, gpus=home), RoleSpec(role=Role.ACTOR_INFER, gpus=tuple(range(cluster.num_gpus))))
    return PipelineSpec(pipeline_id=name, roles=roles, home=home, priority=priority, open_limit=batch, batch_credit=batch > 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="the Ray cluster's address (default: the one this host runs)")
    p.add_argument("--name", default="bandit", help="the job's name on the cluster")
    p.add_argument("--gpus", default="0", help="its home GPUs, where it trains: '2,3' or '2-3'")
    p.add_argument("--priority", type=int, default=0, help="higher wins")
    p.add_argument("--steps", type=int, default=Settings.steps)
    p.add_argument("--batch", type=int, default=Settings.batch, help="trajectories per step")
    p.add_argument("--seed", type=int, default=Settings.seed)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps < 1 or args.batch < 1:
        return refuse(f"--steps {args.steps} --batch {args.batch}: both must be >= 1")
    try:
        home = tuple(sorted(parse_gpus(args.gpus)))
    except ValueError as exc:
        return refuse(f"--gpus {args.gpus}: {exc}")
    try:
        sched = connect(args.address, where="--address")  # fails fast, in one line, where nothing listens
    except (ClusterError, SchedulerGone) as exc:
        return refuse(str(exc))
    info = sched.call_sync(protocol.Info())
    cluster = ClusterSpec(nodes=info.nodes, gpus_per_node=info.gpus_per_node)
    spec = pipeline_spec(args.name, home, cluster, args.priority, args.batch)
    try:
        validate_pipeline(cluster, spec)
    except SchedulingError as exc:
        return refuse(f"--gpus {args.gpus}: {exc}")
    settings = Settings(steps=args.steps, batch=args.batch, seed=args.seed)
    pipeline = BanditPipeline.remote(sched, spec, settings)
    ref = pipeline.run.remote()
    try:
        out = ray.get(ref)
    except KeyboardInterrupt:  # cancel cleanly: the pipeline unregisters and its GPUs go back
        pipeline.stop.remote()
        out = ray.get(ref)
    if out["status"] == "refused":
        return refuse(f"--name {args.name}: {out['error']}")
    r = out["rewards"]
    rewards = f", reward {r[0]:.3f} -> {r[-1]:.3f}" if r else ""
    print(f"{args.name}: {out['status']} steps={len(r)}/{args.steps}{rewards}")
    print(f"{args.name}: trajectories per rollout GPU {out['per_gpu']}; scheduler calls {out['calls']}")
    if out["error"]:
        print(f"{args.name}: {out['error']}", file=sys.stderr)
    return 0 if out["status"] == "finished" else 1


def refuse(message: str) -> int:
    print(f"external_pipeline: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
