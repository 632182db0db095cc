"""A pipeline written outside rlix's recipe, run under the cluster's shared rlix scheduler.

Its own task (a multi-armed bandit), policy (a softmax in torch), rollout engine
(Ray actors) and plain loop, with no asyncio; it speaks to rlix through the client
library only. ``connect`` joins the Ray cluster (``--address``, else ``RAY_ADDRESS``,
else ``auto``); a :class:`~rlix.client.BlockingClient` makes the calls; an
:class:`~rlix.elastic_pool.ElasticPool` is the endpoint the scheduler expands and
shrinks, each worker placed on its GPUs (``client.actor_options``). A trajectory
depends only on the seed, step, index and policy, never on the worker that played
it: the rewards are :func:`train_in_process`'s however the workers move.

    python examples/external_pipeline.py --address auto --name bandit --steps 8 --gpus 2,3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections import Counter
from concurrent.futures import CancelledError

import ray
import torch

from rlix.client import BlockingClient, SchedulerGone, connect
from rlix.config import parse_gpus
from rlix.core import ClusterSpec, PipelineSpec, Role, RoleSpec, SchedulingError, Stage
from rlix.core.topology import validate_pipeline
from rlix.elastic_pool import ElasticPool
from rlix.protocol import Info, JobNote, NameTaken
from rlix.transport import ClusterError


def arm_means(seed: int, arms: int = 8) -> tuple[float, ...]:
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

    def __init__(self, arms: int = 8, lr: float = 0.3) -> None:
        self.logits = torch.zeros(arms, requires_grad=True)
        self.opt = torch.optim.Adam([self.logits], lr=lr)

    def probs(self) -> list[float]:
        return torch.softmax(self.logits.detach(), 0).tolist()

    def update(self, played: list[tuple[int, float]]) -> None:
        arms, rewards = torch.tensor([a for a, _ in played]), torch.tensor([r for _, r in played])
        loss = -((rewards - rewards.mean()) * torch.log_softmax(self.logits, 0)[arms]).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def train_in_process(steps: int, batch: int, seed: int, lr: float = 0.3) -> list[float]:
    """The same learning with no Ray and no scheduler: each step's mean reward."""
    policy, means, rewards = Policy(lr=lr), arm_means(seed), []
    for step in range(steps):
        probs = policy.probs()
        played = [play(probs, means, seed, step, i) for i in range(batch)]
        rewards.append(sum(r for _, r in played) / batch)
        policy.update(played)
    return rewards


class Player:
    """A rollout worker's engine (a Ray actor): computes on the CPU, and says which device it was given."""

    def __init__(self, means: tuple[float, ...], seed: int, traj_s: float) -> None:
        self.means, self.seed, self.traj_s = means, seed, traj_s
        self.device = os.environ["CUDA_VISIBLE_DEVICES"]  # as rlix placed it: the device ids of its GPUs

    async def rollout(self, probs: list[float], step: int, idx: int) -> tuple[int, float, str]:
        await asyncio.sleep(self.traj_s)  # stands in for generating on the device
        return (*play(probs, self.means, self.seed, step, idx), self.device)


def pipeline_spec(name: str, home: tuple[int, ...], cluster: ClusterSpec, priority: int, batch: int = 0) -> PipelineSpec:
    """Training on ``home``, rollout on any GPU; one batch of ``batch`` open at a time (0: undeclared)."""
    roles = (RoleSpec(role=Role.ACTOR_TRAIN, gpus=home), RoleSpec(role=Role.ACTOR_INFER, gpus=tuple(range(cluster.num_gpus))))
    return PipelineSpec(pipeline_id=name, roles=roles, home=home, priority=priority, open_limit=batch, batch_credit=batch > 0)


