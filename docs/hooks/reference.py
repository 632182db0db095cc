"""The docs site's reference pages, generated from the code at build time (an MkDocs hook).

``mkdocs.yml`` names this module under ``hooks:``. On every build it writes four pages that
exist only in the built site, never in ``docs/``, so they cannot go stale:

- ``reference/config.md``: the ``rlix-run`` config, from the pydantic models of :mod:`rlix.exec.config`;
- ``reference/trace.md``: the trace format, from the pydantic models of :mod:`rlix.trace`;
- ``reference/scheduler.md``: the scheduler knobs, from :class:`rlix.core.SchedulerConfig` (its
  fields, defaults and docstring) and the config models' defaults for each shell;
- ``reference/cli.md``: the three commands, from their argparse parsers (``build_parser()`` of
  each console script in ``pyproject.toml``).

It imports those modules and builds the parsers; it starts nothing (no Ray, no torch).
``tests/test_docs.py`` builds the site and reads these pages in it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's rlix, whatever is installed

from pydantic import BaseModel  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

GENERATED = {
    "reference/config.md": "the rlix-run config",
    "reference/trace.md": "the trace format",
    "reference/scheduler.md": "the scheduler knobs",
    "reference/cli.md": "the command lines",
}


# ------------------------------------------------------------------ text


def _md(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown code spans."""
    text = re.sub(r":(?:class|func|meth|attr|data|mod):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _md(" ".join(text.split())).replace("|", "\\|")


def _doc(obj: object) -> str:
    """The first paragraph of an object's own docstring (none inherited), as one line."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return _cell(inspect.cleandoc(doc).split("\n\n")[0]) if doc else ""


# ------------------------------------------------------------------ pydantic models


def _slug(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top"


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type(annotation: object, link: Callable[[type[BaseModel]], str]) -> str:
    """An annotation in words: ``int``, ``list of float``, ``"batch" or "streaming"``, a link to a block."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return link(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{a!r}`".replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [_type(a, link) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type(args[0], link)}"
    if origin is dict:
        return f"map of {_type(args[0], link)} to {_type(args[1], link)}"
    if origin is typing.Annotated:
        return _type(args[0], link)
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >="), ("max_length", "length <="))


def _bounds(field) -> str:
    out = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
        pattern = getattr(meta, "pattern", None)
        if pattern:
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


def _default(field) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        made = field.default_factory()
        return "see its block" if isinstance(made, BaseModel) else "none" if made in ([], {}) else _value(made)
    if field.default is PydanticUndefined:
        return ""
    return _value(field.default)


def _value(value: object) -> str:
    """A default as the YAML or JSON file writes it: ``true``, ``null``, ``"rlix"``, ``0.5``."""
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float, str)):
        return f"`{json.dumps(value)}`"
    return f"`{value!r}`"


def model_page(title: str, intro: str, root: type[BaseModel], top: str) -> str:
    """Every block reachable from ``root``, one section per path (``jobs[].train``), a table of its fields."""
    sections: list[tuple[str, type[BaseModel]]] = []
    seen: set[str] = set()

    def visit(path: str, model: type[BaseModel], chain: tuple[type, ...]) -> None:
        if path in seen or model in chain:
            return
        seen.add(path)
        sections.append((path, model))
        for name, field in model.model_fields.items():
            origin = typing.get_origin(field.annotation)
            inner = [typing.get_origin(a) for a in typing.get_args(field.annotation)]
            suffix = "[]" if origin is list or list in inner else ".ROLE" if origin is dict else ""
            for sub in _models_in(field.annotation):
                visit(f"{path}.{name}{suffix}" if path != top else f"{name}{suffix}", sub, (*chain, model))

    visit(top, root, ())
    out = [f"# {title}", "", intro, ""]
    for path, model in sections:
        out += [f"## `{path}` {{#{_slug(path)}}}", ""]
        if _doc(model):
            out += [_doc(model), ""]
        out += ["| field | type | default | constraints | meaning |", "| --- | --- | --- | --- | --- |"]
        prefix = "" if path == top else path
        for name, field in model.model_fields.items():
            here = f"{prefix}.{name}" if prefix else name
            origin = typing.get_origin(field.annotation)
            inner = [typing.get_origin(a) for a in typing.get_args(field.annotation)]
            suffix = "[]" if origin is list or list in inner else ".ROLE" if origin is dict else ""

            def link(m: type[BaseModel], here: str = here, suffix: str = suffix) -> str:
                return f"[{m.__name__}](#{_slug(here + suffix)})"

            row = (f"`{name}`", _type(field.annotation, link), _default(field), _bounds(field), _cell(field.description or ""))
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def config_page() -> str:
    from rlix.exec.config import RunConfig

    intro = (
        "Every field of an `rlix-run` config (YAML), generated from the pydantic models in "
        "`rlix/exec/config.py` when the site is built. Unknown keys are errors; an error names the "
        "field, what is wrong and how to fix it. The `scheduler` block's knobs are explained on "
        "[the scheduler knobs](scheduler.md) page; a job's shared fields (`roles`, `home`, `staleness`, "
        "`priority`, `tenant`, ...) are the same as a trace pipeline's ([the trace format](trace.md))."
    )
    return model_page("The rlix-run config", intro, RunConfig, "config")


