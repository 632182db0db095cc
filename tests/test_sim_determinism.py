"""Determinism across fresh processes: the same trace gives the same bytes,
whatever the process's hash seed (no decision may depend on set order).
benchmarks/bench_determinism.py runs the full version (20 processes, every
trace, every policy); this keeps to a few processes so it stays quick."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from bench_determinism import distinct_results

TRACES = Path(__file__).parent.parent / "traces"


@pytest.mark.parametrize(
    ("name", "runs", "policies"),
    [
        ("single", 3, []),  # every policy
        ("two_jobs", 3, []),
        ("mixed_agentic", 2, ["rlix"]),  # the longest shipped replay: one policy keeps the test quick
    ],
)
def test_fresh_processes_with_different_hash_seeds_write_identical_bytes(name, runs, policies):
    assert distinct_results(TRACES / f"{name}.json", runs=runs, jobs=2, policies=policies) == 1
