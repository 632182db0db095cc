"""Reward functions for examples/data/arith.jsonl, written for TRL's GRPOTrainer.

Each takes the completions (text) plus any dataset column it needs by name
(``answer`` here) and ``**kwargs`` for the rest, and returns one float, or
None for "no opinion", per completion. They run unchanged under rlix-run.
"""


def exact_match(completions, answer, **kwargs):
    """1.0 when the completion is exactly the answer."""
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def format_ok(completions, **kwargs):
    """The fraction of the completion that is digits (or a minus sign), and not longer than 4 characters.

    A dense shaping signal: a random policy already differs on it.
    """
    out = []
    for c in completions:
        c = c.strip()
        if not c:
            out.append(0.0)
            continue
        digits = sum(ch.isdigit() or ch == "-" for ch in c) / len(c)
        out.append(digits * min(1.0, 4 / len(c)))
    return out


def subtraction_sign(completions, op, **kwargs):
    """Subtractions here are never negative: penalise a leading minus; no opinion on additions (None)."""
    return [(-1.0 if c.strip().startswith("-") else 0.0) if o == "sub" else None for c, o in zip(completions, op)]
