"""Reward functions in the forms TRL's GRPOTrainer documents (used by the tests as written)."""

import os
import re
import sys


def reward_len(completions, **kwargs):
    """completions + **kwargs: prefer completions of 3 characters."""
    return [-abs(3 - len(c)) for c in completions]


def match_answer(completions, answer, **kwargs):
    """A named dataset column (answer)."""
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def echoes_prompt(prompts, completions, **kwargs):
    """prompts + completions."""
    return [1.0 if p.rstrip("=") == c else 0.0 for p, c in zip(prompts, completions)]


def short_ids(completion_ids, **kwargs):
    """completion_ids: token counts."""
    return [float(len(ids) <= 2) for ids in completion_ids]


def think_format(completions, **kwargs):
    """TRL's conversational form: each completion a list with one assistant message."""
    pattern = r"^<think>.*?</think>"
    return [1.0 if re.match(pattern, c[0]["content"]) else 0.0 for c in completions]


def only_sub(completions, op, **kwargs):
    """None where it has no opinion."""
    return [1.0 if o == "sub" else None for o in op]


def raises(completions, **kwargs):
    raise ValueError("bad\nthing")


def exits(completions, **kwargs):
    sys.exit(3)


def too_few(completions, **kwargs):
    return [1.0]


def by_index(completions, **kwargs):  # iterating gives the keys 0, 1, 2: rewards in no completion's order
    return {i: 0.5 for i in range(len(completions))}


def not_numbers(completions, **kwargs):
    return ["high"] * len(completions)


def numeric_strings(completions, **kwargs):
    return ["1.0"] * len(completions)


def positional_only(x):
    return [0.0]


def no_kwargs(completions):
    return [0.0] * len(completions)


def needs_missing_column(completions, solution, **kwargs):
    return [0.0] * len(completions)


NOT_CALLABLE = 3


def nan_is_none(completions, **kwargs):
    return [float("nan")] + [1.0] * (len(completions) - 1)


def infinite(completions, **kwargs):
    return [float("inf")] * len(completions)


def parses_json(completions, **kwargs):
    """Raises inside the standard library (json) on a completion that is not JSON."""
    import json

    return [float(json.loads(c)) for c in completions]


def hangs(completions, **kwargs):
    """Never returns (a judge that does not answer)."""
    import threading

    threading.Event().wait()


def says_then_hangs(completions, **kwargs):
    """Says it was called, then never returns."""
    import threading

    print("scoring, for ever")
    threading.Event().wait()


def holds_the_lock(completions, **kwargs):
    """Seconds in C with the interpreter lock held (a regular expression backtracking over its input)."""
    import re

    re.match(r"(a+)+$", "a" * 29 + "!")
    return [0.0 for _ in completions]


def prints(completions, **kwargs):
    print(f"scoring {len(completions)} completions")
    return [0.0] * len(completions)


def dies(completions, **kwargs):
    print("going")
    os._exit(7)