def run_pipeline(sched, spec: PipelineSpec, args: argparse.Namespace) -> tuple[str, str, list[float], Counter]:
    """Register, train, leave: (status, error, each step's mean reward, trajectories per rollout device)."""
    means, n, b, name = arm_means(args.seed), args.steps, args.batch, spec.pipeline_id
    why = {}  # why the run was interrupted: by a cancel, or the scheduler forgot it
    client = BlockingClient(sched, name, workers=lambda: pool.workers, on_gone=lambda exc: stop(f"{type(exc).__name__}: {exc}"))

    def start(gpus):  # a worker on the GPUs of an expand, in the bundle rlix reserved for them
        return ray.remote(Player).options(**client.actor_options(gpus)).remote(means, args.seed, args.traj_s)

    pool = ElasticPool(name, start=start, run=lambda w, item: w.rollout.remote(*item), stop=ray.kill, lost=client.client.lost)

    def stop(error: str = "") -> None:
        why.setdefault("error", error)
        client.interrupt()

    async def on_cancel(_who) -> None:
        stop()

    rewards, per_device, status = [], Counter(), "finished"
    try:
        client.register(spec, pool.endpoint(stop=on_cancel))
        client.note(JobNote(pipeline_id=name, loaded=False, steps_done=0, steps_total=n))
        client.request(Stage.INIT)  # the model load's GPUs
        policy = Policy()
        client.release(Stage.INIT, pool.demand(b, announce=b))  # the first batch waits
        for step in range(n):
            client.note(JobNote(pipeline_id=name, loaded=True, steps_done=step, steps_total=n))
            probs = policy.probs()
            played = client.run(pool.play([(probs, step, i) for i in range(b)], report=client.client.report))
            rewards.append(sum(r for _, r, _ in played) / b)
            per_device.update(d for _, _, d in played)
            client.report(pool.demand(b))  # nothing waits: the workers may serve others while this one trains
            client.request(Stage.ACTOR_TRAIN)
            policy.update([(a, r) for a, r, _ in played])
            more = b if step + 1 < n else 0
            client.release(Stage.ACTOR_TRAIN, pool.demand(more, announce=more))
        client.note(JobNote(pipeline_id=name, loaded=True, steps_done=n, steps_total=n))
    except NameTaken as exc:  # nothing registered: nothing to give back
        client.close()
        return "refused", str(exc), rewards, per_device
    except (CancelledError, KeyboardInterrupt):
        status = "failed" if why.get("error") else "cancelled"
    except Exception as exc:  # noqa: BLE001 -- the run fails, and says why
        status, why["error"] = "failed", f"{type(exc).__name__}: {exc}"
    try:  # the scheduler shrinks this pipeline's workers, then forgets it
        client.unregister(status, why.get("error", ""))
    except Exception:  # noqa: BLE001 -- already forgotten (cancelled), or the scheduler is gone
        pass
    client.run(pool.close(), interruptible=False)
    client.close()
    return status, why.get("error", ""), rewards, per_device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="the Ray cluster: 'auto', HOST:PORT (default: RAY_ADDRESS, else auto)")
    p.add_argument("--name", default="bandit", help="the job's name on the cluster")
    p.add_argument("--gpus", default="0", help="its home GPUs, where it trains: '2,3' or '2-3'")
    p.add_argument("--priority", type=int, default=0, help="higher wins")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="trajectories per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traj-s", type=float, default=0.05, help="seconds one trajectory takes on its worker")
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
    info = sched.call_sync(Info())
    cluster = ClusterSpec(nodes=info.nodes, gpus_per_node=info.gpus_per_node)
    spec = pipeline_spec(args.name, home, cluster, args.priority, args.batch)
    try:
        validate_pipeline(cluster, spec)
    except SchedulingError as exc:
        return refuse(f"--gpus {args.gpus}: {exc}")
    status, error, r, per_device = run_pipeline(sched, spec, args)
    if status == "refused":
        return refuse(f"--name {args.name}: {error}")
    rewards = f", reward {r[0]:.3f} -> {r[-1]:.3f}" if r else ""
    print(f"{args.name}: {status} steps={len(r)}/{args.steps}{rewards}")
    print(f"{args.name}: trajectories per rollout device {dict(sorted(per_device.items()))}")
    if error:
        print(f"{args.name}: {error}", file=sys.stderr)
    return 0 if status == "finished" else 1


def refuse(message: str) -> int:
    print(f"external_pipeline: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
