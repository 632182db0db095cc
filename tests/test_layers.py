"""The layers below the executor never import it, at module level or inside a function.

Read from the source (every ``import`` statement, wherever it sits), not from
what one run happens to load: a lazy import that only a rare path runs counts
too. ``rlix.core`` is the pure policy and imports nothing else of rlix; the
simulator, the step machine, the protocol, the client and the other shared
modules import nothing of ``rlix.exec``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RLIX = Path(__file__).resolve().parent.parent / "rlix"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RLIX.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def rlix_imports(source: str, package: str) -> set[str]:
    """Every rlix module ``source`` (a module of ``package``) imports, absolute or relative, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(x for x in (base, node.module or "") if x)
            found |= {module} | {f"{module}.{a.name}" for a in node.names}  # a name may be a submodule
    return {m for m in found if m == "rlix" or m.startswith("rlix.")}


def imports_of(path: Path) -> set[str]:
    name = module_name(path)
    return rlix_imports(path.read_text(), name if path.name == "__init__.py" else name.rpartition(".")[0])


def below_exec() -> list[Path]:
    return sorted(p for p in RLIX.rglob("*.py") if not module_name(p).startswith("rlix.exec"))


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    source = "import os\nfrom . import peer\ndef f():\n    from rlix.exec.front import api\n    from .. import exec\n"
    found = rlix_imports(source, "rlix.sim")
    assert {"rlix.sim.peer", "rlix.exec.front.api", "rlix.exec"} <= found and "os" not in found


@pytest.mark.parametrize("path", below_exec(), ids=module_name)
def test_nothing_below_the_executor_imports_it(path):
    assert not {m for m in imports_of(path) if m.startswith("rlix.exec")}


@pytest.mark.parametrize("path", sorted((RLIX / "core").rglob("*.py")), ids=module_name)
def test_the_core_imports_only_itself(path):
    assert {m for m in imports_of(path) if not m.startswith("rlix.core")} == set()


# The executor's own layers, lowest first: a unit (a module or a package directly under rlix.exec) imports
# only units of lower layers (and itself). So no circle of its packages can form.
EXEC_LAYERS = (
    ("errors", "device_memory", "host_priority", "records", "deadline", "placement"),
    ("messages",),
    ("recorder",),
    ("data",),
    ("config",),
    ("train",),
    ("rollout",),
    ("control",),
    ("job",),
    ("service",),
    ("front",),
)
EXEC_LAYER = {unit: i for i, units in enumerate(EXEC_LAYERS) for unit in units}


def exec_unit(module: str) -> str | None:
    """``rlix.exec.job.coordinator`` -> ``job``; None for ``rlix.exec`` itself and for modules outside it."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["rlix", "exec"] else None


def test_every_executor_unit_has_a_layer():
    units = {exec_unit(module_name(p)) for p in (RLIX / "exec").rglob("*.py")} - {None}
    assert units == set(EXEC_LAYER)


@pytest.mark.parametrize("path", sorted((RLIX / "exec").rglob("*.py")), ids=module_name)
def test_the_executor_imports_only_down_its_layers(path):
    unit = exec_unit(module_name(path))
    if unit is None:
        return
    up = {m for m in imports_of(path) if exec_unit(m) not in (None, unit) and EXEC_LAYER[exec_unit(m)] >= EXEC_LAYER[unit]}
    assert not up, f"{unit} (layer {EXEC_LAYER[unit]}) imports {sorted(up)}"
