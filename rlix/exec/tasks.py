"""Executor layer: verifiable tasks generated in code.

A task samples prompts from a seeded generator and scores a completion with
a rule (no reward model). Tasks are chosen by name from :data:`TASKS`.
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
        """0..1: half for the right length, half for the right character at each position.

        Both halves are dense so a group of samples from a random policy
        already differs in reward, which is all GRPO needs to make progress.
        """
        target = prompt.answer
        hits = sum(1 for a, b in zip(completion, target) if a == b)
        length = max(0.0, 1.0 - abs(len(completion) - len(target)) / max(len(target), 1) / 4)
        return 0.5 * length + 0.5 * hits / max(len(completion), len(target), 1)


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
