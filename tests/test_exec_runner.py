"""The executor's step runner without Ray: a whole job through the real scheduler-actor class, step
machine, scheduler link, trainer link, rollout control, queue, pool and recorder. Fakes stand only at
the process boundary: the rollout worker processes, the trainer gang, and the Ray handles."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from boundary import Handle, InProcessTransport, Remote
from helpers import spec

from rlix.core import ClusterSpec, SchedulerConfig, Stage
from rlix.exec.data.recipe import ScoredStep, Trajectory
from rlix.exec.data.rewards import RewardError, RewardRef, RewardSet
from rlix.exec.data.sources import PromptItem
from rlix.exec.messages import GenRequest, GenResult, SwitchTiming, TrainStats
from rlix.step import JobPlan, StepMachine, StreamSpec

STAGES = (Stage.OLD_LOGPROBS, Stage.ACTOR_TRAIN)
DATA = Path(__file__).resolve().parent / "data"


class _Trainer:
    """The trainer gang: notes its calls; a snapshot is the name of the weights after ``trained`` updates."""

    world = 1

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded: list[tuple[str, ...]] = []  # the learner parts each stage load asked for
        self.trained = 0

    async def weights(self):
        return f"w{self.trained}"

    async def adapter_versions(self):
        return {}

    async def reload(self, parts):
        self.calls.append("reload")
        self.loaded.append(tuple(sorted(p.value for p in parts)))

    async def offload(self):
        self.calls.append("offload")

    async def logprobs(self, samples, reference, adapter=""):
        self.calls.append("logprobs")
        return [() for _ in samples]

    async def train(self, samples, adapter=""):
        self.calls.append("train")
        self.trained += 1
        return TrainStats(loss=0.0, kl=0.0, clip_fraction=0.0, tokens=0, seconds=0.0)

    def kill(self) -> None:
        pass


class _Worker:
    """A rollout worker process: wakes with the weights it is given, generates 3 tokens per request."""

    def __init__(self) -> None:
        self.version = -1

    async def prepare(self, model_dir):
        return 0.0

    async def wake(self, full, *adapters, handoff=None):
        return await self.update_weights(full)

    async def update_weights(self, full, handoff=None):
        self.version = int((await full)[1:])
        return SwitchTiming(seconds=0.0, synced_bytes=1, version=self.version)

    async def sleep(self):
        return SwitchTiming(seconds=0.0)

    async def generate(self, req: GenRequest):
        await asyncio.sleep(0.001)
        ids = (5, 6, 7)
        return GenResult(
            traj_id=req.traj_id,
            token_ids=ids,
            logprobs=(-1.0,) * 3,
            finished=True,
            aborted=False,
            weight_version=self.version,
            gen_s=0.001,
        )


class _Recipe:
    """Two trajectories a step; each step's mean reward is ``rewards[step]``: None, the user's function raises;
    "waits", it returns only once the job's event loop has run meanwhile; "hangs", it never returns."""

    def __init__(self, rewards) -> None:
        self.rewards = rewards
        self.loop = asyncio.get_running_loop()
        self.functions = RewardSet((RewardRef(function="trl_rewards.py:hangs", base_dir=str(DATA)),))

    def step_size(self, step: int) -> int:
        return 2

    def trajectories(self, step: int) -> list[Trajectory]:
        reqs = [GenRequest(traj_id=2 * step + i, prompt_ids=(1,), max_new_tokens=3) for i in range(2)]
        return [
            Trajectory(
                step=step, prompt=PromptItem(row=r.traj_id, prompt="x", prompt_ids=(), columns=(("answer", "x"),)), request=r
            )
            for r in reqs
        ]

    def score(self, trajs, results) -> ScoredStep:
        reward = self.rewards[trajs[0].step]
        if reward is None:  # the user's function raises, called as a recipe calls it
            RewardSet((RewardRef(function="trl_rewards.py:raises", base_dir=str(DATA)),)).score(
                completions=["x"] * len(trajs), prompts=["x"] * len(trajs), completion_ids=[[1]] * len(trajs), columns={}
            )
        if reward == "hangs":
            self.functions.score(completions=["x"] * len(trajs), prompts=["x"] * len(trajs), completion_ids=[[1]] * 2, columns={})
        if reward == "waits":  # a slow function: the loop, if free, answers meanwhile
            ran = threading.Event()
            self.loop.call_soon_threadsafe(ran.set)
            if not ran.wait(10):
                raise RuntimeError("the job's event loop was held while its rewards were scored")
            reward = 0.5
        return ScoredStep(samples=(), rewards=(reward,) * len(trajs))

    def unfinished(self, seconds: float) -> RewardError:
        return self.functions.unfinished(seconds)


