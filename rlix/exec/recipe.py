"""Executor layer: one job's RL recipe as plain data, shared by every driver.

Turns a step index into rollout requests (prompts x group samples) and
finished generations into scored training samples. It imports no torch and
no transformers (only the ``tokenizers`` library), so the light Ray
coordinator can run it; the same functions drive the in-process runner.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlix.exec.grpo import group_advantages
from rlix.exec.messages import GenRequest, GenResult, Sample
from rlix.exec.tasks import Prompt, Task, make_task


class TextCodec:
    """Encode/decode with a checkpoint's ``tokenizer.json`` (no transformers import)."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        cfg = json.loads((model_dir / "config.json").read_text())
        self.bos_id = cfg.get("bos_token_id")
        self.eos_id = int(cfg["eos_token_id"] if not isinstance(cfg["eos_token_id"], list) else cfg["eos_token_id"][0])

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return tuple(([self.bos_id] if self.bos_id is not None else []) + ids)

    def decode(self, ids: tuple[int, ...]) -> str:
        return self._tok.decode([t for t in ids if t != self.eos_id], skip_special_tokens=True)


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One planned trajectory of a step (the unit that is queued and re-queued)."""

    step: int
    prompt: Prompt
    request: GenRequest


@dataclass(frozen=True, kw_only=True)
class ScoredStep:
    samples: tuple[Sample, ...]
    rewards: tuple[float, ...]

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / max(len(self.rewards), 1)


class Recipe:
    """The GRPO data path of one job: prompts in, advantages out."""

    def __init__(
        self, *, task: Task, codec: TextCodec, prompts_per_step: int, group_size: int, max_new_tokens: int, temperature: float, seed: int, adapter: str = "", traj_base: int = 0
    ) -> None:
        self.adapter = adapter  # multi-LoRA: the adapter this stream trains ("" = full finetune)
        self.traj_base = traj_base  # first trajectory id of this stream (ids are unique per job)
        self.task = task
        self.codec = codec
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed

    @classmethod
    def for_job(cls, job, model_dir: str | Path) -> Recipe:
        return cls._of(job, job.task, job.seed, model_dir)

    @classmethod
    def for_adapter(cls, job, index: int, model_dir: str | Path) -> Recipe:
        """The recipe of ``job.adapters[index]``: its own task and seed, the job's batch shape."""
        a = job.adapters[index]
        return cls._of(job, a.task, a.seed, model_dir, adapter=a.name, traj_base=(index + 1) << 32)

    @classmethod
    def _of(cls, job, task, seed: int, model_dir: str | Path, **stream) -> Recipe:
        return cls(
            task=make_task(task.name, min_len=task.min_len, max_len=task.max_len),
            codec=TextCodec(model_dir),
            prompts_per_step=job.prompts_per_step,
            group_size=job.group_size,
            max_new_tokens=job.max_new_tokens,
            temperature=job.temperature,
            seed=seed,
            **stream,
        )

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def trajectories(self, step: int) -> list[Trajectory]:
        """The step's trajectories; deterministic in (seed, step)."""
        rng = random.Random(self.seed * 7919 + step)
        prompts = self.task.sample(rng, step * self.prompts_per_step, self.prompts_per_step)
        out = []
        for p in prompts:
            ids = self.codec.encode_prompt(p.text)
            for g in range(self.group_size):
                traj_id = self.traj_base + step * self.batch_size + len(out)
                req = GenRequest(
                    traj_id=traj_id,
                    prompt_ids=ids,
                    max_new_tokens=self.max_new_tokens,
                    temperature=self.temperature,
                    seed=rng.randrange(1 << 30),
                    adapter=self.adapter,
                )
                out.append(Trajectory(step=step, prompt=p, request=req))
        return out

    def score(self, trajs: list[Trajectory], results: dict[int, GenResult]) -> ScoredStep:
        """Rewards and group-relative advantages for a finished step."""
        rewards = [self.task.reward(t.prompt, self.codec.decode(results[t.request.traj_id].token_ids)) for t in trajs]
        adv = group_advantages(rewards, [t.prompt.prompt_id for t in trajs])
        samples = tuple(
            Sample(
                prompt_ids=t.request.prompt_ids,
                completion_ids=results[t.request.traj_id].token_ids,
                advantage=a,
                old_logprobs=results[t.request.traj_id].logprobs,
            )
            for t, a in zip(trajs, adv)
        )
        return ScoredStep(samples=samples, rewards=tuple(rewards))


def continuation(request: GenRequest, partial: GenResult) -> GenRequest:
    """The request that resumes ``partial`` where an aborted worker left it."""
    return GenRequest(
        traj_id=request.traj_id,
        prompt_ids=request.prompt_ids,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        seed=request.seed,
        adapter=request.adapter,
        prefix_ids=partial.token_ids,
        prefix_logprobs=partial.logprobs,
    )
