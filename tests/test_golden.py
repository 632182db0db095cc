"""Golden replays: shipped traces against committed summaries.

The summaries change only on purpose: after a deliberate policy or simulator
change, regenerate them with ``RLIX_UPDATE_GOLDEN=1 pytest tests/test_golden.py``
and commit the diff with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlix.core import POLICIES
from rlix.sim.report import results_json, write_json
from rlix.sim.simulator import replay
from rlix.trace import load_trace

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    "name",
    [
        "single",
        "two_jobs",
        "mixed_agentic",
        "verl_dapo_colocated",
        "async_disaggregated",
        "agentic_swe",
        "queued_cluster",
        "colocated_node",
    ],
)
def test_shipped_trace_replays_to_its_golden_summary(name, tmp_path):
    trace = load_trace(ROOT / "traces" / f"{name}.json")
    runs = {p: replay(trace, p) for p in POLICIES}
    out = tmp_path / f"{name}.json"
    write_json(results_json(name, f"traces/{name}.json", trace.cluster.num_gpus, runs), out)
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("RLIX_UPDATE_GOLDEN") == "1":
        golden.write_bytes(out.read_bytes())
    assert golden.exists(), f"no golden summary for {name}; run with RLIX_UPDATE_GOLDEN=1 to create it"
    assert out.read_text() == golden.read_text(), f"{name} replay drifted from tests/golden/{name}.json"
