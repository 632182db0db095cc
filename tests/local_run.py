"""Tests' reference run: one job end to end in this process, without Ray or the scheduler.

The same step machine, recipe, backend and learner the Ray executor uses, the
machine's effects answered at once in this process, so the tests check the RL
path (learning, LoRA adapters, checkpoints) apart from scheduling.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rlix.core import Stage
from rlix.exec.config import JobConfig
from rlix.exec.rollout.queue import RolloutQueue
from rlix.exec.rollout.torch_backend import Emulation, TorchRolloutBackend
from rlix.exec.train.grpo import GrpoLearner
from rlix.job import stage_gpus
from rlix.step import (
    Driver,
    DropBatch,
    Load,
    Offload,
    Publish,
    QueueBatch,
    RegisterJob,
    RequestGang,
    Score,
    StepMachine,
    Work,
    declared_spec,
)


@dataclass(frozen=True, kw_only=True)
class LocalStep:
    step: int
    mean_reward: float
    mean_tokens: float
    loss: float


def delivered(snapshot):
    """A snapshot as a worker receives it from the trainer: pickled as Ray pickles it (protocol 5,
    buffers out of band), its tensors made where they are read."""
    buffers: list = []
    return pickle.loads(pickle.dumps(snapshot, protocol=5, buffer_callback=buffers.append), buffers=buffers)


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch on one thread while a job runs here (as in a Ray worker); the caller's count comes back after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_local(job: JobConfig, workdir: str | Path, emulation: Emulation = Emulation()) -> list[LocalStep]:
    """A full-finetune job in this process: rollout, scoring, log-probs and training, in the order its step machine
    gives (with staleness ``s``, step ``k`` rolls out as soon as step ``k - 1 - s`` is trained, as the executor may)."""
    with _one_torch_thread():
        return _LocalShell(job, workdir, emulation).run()[""]


def run_local_lora(job: JobConfig, workdir: str | Path, emulation: Emulation = Emulation()) -> dict[str, list[LocalStep]]:
    """A multi_lora job in this process: each adapter's steps, as its step machine orders them."""
    with _one_torch_thread():
        return _LocalShell(job, workdir, emulation).run()


