"""Each rule of a job's step is defined once, below both shells, and both shells use that definition.

The table names where each rule lives and the simulator and executor modules that apply it. A test
reads the source: each user imports the rule from its home, and no module of either shell defines a
function or class of the same name (a copy that could drift).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "rlix"

# rule -> (its home module, the name it is defined by, the modules that apply it: the two shells', or the
# rollout book's, which both shells drive)
RULES = {
    "the job plan (streams, batch sizes, staleness, rollout mode)": (
        "rlix/step.py",
        "job_plan",
        ("rlix/sim/pipeline.py", "rlix/exec/job/coordinator.py"),
    ),
    "the step process and its effect order": (
        "rlix/step.py",
        "Driver",
        ("rlix/sim/pipeline.py", "rlix/exec/job/step_runner.py"),
    ),
    "a job's trajectories: what starts next and on which free worker, what a preemption or a failure does, dropped batches, "
    "completion": (
        "rlix/rollout_book.py",
        "RolloutBook",
        ("rlix/sim/engine.py", "rlix/exec/rollout/queue.py"),
    ),
    "when a batch is rolled out, and the oldest weights under it (kept by the rollout book)": (
        "rlix/rollout_book.py",
        "BatchTally",
        ("rlix/exec/rollout/queue.py", "rlix/exec/job/step_runner.py"),  # the simulator's engine holds the book's as is
    ),
    "the weights under a trajectory (sync on demand, drain, partial rollout)": (
        "rlix/job.py",
        "weight_gate",
        ("rlix/sim/engine.py", "rlix/exec/rollout/control.py"),
    ),
    "the order in which waiting trajectories start": (
        "rlix/lengths.py",
        "PredictedQueue",
        ("rlix/rollout_book.py",),
    ),
    "the order in which trajectories taken off a worker wait again (the order they last started)": (
        "rlix/lengths.py",
        "to_front",
        (),  # both queues of the rollout book put back through it; the shells call the book's put_back
    ),
    "where a worker's GPUs are booked in each phase": (
        "rlix/job.py",
        "worker_booking",
        ("rlix/sim/engine.py", "rlix/exec/rollout/dispatch.py"),
    ),
}


def _tree(path: str) -> ast.Module:
    return ast.parse((ROOT.parent / path).read_text())


def _defined(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def _imported_from(tree: ast.Module, module: str) -> set[str]:
    """Names imported from ``module`` anywhere in the file (inside functions too)."""
    return {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == module for a in n.names}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_has_one_definition_that_both_shells_use(rule):
    home, name, users = RULES[rule]
    assert name in _defined(_tree(home)), f"{rule}: {name} is not defined in {home}"
    module = home.removesuffix(".py").replace("/", ".")
    for user in users:
        assert name in _imported_from(_tree(user), module), f"{rule}: {user} does not use {module}.{name}"
    shells = [p for d in ("sim", "exec") for p in sorted((ROOT / d).rglob("*.py"))]
    copies = [str(p.relative_to(ROOT.parent)) for p in shells if name in _defined(ast.parse(p.read_text()))]
    assert copies == [], f"{rule}: {name} is defined again in {copies}"
