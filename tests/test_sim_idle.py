"""The simulator's control loop passes the ticks of an idle gap at once, exactly as ticking one by one
would: the same floats, the same heartbeats, the same replay."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlix.trace import load_trace

ROOT = Path(__file__).parent.parent


def brute_idle_ticks(now: float, interval: float, until: float, last_beat: float, heartbeat: float):
    """The control loop's idle ticks one by one, as ``Simulation._ticker`` passes them."""
    ticks = []
    t = now
    while t + interval < until:
        t += interval
        if t - last_beat >= heartbeat:
            last_beat = t
        ticks.append(t)
    return (ticks[-1], last_beat) if len(ticks) >= 2 else None


@pytest.mark.parametrize("seed", range(300))
def test_idle_ticks_are_passed_exactly_as_ticking_one_by_one_would(seed: int):
    from rlix.sim.simulator import idle_ticks

    rng = random.Random(seed)
    interval = rng.choice([5.0, 2.5, 1.0, 0.25, 0.1, 0.3, 7.0, 1e-3 * rng.randint(1, 5000)])
    now = interval * rng.randint(0, 50) if rng.random() < 0.5 else sum([interval] * rng.randint(0, 50))
    heartbeat = rng.choice([interval, 3 * interval, 7.0, 12.5, 30.0, rng.uniform(interval, 100 * interval)])
    last_beat = max(0.0, now - interval * rng.randint(0, 2 * int(heartbeat / interval) + 1))  # a tick, as in the loop
    until = now + rng.choice([rng.uniform(0, 3 * interval), rng.uniform(0, 5000 * interval)])
    got = idle_ticks(now, interval, until, last_beat, heartbeat)
    if got is not None:  # where it passes ticks, they are the same floats, the heartbeat's too
        assert got == brute_idle_ticks(now, interval, until, last_beat, heartbeat)
    if interval in (5.0, 2.5, 1.0, 0.25) and now == interval * round(now / interval):
        assert (got is None) == (brute_idle_ticks(now, interval, until, last_beat, heartbeat) is None)


def test_a_late_arrival_replays_alike_with_its_idle_ticks_passed_at_once(monkeypatch):
    """Before: every tick of an idle gap was a SimPy event (an arrival at 1e9 s replayed for about 40 minutes)."""
    from rlix.sim import simulator

    trace = load_trace(ROOT / "traces" / "two_jobs.json")
    late = trace.replaced(pipelines=[trace.model.pipelines[0], trace.model.pipelines[1].model_copy(update={"arrival_s": 2e4})])
    passed = simulator.replay(late, "rlix")
    monkeypatch.setattr(simulator, "idle_ticks", lambda *args: None)
    ticked = simulator.replay(late, "rlix")
    assert passed == ticked and passed.pipelines["code-b"].finish_s > 2e4