async def _run_job(
    *,
    steps: int,
    staleness: int = 0,
    streaming: bool = False,
    rewards=None,
    stop_reward=None,
    timeout_s: float = 20.0,
    reward_timeout_s: float = 3600.0,
):
    """One job on 2 GPUs (trains on GPU 0, rolls out on 0-1) driven to its end, or to its failure."""
    from rlix.exec.config import LimitsConfig
    from rlix.exec.control.scheduler_link import SchedulerLink
    from rlix.exec.job.step_runner import Parts, StepRunner
    from rlix.exec.recorder import Recorder
    from rlix.exec.records import JobStatus
    from rlix.exec.rollout.control import RolloutControl
    from rlix.exec.rollout.hooks import Deadlines, Hooks, Processes, WeightRule
    from rlix.exec.rollout.pool import WorkerPool
    from rlix.exec.rollout.queue import RolloutQueue
    from rlix.exec.service.scheduler_actor import SchedulerActor
    from rlix.exec.train.trainer_link import TrainerLink

    actor = SchedulerActor.__ray_metadata__.modified_class(
        ClusterSpec(nodes=1, gpus_per_node=2), "rlix", SchedulerConfig(), time.time(), 0.05
    )
    await actor.start()
    t0, failures, trainer = time.time(), [], _Trainer()
    now = lambda: time.time() - t0  # noqa: E731
    job = spec("p", (0,), (0, 1), slots=2)
    recipe = _Recipe(rewards or [0.5] * steps)
    plan = JobPlan(
        streams=(StreamSpec(name="", steps=steps, stop_reward=stop_reward),),
        stages=lambda i, k: STAGES,
        size=lambda i, k: recipe.step_size(k),
        staleness=staleness,
        streaming=streaming,
        predict=True,
        tries=2,
    )
    machine = StepMachine(job, plan)
    rec, pool, queue = Recorder("p"), WorkerPool(2), RolloutQueue(machine.book)
    link = SchedulerLink(pipeline_id="p", sched=InProcessTransport(actor), recorder=rec, limits=LimitsConfig(), now=now)
    released, release = [], link.release

    async def noting_release(stage, report=None):  # what each release carried to the scheduler
        released.append((stage, report.pending if report is not None else None))
        await release(stage, report)

    link.release = noting_release
    holder: dict = {}
    changed = asyncio.Event()

    async def changes() -> None:
        changed.clear()
        await changed.wait()

    def start_reports() -> None:  # as the coordinator does once the model is loaded
        reports.append(asyncio.ensure_future(link.report_loop(holder["runner"].demand, changes, 0.5)))

    hooks = Hooks(
        now=now,
        spawn=lambda gpus, first, background: Handle(_Worker()),
        weights=lambda: holder["runner"].trainer.weights() if holder["runner"].trainer else (None, 0, ()),
        finished=lambda q, r: holder["runner"].trajectory_done(q, r),
        fatal=failures.append,
        lost=lambda gpus, failed: None,
        changed=changed.set,
    )
    procs = Processes(kill=lambda handle: None, died=(ConnectionError,), refused=(ValueError,))
    deadlines = Deadlines(wake_s=5.0, call_s=5.0, rollout_s=5.0)
    rule = WeightRule(streaming=streaming, partial=streaming)  # as the coordinator makes it from the job's fields
    rollout = RolloutControl(
        pool=pool, queue=queue, recorder=rec, hooks=hooks, deadlines=deadlines, model_dir="/m", procs=procs, rule=rule
    )
    stop = Remote(lambda why=None: asyncio.sleep(0))
    coordinator = type("Coordinator", (), {"expand": Remote(rollout.expand), "shrink": Remote(rollout.shrink), "stop": stop})()
    reports = []
    parts = Parts(
        link=link,
        register=lambda: actor.register(job, coordinator),  # as the coordinator registers itself
        rollout=rollout,
        queue=queue,
        recorder=rec,
        start_trainer=lambda: TrainerLink(Handle(trainer), limits=LimitsConfig()),
        loaded=start_reports,
        reward_timeout_s=reward_timeout_s,
    )
    runner = holder["runner"] = StepRunner(machine, [recipe], parts, now=now, fatal=failures.append)
    runner.start()
    deadline = time.time() + timeout_s
    while not runner.ended.done() and not failures and time.time() < deadline:
        await asyncio.sleep(0.01)
    for task in [*runner.tasks, *reports]:
        task.cancel()
    await actor.stop()
    result = rec.result(
        JobStatus.FINISHED,
        error="",
        arrival_s=0.0,
        init_s=runner.init_s,
        finish_s=now(),
        planned=runner.machine.rollouts.produced,
    )
    runner.released = released
    return runner, trainer, result, failures, reports


