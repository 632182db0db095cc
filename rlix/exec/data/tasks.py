"""Executor layer: verifiable tasks generated in code.

A task samples prompts (each row: the prompt text and its ``answer``) from a
seeded generator; :func:`digit_match` scores completions as a TRL-style
reward function, exactly as a user's dataset and reward file would be.
Tasks are chosen by name from :data:`TASKS`; ``python -m rlix.exec.data.tasks
copy 200`` writes a task's rows as JSONL.
"""

from __future__ import annotations

import abc
import math
import random
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One task instance: the text the policy sees and the answer it should give."""

    prompt_id: int
    text: str
    answer: str


class Task(abc.ABC):
    name: ClassVar[str]

    def __init__(self, *, min_len: int = 1, max_len: int = 4) -> None:
        self.min_len = min_len
        self.max_len = max_len

    @abc.abstractmethod
    def make(self, rng: random.Random, prompt_id: int) -> Prompt: ...

    def length(self, rng: random.Random) -> int:
        """Long-tailed answer length: most short, a few up to ``max_len``."""
        median = max(self.min_len, (self.min_len + self.max_len) / 4)
        return max(self.min_len, min(self.max_len, round(rng.lognormvariate(math.log(median), 0.6))))

    def sample(self, rng: random.Random, start_id: int, n: int) -> list[Prompt]:
        return [self.make(rng, start_id + i) for i in range(n)]

    @staticmethod
    def reward(prompt: Prompt, completion: str) -> float:
        return digit_match([completion], [prompt.answer])[0]


def digit_match(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """The digit tasks' reward, written as a TRL ``GRPOTrainer`` reward function.

    0..1 per completion: half for the right length, half for the right
    character at each position. Both halves are dense so a group of samples
    from a random policy already differs in reward, which is all GRPO needs
    to make progress.
    """
    out = []
    for completion, target in zip(completions, answer):
        hits = sum(1 for a, b in zip(completion, target) if a == b)
        length = max(0.0, 1.0 - abs(len(completion) - len(target)) / max(len(target), 1) / 4)
        out.append(0.5 * length + 0.5 * hits / max(len(completion), len(target), 1))
    return out


class CopyTask(Task):
    """``"417="`` -> ``"417"``: repeat a random digit string."""

    name = "copy"

    def make(self, rng: random.Random, prompt_id: int) -> Prompt:
        digits = "".join(rng.choice("0123456789") for _ in range(self.length(rng)))
        return Prompt(prompt_id=prompt_id, text=digits + "=", answer=digits)


class ReverseTask(Task):
    """``"417="`` -> ``"714"``: reverse a random digit string."""

    name = "reverse"

    def make(self, rng: random.Random, prompt_id: int) -> Prompt:
        digits = "".join(rng.choice("0123456789") for _ in range(self.length(rng)))
        return Prompt(prompt_id=prompt_id, text=digits + "=", answer=digits[::-1])


TASKS: dict[str, type[Task]] = {t.name: t for t in (CopyTask, ReverseTask)}


def make_task(name: str, *, min_len: int, max_len: int) -> Task:
    return TASKS[name](min_len=min_len, max_len=max_len)


def main(argv: list[str] | None = None) -> None:
    """Write ``N`` rows of a task as JSONL on stdout (``prompt``, ``answer``)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m rlix.exec.data.tasks", description="write a digit task as a JSONL dataset")
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("rows", type=int)
    p.add_argument("--max-len", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    task = make_task(args.task, min_len=1, max_len=args.max_len)
    for prompt in task.sample(random.Random(args.seed), 0, args.rows):
        print(json.dumps({"prompt": prompt.text, "answer": prompt.answer}))


if __name__ == "__main__":
    main()
