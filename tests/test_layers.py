"""The layers below the executor never import it, at module level or inside a function.

Read from the source (every ``import`` statement, wherever it sits), not from
what one run happens to load: a lazy import that only a rare path runs counts
too. ``rlix.core`` is the pure policy and imports nothing else of rlix; the
simulator, the step machine, the protocol, the client and the other shared
modules import nothing of ``rlix.exec``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
    """Every module but the executor's and the integrations' (the one layer above it)."""
    return sorted(p for p in RLIX.rglob("*.py") if not module_name(p).startswith(("rlix.exec", "rlix.integrations")))


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


def contracts() -> dict[str, list[str]]:
    """The import-linter contracts in pyproject.toml: each one's layers, top first, siblings split apart."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((RLIX.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    out = {}
    for c in config:
        prefix = f"{c['containers'][0]}." if c.get("containers") else ""
        out[c["name"]] = [f"{prefix}{unit.strip()}" for layer in c["layers"] for unit in layer.split("|")]
    return out


def test_the_contracts_name_every_part():
    """No module or package slips past the layers: each one directly under rlix, and under rlix.exec, is in one."""
    named = {unit for units in contracts().values() for unit in units}
    for package in (RLIX, RLIX / "exec"):
        parts = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
        parts |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
        prefix = module_name(package / "__init__.py")
        assert {f"{prefix}.{part}" for part in parts} - named == set(), prefix


def test_the_import_contracts_hold(tmp_path):
    """lint-imports (import-linter) on the contracts: every import counts, inside functions too."""
    res = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()", "--no-cache"],
        cwd=RLIX.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in res.stdout


def test_weight_sync_imports_without_the_executor_ray_or_torch():
    """An outside pipeline's process that only passes a publish on (or imports the library) pays for neither."""
    heavy = "m in ('torch', 'ray') or m.startswith('rlix.exec')"
    code = f"import sys, rlix.weightsync; print(sorted(m for m in sys.modules if {heavy}))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=RLIX.parent)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr[-2000:]