def test_a_job_runs_to_its_end_through_the_real_scheduler_and_parts():
    runner, trainer, result, failures, reports = asyncio.run(_run_job(steps=3))
    assert failures == [] and runner.ended.done()
    assert [s.step for s in result.steps] == [0, 1, 2]
    assert result.lost == 0 and len(result.trajectories) == 6
    # every stage loaded, worked and offloaded on the trainer, in step order
    assert trainer.calls == ["reload", "logprobs", "offload", "reload", "train", "offload"] * 3
    # the log-prob stage leaves the optimizer state where it is; training moves the policy and its optimizer
    assert trainer.loaded == [("policy",), ("optimizer", "policy")] * 3
    assert runner.trainer.weights()[1] == 3  # the newest published version
    # on-policy: each step's trajectories came from the weights of the step before
    assert [min(t.weight_version for t in result.trajectories if t.step == k) for k in range(3)] == [0, 1, 2]
    # and the step machine's record of each step says so, as the simulator's does
    assert [(t.step, t.version) for t in runner.machine.history] == [(0, 0), (1, 1), (2, 2)]
    assert len(reports) == 1  # demand reports started once, when the model load ended
    # the model load's GPUs go back with the first batch's report (never lent for want of it);
    # each training's release carries the batch it opens, the last one none
    assert runner.released[0] == (Stage.INIT, 2)
    assert [r for _, r in runner.released[1:]] == [2, 2, None]


def test_a_stream_that_stops_drops_its_queued_batch_and_loses_nothing():
    """Staleness 1: step 1 rolls out while step 0 trains; step 0 reaches the stop reward, so step 1 is
    dropped: never trained, and its trajectories are neither finished nor lost."""
    runner, trainer, result, failures, _ = asyncio.run(
        _run_job(steps=4, staleness=1, rewards=[0.9, 0.1, 0.1, 0.1], stop_reward=0.8)
    )
    assert failures == [] and runner.ended.done()
    assert [s.step for s in result.steps] == [0]
    assert result.lost == 0 and {t.step for t in result.trajectories} == {0}
    assert trainer.calls.count("train") == 1


