"""GPU-seconds used, lent and borrowed per job (rlix.lending), in the book and in replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlix.lending import HomeBook
from rlix.sim.simulator import replay
from rlix.trace import load_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"


def test_a_job_borrows_what_another_lends_while_it_is_there():
    book = HomeBook(4)
    book.set_home(0.0, "a", (0, 1))
    book.set_home(0.0, "b", (2, 3))
    for g in range(4):
        book.hold(g, 0.0, "a")  # a on every GPU, b's home included
    book.hold(3, 5.0, "")  # GPU 3 free from 5 s
    book.set_home(8.0, "b", ())  # b leaves: a's use of GPU 2 from then on is lent by nobody
    book.settle(10.0)
    assert book.used == pytest.approx({"a": 35.0})
    assert book.borrowed == pytest.approx({"a": 15.0})
    assert book.lent == pytest.approx({"b": 13.0})


def test_a_gpu_in_two_homes_is_lent_by_both_and_a_job_at_home_borrows_nothing():
    book = HomeBook(2)
    book.set_home(0.0, "a", (0, 1))
    book.set_home(0.0, "b", (0, 1))
    book.set_home(0.0, "c", (1,))
    book.hold(0, 0.0, "c")
    book.hold(1, 0.0, "a")
    book.settle(4.0)
    assert book.borrowed == pytest.approx({"c": 4.0})  # GPU 0 is not in c's home
    assert book.lent == pytest.approx({"a": 2.0, "b": 2.0 + 2.0, "c": 2.0})  # GPU 1: a at home, b and c lent it
    assert book.fair == pytest.approx({"a": 2.0 + 4 / 3, "b": 2.0 + 4 / 3, "c": 4 / 3})  # each GPU split between its homes


def test_a_fair_share_counts_free_gpus_too_while_the_job_is_there():
    book = HomeBook(2)
    book.set_home(0.0, "a", (0, 1))
    book.hold(0, 0.0, "a")
    book.set_home(4.0, "b", (0, 1))  # co-tenants from 4 s
    book.set_home(6.0, "a", ())  # a leaves (its worker is still counted: the book only integrates)
    book.settle(10.0)
    assert book.fair == pytest.approx({"a": 8.0 + 2.0, "b": 2.0 + 8.0})
    assert book.used == pytest.approx({"a": 10.0})


def test_replays_account_every_held_gpu_second_and_static_never_lends():
    trace = load_trace(TRACES / "two_jobs.json")
    for policy in ("static", "rlix"):
        m = replay(trace, policy)
        held = (1 - m.idle_fraction) * m.gpus * m.makespan_s
        assert sum(p.gpu_seconds_used for p in m.pipelines.values()) == pytest.approx(held, rel=1e-9)
        lent = sum(p.gpu_seconds_lent for p in m.pipelines.values())
        borrowed = sum(p.gpu_seconds_borrowed for p in m.pipelines.values())
        if policy == "static":
            assert lent == borrowed == 0.0
        else:  # rollout spreads over the other's home; lending happens only while the lender is there
            assert 0 < lent <= borrowed
            assert all(p.gpu_seconds_borrowed > 0 for p in m.pipelines.values())
