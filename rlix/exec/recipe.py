"""Executor layer: one job's RL recipe as plain data, shared by every driver.

Turns a step index into rollout requests (prompts x group samples) and
finished generations into scored training samples. Prompts come from a
source (the user's dataset, or a task generated in code) and rewards from
TRL-style reward functions (the user's, or the tasks' :func:`digit_match`),
so a built-in task is a dataset plus a reward function like any other.
Scoring imports no torch and no transformers (only the ``tokenizers``
library), so the light Ray coordinator can run it; a data job's recipe is
built where transformers may be imported (the driver), then shipped.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from rlix.exec.data import DataError, DatasetPrompts, Encoder, PreparedPrompts, PromptItem, is_messages, model_limit, prepare, read_rows
from rlix.exec.grpo import Sample, group_advantages
from rlix.exec.rewards import FunctionScores, RewardBatch, RewardRef, RewardSet
from rlix.exec.rollout import GenRequest, GenResult
from rlix.exec.tasks import Task, make_task


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
    prompt: PromptItem
    request: GenRequest
    group: int = 0  # the prompt's position in the step: its samples form one GRPO group
    eval: bool = False  # scored for the eval report only, never trained on


@dataclass(frozen=True, kw_only=True)
class EvalScore:
    """Mean reward of the eval split under the weights the step's rollout used."""

    prompts: int
    mean_reward: float
    functions: tuple[FunctionScores, ...]


@dataclass(frozen=True, kw_only=True)
class ScoredStep:
    samples: tuple[Sample, ...]
    rewards: tuple[float, ...]
    functions: tuple[FunctionScores, ...] = ()  # each reward function's values on the training batch
    eval: EvalScore | None = None

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / max(len(self.rewards), 1)


class TaskPrompts:
    """A code-generated task as a prompt source: rows (prompt, answer) drawn from the step's generator."""

    def __init__(self, task: Task, codec: TextCodec) -> None:
        self.task = task
        self.codec = codec

    def batch(self, step: int, n: int, rng: random.Random) -> list[PromptItem]:
        return [
            PromptItem(row=p.prompt_id, prompt=p.text, prompt_ids=self.codec.encode_prompt(p.text), columns=(("answer", p.answer),))
            for p in self.task.sample(rng, step * n, n)
        ]


DIGIT_REWARD = "rlix.exec.tasks:digit_match"


