"""Ctrl-C during ``rlix-run``: every job stops, the outputs of the time run are written (marked
partial), no traceback, and the partial trace replays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import narrowed_raw, roles

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu_two_jobs.yaml"


def _wait_for_a_step(out: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "rlix-run ended before it was interrupted"
        if any(p.read_text().strip() for p in out.glob("*/metrics.jsonl")):
            return
        time.sleep(1.0)
    raise AssertionError(f"no step finished within {timeout_s} s")


@pytest.mark.heavy
def test_ctrl_c_stops_every_job_and_writes_partial_outputs(tmp_path):
    out = tmp_path / "out"
    # The example on 2 GPUs, a home of one each, at twice its decode pace: 6 model processes rather than 10.
    config = tmp_path / "two_jobs.yaml"
    homes = {name: {"home": [g], "roles": roles(g, 2)} for g, name in enumerate(("small", "large"))}
    config.write_text(yaml.safe_dump(narrowed_raw(EXAMPLE, 2, homes, pace=0.5)))
    # A terminal's Ctrl-C goes to the whole foreground process group: so does this one.
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlix.exec.front.cli", str(config), "--out", str(out), "--no-console"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=os.environ,
    )
    try:
        _wait_for_a_step(out, proc, timeout_s=400)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "stopped by Ctrl-C" in stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["executor"]["partial"] is True
    statuses = {pid: j["status"] for pid, j in metrics["executor"]["jobs"].items()}
    assert set(statuses.values()) <= {"cancelled", "finished"} and "cancelled" in statuses.values(), statuses
    assert "cancelled steps=" in stdout
    replay = subprocess.run(
        [sys.executable, "-m", "rlix.sim.cli", "replay", str(out / "trace.json")], capture_output=True, text=True, timeout=300
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
