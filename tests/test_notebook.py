"""The policy-research notebook is committed with its outputs, and a fresh run reproduces them.

The test runs the notebook top to bottom in a fresh ``python3`` kernel
(ipykernel's own spec, no install needed) with the notebooks folder as
working directory, as Jupyter would, checks what it reports, and compares
every printed figure with the committed outputs (images and the run time
aside). After a change to the notebook, the policies or the traces, refresh
the committed outputs with ``python tests/test_notebook.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from rlix.core import POLICIES

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]  # the whole notebook: dozens of replays

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "policy_research.ipynb"
RUN_TIME = re.compile(r"(\d+ replays) in \d+\.\d s on \d+ CPU cores")  # the one printed figure a rerun changes
IMAGES = 3  # comparison, switch-cost sweep, backlog_weight sweep


def execute(nb):
    """Run ``nb`` in place in a fresh kernel; raises CellExecutionError on the first failing cell."""
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", record_timing=False, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()
    return nb


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return "\n".join(data.get(k, "") for k in ("text/markdown", "text/plain"))


def _outputs(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


def _printed(nb) -> list[list[tuple[str, str]]]:
    """Per code cell, each output's kind and text, the run time masked; an image counts by its kind alone."""
    return [
        [
            ("image" if "image/png" in o.get("data", {}) else o.get("output_type"), RUN_TIME.sub(r"\1 in (time)", _text(o)))
            for o in cell.outputs
        ]
        for cell in nb.cells
        if cell.cell_type == "code"
    ]


@pytest.fixture(scope="module")
def committed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    return nb


@pytest.fixture(scope="module")
def executed(committed):
    return execute(nbformat.from_dict(committed))


def test_notebook_is_committed_with_outputs_from_one_run(committed):
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in code), "run `python tests/test_notebook.py` to commit the notebook with its outputs"
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))  # top to bottom, once
    outputs = _outputs(committed)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == IMAGES


def test_notebook_runs_and_reports(executed):
    outputs = _outputs(executed)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(_text(o) for o in outputs)
    for policy in POLICIES:
        assert policy in text
    for name in ("two_jobs", "mixed_agentic"):
        assert f"**{name}**" in text
    assert "throughput vs static" in text
    assert re.search(r"rlix runs \*\*\d+\.\d\dx\*\* static's throughput", text)
    assert re.search(r"advantage over static (falls|rises|stays) from \*\*\d+\.\d\dx\*\*", text)
    for split in ("demand", "plain"):
        assert re.search(
            rf"On the {split} split, raising `backlog_weight` from 0 to 4 changes the makespan by \*\*-\d+\.\d%\*\* on average "
            r"\(shorter in \d of 3 traces\), the short jobs' JCT by \*\*\+\d+\.\d%\*\*",
            text,
        )
    assert "Over the family the runs show the documented trade-off on both splits" in text
    assert re.search(
        r"the default moves the makespan from \d\.\d{3}x to \*\*\d\.\d{3}x\*\* the lower bound and the mean JCT from [\d,]+ s "
        r"to \*\*[\d,]+ s\*\*",
        text,
    )
    assert re.search(r"Weighting by duration moves utilization from \d\.\d{3} to \*\*\d\.\d{3}\*\*", text)
    assert re.search(r"The fastest mode \(streaming[^)]*\) brings the interval to \*\*[\d,]+ s\*\* \(-\d+\.\d%\)", text)
    replays = re.search(r"(\d+) replays in \d+\.\d s", text)
    assert replays and f"({replays[1]} replays)" in executed.cells[0].source  # the introduction counts them right
    assert sum("image/png" in o.get("data", {}) for o in outputs) == IMAGES


def test_committed_outputs_match_a_fresh_run(committed, executed):
    assert _printed(executed) == _printed(committed), "outputs changed: run `python tests/test_notebook.py` and commit"


if __name__ == "__main__":  # refresh the committed outputs: python tests/test_notebook.py
    nb = execute(nbformat.read(NOTEBOOK, as_version=4))
    nbformat.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK} with its outputs", file=sys.stderr)