def trace_page() -> str:
    from rlix.trace import TraceModel

    intro = (
        'Every field of a trace (`"format": "rlix-trace", "version": 1`), generated from the '
        "pydantic models in `rlix/trace.py` when the site is built. `rlix-sim schema` prints the same "
        "format as a JSON Schema (committed at `rlix/schema/trace-v1.schema.json`), and "
        "`rlix-sim validate TRACE` checks a file against it. GPU lists may be written as ranges "
        '(`"0-7"`, `"0-3,8-11"`).'
    )
    return model_page("The trace format", intro, TraceModel, "trace")


# ------------------------------------------------------------------ scheduler knobs


def knob_docs(cls: type) -> dict[str, str]:
    """Each ``- ``name``: text`` bullet of a dataclass's docstring, by name."""
    out: dict[str, str] = {}
    name = None
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        start = re.match(r"- ``(\w+)``(.*)", line.strip())
        if start:
            name = start.group(1)
            out[name] = re.sub(r"^(\([^)]*\))?:", r"\1", start.group(2).strip()).strip()
        elif name and line.startswith("  "):
            out[name] += " " + line.strip()
        else:
            name = None
    return {k: _cell(v) for k, v in out.items()}


def scheduler_page() -> str:
    from rlix.config import SchedulerModel
    from rlix.core import SchedulerConfig
    from rlix.exec.config import SchedulerKnobs

    told = knob_docs(SchedulerConfig)
    fields = dataclasses.fields(SchedulerConfig)
    untold = [f.name for f in fields if f.name not in told]
    if untold:
        raise RuntimeError(f"SchedulerConfig's docstring says nothing of {untold}; add a bullet for each")

    def shell_default(model: type[BaseModel], name: str) -> str:
        return _default(model.model_fields[name])

    out = [
        "# The scheduler knobs",
        "",
        "The policy's knobs are the fields of `rlix.core.SchedulerConfig`; this page is generated from "
        "that class (its fields, defaults and docstring) when the site is built. A trace sets them in its "
        "`scheduler` block, an `rlix-run` config in its own, the service with "
        "`rlix scheduler start --set KNOB=VALUE`, and a replay with `rlix-sim replay TRACE --set KNOB=VALUE` "
        "(`rlix-sim sweep --knob NAME=V1,V2` tries several). The executor's defaults differ where its runs "
        "last seconds rather than hours. What they do together: [the scheduling model](../scheduling-model.md).",
        "",
        "| knob | core default | trace default | rlix-run default | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in fields:
        core = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        core_text = "none" if core == () else _value(core)
        row = (
            f'<a id="{f.name}"></a>`{f.name}`',
            core_text,
            shell_default(SchedulerModel, f.name),
            shell_default(SchedulerKnobs, f.name),
            told[f.name],
        )
        out.append("| " + " | ".join(row) + " |")
    out += [
        "",
        "## The control loop's periods",
        "",
        "Not policy knobs (the core never reads a clock), but set in the same block: how often the shell "
        "asks the core for a plan, and how often a job re-sends its demand.",
        "",
        "| field | trace default | rlix-run default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("plan_interval_s", "heartbeat_s"):
        row = (
            f"`{name}`",
            shell_default(SchedulerModel, name),
            shell_default(SchedulerKnobs, name),
            _cell(SchedulerModel.model_fields[name].description or ""),
        )
        out.append("| " + " | ".join(row) + " |")
    out += [
        "",
        "Tenants and queues take blocks of their own: "
        "[`scheduler.tenants[]`](config.md#scheduler-tenants) and "
        "[`scheduler.queues[]`](config.md#scheduler-queues).",
        "",
    ]
    return "\n".join(out)


# ------------------------------------------------------------------ command lines


def console_scripts() -> dict[str, str]:
    """Each command ``pyproject.toml`` installs, and its ``module:function``."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^"?([\w-]+)"?\s*=\s*"([\w.:]+)"', block, re.MULTILINE))


def parser_of(command: str) -> argparse.ArgumentParser:
    """The argparse parser of an installed command (its module's ``build_parser()``)."""
    module = console_scripts()[command].split(":")[0]
    return importlib.import_module(module).build_parser()


def _subcommands(parser: argparse.ArgumentParser, words: tuple[str, ...]):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*words, name))


def cli_page() -> str:
    out = [
        "# The command lines",
        "",
        "Each command's `--help`, generated from its argparse parser when the site is built. "
        "Guides: [`rlix-sim`](../simulator.md), [`rlix-run`](../executor.md), [`rlix`](../service.md).",
        "",
    ]
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # the help's line width, whatever terminal builds the site
    try:
        for command in console_scripts():
            for words, parser in _subcommands(parser_of(command), (command,)):
                level = "#" * min(len(words) + 1, 4)
                out += [f"{level} `{' '.join(words)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(out)


# ------------------------------------------------------------------ the hook


def pages() -> dict[str, str]:
    """Each generated page's path under the site and its Markdown."""
    makers = {
        "reference/config.md": config_page,
        "reference/trace.md": trace_page,
        "reference/scheduler.md": scheduler_page,
        "reference/cli.md": cli_page,
    }
    assert makers.keys() == GENERATED.keys()
    return {path: make() for path, make in makers.items()}


def on_files(files, config):
    """MkDocs event: add the generated pages to the site's files (nothing is written into ``docs/``)."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files
