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
    """argparse with its errors on one line (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see 'python benchmarks/{self.prog}.py --help')")


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
