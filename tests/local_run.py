"""Tests' reference loop: one job end to end in this process, without Ray or the scheduler.

The same recipe, backend and learner the Ray executor uses, called in a
plain loop, so the tests check the RL path (learning, LoRA adapters,
checkpoints) apart from scheduling.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rlix.exec.config import JobConfig
from rlix.exec.data.recipe import Recipe
from rlix.exec.rollout.torch_backend import Emulation, TorchRolloutBackend
from rlix.exec.train.grpo import GrpoLearner


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
    """A full-finetune job in this process: rollout, scoring, log-probs and training, step by step."""
    with _one_torch_thread():
        return _run_full(job, workdir, emulation)


def run_local_lora(job: JobConfig, workdir: str | Path, emulation: Emulation = Emulation()) -> dict[str, list[LocalStep]]:
    """A multi_lora job in this process: adapters take ticks in turn (round robin)."""
    with _one_torch_thread():
        return _run_lora(job, workdir, emulation)


def _run_full(job: JobConfig, workdir: str | Path, emulation: Emulation) -> list[LocalStep]:
    model_dir = job.model.directory(workdir)
    recipe = Recipe.for_job(job, model_dir)
    backend = TorchRolloutBackend(emulation)
    backend.load(str(model_dir), "cpu", None)
    learner = GrpoLearner(str(model_dir), "cpu", job.algo.value(job.seed), emulation)
    out = []
    for step in range(job.steps):
        trajs = recipe.trajectories(step)
        results = {t.request.traj_id: backend.generate(t.request) for t in trajs}
        scored = recipe.score(trajs, results)
        old = learner.logprobs(list(scored.samples))
        samples = [replace(s, old_logprobs=o) for s, o in zip(scored.samples, old)]
        if learner.ref is not None:
            ref = learner.logprobs(samples, reference=True)
            samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, ref)]
        stats = learner.train(samples)
        backend.update_weights(learner.publish())
        tokens = sum(len(s.completion_ids) for s in samples) / len(samples)
        out.append(LocalStep(step=step, mean_reward=scored.mean_reward, mean_tokens=tokens, loss=stats.loss))
    return out


def _run_lora(job: JobConfig, workdir: str | Path, emulation: Emulation) -> dict[str, list[LocalStep]]:
    from rlix.exec.train.lora import LoraLearner

    model_dir = job.model.directory(workdir)
    spec = job.lora_spec()
    recipes = {a.name: Recipe.for_adapter(job, i, model_dir) for i, a in enumerate(job.adapters)}
    backend = TorchRolloutBackend(emulation, lora=spec)
    backend.load(str(model_dir), "cpu", None)
    learner = LoraLearner(str(model_dir), "cpu", spec, {a.name: a.algo.value(a.seed) for a in job.adapters}, emulation)
    if job.checkpoint_dir:
        learner.restore(job.checkpoint_dir)
    backend.wake(learner.publish(), tuple(learner.adapter_snapshot(n) for n in spec.names))
    out: dict[str, list[LocalStep]] = {a.name: [] for a in job.adapters}
    live = {a.name: a for a in job.adapters}
    while live:
        for name, a in list(live.items()):
            step = learner.adapters[name].version
            trajs = recipes[name].trajectories(step)
            results = {t.request.traj_id: backend.generate(t.request) for t in trajs}
            scored = recipes[name].score(trajs, results)
            old = learner.adapter_logprobs(name, list(scored.samples))
            samples = [replace(s, old_logprobs=o) for s, o in zip(scored.samples, old)]
            stats = learner.train_adapter(name, samples)
            backend.update_adapter(delivered(learner.adapter_snapshot(name)))
            if job.checkpoint_dir:
                learner.save(name, job.checkpoint_dir)
            tokens = sum(len(s.completion_ids) for s in samples) / len(samples)
            out[name].append(LocalStep(step=step, mean_reward=scored.mean_reward, mean_tokens=tokens, loss=stats.loss))
            if learner.adapters[name].version >= a.steps or (a.stop_reward is not None and scored.mean_reward >= a.stop_reward):
                del live[name]
    return out
