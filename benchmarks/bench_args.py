"""The benchmark scripts' command lines: a bad argument is one line and exit 2, as ``rlix-sim``'s are.

Not a benchmark: the scripts beside it import it (``python benchmarks/X.py`` puts this folder on the path).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import NoReturn


def fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block), exit 2; an option that takes one value
    refuses to be given twice (plain argparse keeps the last, silently)."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see 'python benchmarks/{self.prog}.py --help')")

    def add_argument(self, *names, **kwargs):
        if names and names[0].startswith("-") and kwargs.get("action", "store") == "store" and "nargs" not in kwargs:
            kwargs["action"] = _Once
        return super().add_argument(*names, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        vars(namespace).pop(_Once.SEEN, None)  # the arguments only (a script may write them out)
        return namespace, rest


class _Once(argparse.Action):
    """``store``, refusing a second value for the same option."""

    SEEN = "_given"  # the namespace's record of the options given so far, while it is parsed

    def __call__(self, parser, namespace, values, option_string=None):
        seen = vars(namespace).setdefault(self.SEEN, {})
        if self.dest in seen:
            parser.error(f"{option_string}: given twice ({seen[self.dest]} and {values}); give it once")
        seen[self.dest] = values
        setattr(namespace, self.dest, values)


def knob_values(prog: str, items: Iterable[str]) -> dict[str, str]:
    """``KNOB=VALUE`` arguments as a dict; anything else, or a knob given twice, is refused in one line."""
    knobs: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            fail(prog, f"'{item}' is not KNOB=VALUE; write e.g. small_first=0")
        if name in knobs:
            fail(prog, f"{name}: given twice ({knobs[name]} and {value}); give each knob once")
        knobs[name] = value
    return knobs


def replayable(prog: str, trace, policies: Iterable[str]) -> None:
    """Refuse ``trace`` (an :class:`rlix.trace.Trace`) in one line unless its streams draw and every job can
    roll out under each of ``policies``: what ``rlix-sim replay`` checks before it runs, checked before any replay."""
    from rlix.sim.simulator import replay_refusal

    if (refusal := replay_refusal(trace, list(policies))) is not None:
        fail(prog, refusal)
