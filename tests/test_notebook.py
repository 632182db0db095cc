"""The policy-research notebook executes headless and reports what it should.

The notebook is committed without outputs; this test runs it top to bottom in
a fresh ``python3`` kernel (ipykernel's own spec, no install needed) with the
notebooks folder as working directory, as Jupyter would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from rlix.core import POLICIES

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "policy_research.ipynb"


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return "\n".join(data.get(k, "") for k in ("text/markdown", "text/plain"))


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the notebook's outputs before committing"


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb


def test_notebook_runs_and_reports(executed):
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(_text(o) for o in outputs)
    for policy in POLICIES:
        assert policy in text
    for name in ("two_jobs", "mixed_agentic"):
        assert f"**{name}**" in text
    assert "throughput vs static" in text
    assert re.search(r"rlix runs \*\*\d+\.\d\dx\*\* static's throughput", text)
    assert re.search(r"advantage over static (falls|rises|stays) from \*\*\d+\.\d\dx\*\*", text)
    assert "backlog_weight" in text
    assert re.search(
        r"the default moves the makespan from \d\.\d{3}x to \*\*\d\.\d{3}x\*\* the lower bound and the mean JCT from [\d,]+ s "
        r"to \*\*[\d,]+ s\*\*",
        text,
    )
    assert re.search(r"Weighting by duration moves utilization from \d\.\d{3} to \*\*\d\.\d{3}\*\*", text)
    assert re.search(r"The fastest mode \(streaming[^)]*\) brings the interval to \*\*[\d,]+ s\*\* \(-\d+\.\d%\)", text)
    assert re.search(r"\d+ replays in \d+\.\d s", text)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3  # comparison, switch-cost sweep, backlog_weight sweep
