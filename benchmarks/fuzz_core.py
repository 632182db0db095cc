"""Fuzz: the policy core over random valid setups with random knobs.

Runs N random setups (cluster, pipelines of TP 1-8 with overlapping
mappings, every policy, every scheduler knob including
``min_residency_s=0``, event sequences with gang stages, demand reports
and departures) and prints how many raised an exception and how many had a
plan replaced because it broke an invariant. Not a test: figures.

    python benchmarks/fuzz_core.py [--setups 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's rlix, and the shared generator

from core_fuzz import run_setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    exceptions = violated = 0
    first = None
    warnings.simplefilter("ignore", RuntimeWarning)  # counted below instead
    for i in range(args.setups):
        rng = random.Random(args.seed * 1_000_003 + i)
        try:
            sched = run_setup(rng)
        except Exception:  # noqa: BLE001 - counting every kind of failure is the point
            exceptions += 1
            first = first or (i, traceback.format_exc())
            continue
        violated += bool(sched.violations)
        if sched.violations and first is None:
            first = (i, repr(sched.violations[0]))
    print(f"setups: {args.setups}  exceptions: {exceptions}  setups with a replaced plan: {violated}")
    if first is not None:
        print(f"first failure (setup {first[0]}):\n{first[1]}")


if __name__ == "__main__":
    main()