@pytest.mark.parametrize("streaming", [False, True])
def test_streaming_rolls_out_the_next_batch_beside_the_one_before_within_the_staleness_bound(streaming):
    """Staleness 1. In batch mode a step's rollout starts once the one before it has rolled out; with
    streaming, steps 0 and 1 roll out together from the model load on (each later one as soon as the
    gate lets it: the step two before it is trained). Either way no trajectory ran on weights older
    than its step allows, and every step trained."""
    runner, _, result, failures, _ = asyncio.run(_run_job(steps=4, staleness=1, streaming=streaming))
    assert failures == [] and runner.ended.done()
    assert [s.step for s in result.steps] == [0, 1, 2, 3] and result.lost == 0
    assert all(t.weight_version >= t.step - 1 for t in result.trajectories)
    history = {t.step: t for t in runner.machine.history}
    overlapped = [history[k + 1].rollout_start < history[k].rollout_end for k in range(3)]
    if streaming:
        assert history[1].rollout_start == history[0].rollout_start and overlapped[0]
        assert runner.machine.plan.open_limit() == 4  # two batches of two may be open at once
    else:
        assert not any(overlapped)
        assert runner.machine.plan.open_limit() == 2


def test_a_reward_function_that_raises_fails_the_job_instead_of_hanging_it(tmp_path):
    runner, _, result, failures, _ = asyncio.run(_run_job(steps=3, rewards=[0.5, None, 0.5]))
    assert [type(f) for f in failures] == [RewardError] and not runner.ended.done()
    assert [s.step for s in result.steps] == [0]
    # what the coordinator then reports: one line ending with where it raised and where its traceback is
    line = failures[0].kept_in(tmp_path / "p")
    lineno = (DATA / "trl_rewards.py").read_text().splitlines().index('    raise ValueError("bad\\nthing")') + 1
    raised_at = f"{DATA / 'trl_rewards.py'}:{lineno}"
    assert line == (
        f"reward function trl_rewards.py:raises raised ValueError: bad thing at {raised_at}; traceback in "
        f"{tmp_path / 'p' / 'reward_error.txt'}"
    )
    kept = (tmp_path / "p" / "reward_error.txt").read_text()
    assert kept.startswith(line.partition("; traceback")[0] + "\n\nTraceback (most recent call last):")
    assert f'File "{DATA / "trl_rewards.py"}", line {lineno}, in raises' in kept


def test_a_slow_reward_function_holds_none_of_the_jobs_calls_and_one_that_never_returns_fails_the_job_naming_it():
    """Before: the rewards ran on the coordinator's event loop, so a slow one held its shrinks (one past the
    shrink deadline got the job dropped as unreachable), demand reports and keep-alives, and one that never
    returned hung the job."""
    runner, _, result, failures, _ = asyncio.run(_run_job(steps=2, rewards=[0.5, "waits"]))
    assert failures == [] and runner.ended.done() and [s.step for s in result.steps] == [0, 1]
    runner, _, result, failures, _ = asyncio.run(_run_job(steps=3, rewards=[0.5, "hangs", 0.5], reward_timeout_s=2.0))
    (failure,) = failures
    stuck = (DATA / "trl_rewards.py").read_text().splitlines().index("    threading.Event().wait()") + 1
    assert str(failure) == (
        f"reward function trl_rewards.py:hangs did not return within 2 s (limits.reward_timeout_s) at "
        f"{DATA / 'trl_rewards.py'}:{stuck}"  # where it waits
    )
    assert [type(f) for f in failures] == [RewardError] and not runner.ended.done()
    assert [s.step for s in result.steps] == [0]


@pytest.mark.parametrize("step", [0, 1])
def test_a_repeated_result_changes_nothing(step):
    """A result delivered twice (a retried call that had in fact finished) is counted once."""

    async def scenario():
        runner, _, result, failures, _ = await _run_job(steps=2)
        q = type("Q", (), {})()
        traj = runner.recipes[0].trajectories(step)[0]
        q.traj, q.traj_id = traj, traj.request.traj_id
        again = GenResult(
            traj_id=q.traj_id, token_ids=(1,), logprobs=(0.0,), finished=True, aborted=False, weight_version=0, gen_s=0.0
        )
        runner.trajectory_done(q, again)  # its batch is trained and gone: ignored
        return failures, result

    failures, result = asyncio.run(scenario())
    assert failures == [] and len(result.trajectories) == 4