class Recipe:
    """The GRPO data path of one job: prompts in, rewards and advantages out."""

    def __init__(
        self,
        *,
        source: TaskPrompts | DatasetPrompts,
        rewards: RewardSet,
        codec: TextCodec,
        prompts_per_step: int,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        adapter: str = "",
        traj_base: int = 0,
        eval_source: DatasetPrompts | None = None,
        eval_every: int = 0,
        report: tuple[PreparedPrompts, ...] = (),
    ) -> None:
        self.adapter = adapter  # multi-LoRA: the adapter this stream trains ("" = full finetune)
        self.traj_base = traj_base  # first trajectory id of this stream (ids are unique per job)
        self.source = source
        self.rewards = rewards
        self.codec = codec
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.eval_source = eval_source
        self.eval_every = eval_every
        self.report = report  # what preparing the data found (rows read, prompts left out)

    @classmethod
    def for_job(cls, job, model_dir: str | Path) -> Recipe:
        if getattr(job, "data", None) is not None:
            return cls.from_data(job, model_dir)
        return cls._of(job, job.task, job.seed, model_dir)

    @classmethod
    def for_adapter(cls, job, index: int, model_dir: str | Path) -> Recipe:
        """The recipe of ``job.adapters[index]``: its own task and seed, the job's batch shape."""
        a = job.adapters[index]
        return cls._of(job, a.task, a.seed, model_dir, adapter=a.name, traj_base=(index + 1) << 32)

    @classmethod
    def _of(cls, job, task, seed: int, model_dir: str | Path, **stream) -> Recipe:
        codec = TextCodec(model_dir)
        return cls(
            source=TaskPrompts(make_task(task.name, min_len=task.min_len, max_len=task.max_len), codec),
            rewards=RewardSet((RewardRef(function=DIGIT_REWARD),)),
            codec=codec,
            prompts_per_step=job.prompts_per_step,
            group_size=job.group_size,
            max_new_tokens=job.max_new_tokens,
            temperature=job.temperature,
            seed=seed,
            **stream,
        )

    @classmethod
    def from_data(cls, job, model_dir: str | Path) -> Recipe:
        """A job from the user's files: tokenized with the checkpoint's tokenizer (imports transformers).

        Raises :class:`DataError` for data that cannot train (every prompt too long,
        chat messages without a chat template, no tokenizer.json to decode with).
        """
        if not (Path(model_dir) / "tokenizer.json").is_file():
            raise DataError("path", f"{model_dir} has no tokenizer.json; save the checkpoint with a fast tokenizer (tokenizer.save_pretrained)")
        encoder = Encoder(model_dir, job.data.chat_template)
        override = job.vllm.max_model_len if job.rollout_backend == "vllm" else None
        limit = model_limit(model_dir, override)

        def load(path: str, split: str, field: str) -> PreparedPrompts:
            return prepare(read_rows(path, split), field, encoder, limit=limit, max_new_tokens=job.max_new_tokens)

        train = load(job.data.path, job.data.split, job.data.prompt_field)
        report = [train]
        eval_source = None
        if job.eval is not None:
            ev = load(job.eval.path, job.eval.split, job.eval.prompt_field or job.data.prompt_field)
            eval_source = DatasetPrompts(ev, job.seed)
            report.append(ev)
        base = os.getcwd()  # relative reward paths are the user's, from where rlix-run was started
        return cls(
            source=DatasetPrompts(train, job.seed),
            rewards=RewardSet(tuple(RewardRef(function=r.function, weight=r.weight, base_dir=base) for r in job.rewards)),
            codec=TextCodec(model_dir),
            prompts_per_step=job.prompts_per_step,
            group_size=job.group_size,
            max_new_tokens=job.max_new_tokens,
            temperature=job.temperature,
            seed=job.seed,
            eval_source=eval_source,
            eval_every=job.eval_every,
            report=tuple(report),
        )

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def trajectories(self, step: int) -> list[Trajectory]:
        """The step's trajectories (then its eval ones, on eval steps); deterministic in (seed, step)."""
        rng = random.Random(self.seed * 7919 + step)
        out = []
        for group, item in enumerate(self.source.batch(step, self.prompts_per_step, rng)):
            for _ in range(self.group_size):
                traj_id = self.traj_base + step * self.batch_size + len(out)
                out.append(Trajectory(step=step, prompt=item, request=self._request(traj_id, item, rng), group=group))
        return out + self._eval_trajectories(step)

    def _request(self, traj_id: int, item: PromptItem, rng: random.Random) -> GenRequest:
        return GenRequest(
            traj_id=traj_id,
            prompt_ids=item.prompt_ids,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=rng.randrange(1 << 30),
            adapter=self.adapter,
        )

    def is_eval_step(self, step: int) -> bool:
        return self.eval_source is not None and self.eval_every > 0 and step % self.eval_every == 0

    def _eval_trajectories(self, step: int) -> list[Trajectory]:
        """One sample per eval prompt, ids in their own range (bit 31) so they never meet training ids."""
        if not self.is_eval_step(step):
            return []
        rng = random.Random(self.seed * 7919 + step + (1 << 40))
        items = self.eval_source.items
        base = self.traj_base + (1 << 31) + step * len(items)
        return [Trajectory(step=step, prompt=it, request=self._request(base + i, it, rng), group=-1, eval=True) for i, it in enumerate(items)]

    def score(self, trajs: list[Trajectory], results: dict[int, GenResult]) -> ScoredStep:
        """Rewards and group-relative advantages for a finished step (eval trajectories scored apart)."""
        train = [t for t in trajs if not t.eval]
        batch = self._rewards(train, results)
        adv = group_advantages(list(batch.totals), [t.group for t in train])
        samples = tuple(
            Sample(
                prompt_ids=t.request.prompt_ids,
                completion_ids=results[t.request.traj_id].token_ids,
                advantage=a,
                old_logprobs=results[t.request.traj_id].logprobs,
            )
            for t, a in zip(train, adv)
        )
        evals = [t for t in trajs if t.eval]
        ev = None
        if evals:
            eb = self._rewards(evals, results)
            ev = EvalScore(prompts=len(evals), mean_reward=sum(eb.totals) / len(eb.totals), functions=eb.functions)
        return ScoredStep(samples=samples, rewards=batch.totals, functions=batch.functions, eval=ev)

    def _rewards(self, trajs: list[Trajectory], results: dict[int, GenResult]) -> RewardBatch:
        """Call the reward functions TRL's way: completions, prompts, completion ids and the rows' other columns."""
        ids = [list(results[t.request.traj_id].token_ids) for t in trajs]
        texts = [self.codec.decode(tuple(x)) for x in ids]
        completions = [[{"role": "assistant", "content": c}] if is_messages(t.prompt.prompt) else c for t, c in zip(trajs, texts)]
        columns: dict[str, list] = {}
        for t in trajs:
            for name, value in t.prompt.columns:
                columns.setdefault(name, []).append(value)
        return self.rewards.score(completions=completions, prompts=[t.prompt.prompt for t in trajs], completion_ids=ids, columns=columns)


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
