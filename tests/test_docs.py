"""What the README and the examples tell a user to run or read exists under that name."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "examples").glob("*.yaml")), *sorted((ROOT / "benchmarks").glob("*.py"))]


def _text(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_modules_and_files_exist(doc):
    text = _text(doc)
    for module in re.findall(r"python -m (rlix[\w.]*)", text):
        assert importlib.util.find_spec(module) is not None, f"{doc.name}: python -m {module} names no module"
    for path in re.findall(r"\brlix/[\w/]+\.(?:py|json)\b", text):
        assert (ROOT / path).exists(), f"{doc.name}: {path} does not exist"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_say_rlix_run(example):
    """Each example's header shows how to run it the way the README does: rlix-run <the example>."""
    header = "\n".join(line for line in _text(example).splitlines() if line.startswith("#"))
    assert f"rlix-run examples/{example.name}" in header
    assert "python -m rlix" not in header