class _LocalShell:
    """The job's step machine (:mod:`rlix.step`, the one both shells drive), its effects carried out here
    and answered at once: every gang is granted, a batch rolls out whole on one rollout engine in its
    rollout book's order (:mod:`rlix.rollout_book`, as both shells keep it), and the stages run on the
    learner. Only the scheduler and the processes are left out."""

    def __init__(self, job: JobConfig, workdir: str | Path, emulation: Emulation) -> None:
        from rlix.exec.job.coordinator import job_streams, plan_of

        model_dir = job.model.directory(workdir)
        streams, self.recipes = job_streams(job, str(model_dir))
        self.job, self.names = job, [s.name for s in streams]
        plan = plan_of(job, streams, self.recipes)
        self.machine = StepMachine(declared_spec(job.pipeline_spec(job.name), plan), plan)
        self.driver = Driver(self)
        spec = job.lora_spec()
        self.backend = TorchRolloutBackend(emulation, lora=spec)
        self.backend.load(str(model_dir), "cpu", None)
        if spec is None:
            self.learner = GrpoLearner(str(model_dir), "cpu", job.algo.value(job.seed), emulation)
        else:
            from rlix.exec.train.lora import LoraLearner

            algos = {a.name: a.algo.value(a.seed) for a in job.adapters}
            self.learner = LoraLearner(str(model_dir), "cpu", spec, algos, emulation)
        self.queue = RolloutQueue(self.machine.book)  # the machine's rollout book: its order, and each batch's tally
        self.batches: dict[tuple[int, int], tuple[list, dict]] = {}  # (stream, step) -> its trajectories, results
        self.scored = None  # the step in training: its scored batch
        self.samples: list = []
        self.stats = None
        self.out: dict[str, list[LocalStep]] = {name: [] for name in self.names}

    def run(self) -> dict[str, list[LocalStep]]:
        self.driver.feed(lambda: self.machine.start(0.0))
        assert self.machine.done, "the step machine stopped before the job's end"
        return self.out

    def _tell(self, event) -> None:
        self.driver.feed(event)

    # ------------------------------------------------------------ effects answered at once

    def register_job(self, e: RegisterJob) -> None:
        self._tell(lambda: self.machine.registered(0.0))

    def request_gang(self, e: RequestGang) -> None:
        self._tell(lambda: self.machine.granted(e.stage, stage_gpus(self.machine.spec, e.stage), 0.0))

    def load(self, e: Load) -> None:
        if e.stage is Stage.INIT:
            self._load_model()
        self._tell(lambda: self.machine.loaded(e.stage, 0.0))

    def _load_model(self) -> None:
        if self.job.lora_spec() is None:
            return  # the engine serves the checkpoint it loaded: version 0
        if self.job.checkpoint_dir:
            self.learner.restore(self.job.checkpoint_dir)
            for i, name in enumerate(self.names):
                self.machine.resume(i, self.learner.adapters[name].version)
        self.backend.wake(self.learner.publish(), tuple(self.learner.adapter_snapshot(n) for n in self.names))

    def queue_batch(self, e: QueueBatch) -> None:
        trajs = self.recipes[e.stream].trajectories(e.step)
        tally, results, rolled = self.queue.add(trajs, e.version), {}, False
        while self.queue.queue:  # one slot: each trajectory in the book's order, to its end
            q = self.queue.queue.popleft()
            results[q.traj_id] = self.backend.generate(q.request)
            _, rolled = self.queue.finished(q, results[q.traj_id])
        assert rolled, "the batch's last trajectory finished and its book did not roll it out"
        self.batches[(e.stream, e.step)] = trajs, results
        self._tell(lambda: self.machine.rolled(e.stream, e.step, 0.0, oldest_version=tally.oldest))

    def score(self, e: Score) -> None:
        self.scored = self.recipes[e.stream].score(*self.batches[(e.stream, e.step)])
        self.samples = list(self.scored.samples)
        self._tell(lambda: self.machine.scored(e.stream, e.step, self.scored.mean_reward, 0.0))

    def work(self, e: Work) -> None:
        name, learner = self.names[e.stream], self.learner
        if e.stage is Stage.OLD_LOGPROBS:
            old = learner.adapter_logprobs(name, self.samples) if name else learner.logprobs(self.samples)
            self.samples = [replace(s, old_logprobs=o) for s, o in zip(self.samples, old)]
        elif e.stage is Stage.REF_LOGPROBS:
            ref = learner.logprobs(self.samples, reference=True)
            self.samples = [replace(s, ref_logprobs=r) for s, r in zip(self.samples, ref)]
        elif e.stage is Stage.ACTOR_TRAIN:
            self.stats = learner.train_adapter(name, self.samples) if name else learner.train(self.samples)
        self._tell(lambda: self.machine.worked(e.stage, 0.0, 0.0))

    def offload(self, e: Offload) -> None:
        self._tell(lambda: self.machine.offloaded(e.stage, 0.0))

    def publish(self, e: Publish) -> None:
        name = self.names[e.stream]
        if name:
            self.backend.update_adapter(delivered(self.learner.adapter_snapshot(name)))
            if self.job.checkpoint_dir:
                self.learner.save(name, self.job.checkpoint_dir)
        else:
            self.backend.update_weights(self.learner.publish())
        tokens = sum(len(s.completion_ids) for s in self.samples) / len(self.samples)
        step = LocalStep(step=e.version - 1, mean_reward=self.scored.mean_reward, mean_tokens=tokens, loss=self.stats.loss)
        self.out[name].append(step)
        del self.batches[(e.stream, e.version - 1)]
        self._tell(lambda: self.machine.published(e.stream, 0.0))

    def drop_batch(self, e: DropBatch) -> None:
        del self.batches[(e.stream, e.step)]  # rolled out whole at its queueing: nothing left in the book

    def _nothing(self, e) -> None:
        pass

    release_gang = book = demand_changed = finished = _nothing
