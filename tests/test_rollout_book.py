"""The rollout book: the one owner of a job's trajectories, driven by both shells (rlix/rollout_book.py)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import spec

from rlix.lengths import NOT_STARTED, LengthPredictor, PredictedQueue
from rlix.rollout_book import RolloutBook, TrajectoryFailed
from rlix.sim.simulator import Simulation
from rlix.step import StepMachine, StreamSpec, job_plan
from rlix.trace import Trace, TraceModel, load_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"


class Entry:
    """A shell's trajectory, as the book sees it."""

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.group = None
        self.tally = None
        self.predicted = math.nan
        self.served = NOT_STARTED
        self.queued = False

    def __repr__(self) -> str:
        return f"E{self.idx}"


def _batch(book: RolloutBook, n: int, prompts=None) -> list[Entry]:
    entries = [Entry(book.made + i) for i in range(n)]
    book.add(entries, prompts)
    return entries


def _start(book: RolloutBook, n: int) -> list[Entry]:
    return [book.queue.popleft() for _ in range(n)]


@pytest.mark.parametrize("grouped", [False, True])
def test_taken_off_trajectories_wait_at_the_front_as_they_last_started_whatever_order_they_come_back_in(grouped):
    book = RolloutBook(LengthPredictor() if grouped else None)
    prompts = [(0, 0, i // 2) for i in range(6)] if grouped else None
    a = _batch(book, 6, prompts)
    running = _start(book, 4)
    assert running == a[:4] and len(book) == 2
    book.preempted(3)
    book.put_back([a[3], a[1]])  # as the executor's aborts come back: in any order
    assert book.queue[0] is a[1] and (book.requeued, book.orphaned, book.preemptions) == (2, 0, 1)
    book.put_back([a[2]], lost=True)  # its worker process died: between the two, where it started
    assert _start(book, 1) == [a[1]]
    book.put_back([a[1], a[0]])  # a[1] again: it started again after a[2] and a[3]
    assert _start(book, 6) == [a[0], a[2], a[3], a[1], a[4], a[5]]
    assert (book.requeued, book.orphaned) == (5, 1)
    book.preempted(0)  # a shrink of an idle worker is no preemption
    assert book.preemptions == 1


def test_a_batch_is_rolled_out_by_its_last_finish_with_the_oldest_weights_under_it():
    book = RolloutBook()
    first, second = _batch(book, 2), _batch(book, 1)
    _start(book, 3)
    assert first[0].tally is first[1].tally and first[0].tally is not second[0].tally
    assert book.finished(first[1], 3.0, version=4) is False
    assert book.finished(second[0], 1.0, version=5) is True  # a batch of one: rolled out at once
    assert book.finished(first[0], 2.0, version=2) is True
    assert first[0].tally.oldest == 2 and second[0].tally.oldest == 5
    assert book.completed == 3


def test_an_application_error_is_retried_from_the_front_then_fails_with_its_name():
    book = RolloutBook(max_tries=2)
    a = _batch(book, 2)
    (e,) = _start(book, 1)
    book.failed(e, "EngineRefused: no", "trajectory 0 (step 0)")
    assert book.queue[0] is e and len(book) == 2
    _start(book, 1)
    with pytest.raises(TrajectoryFailed, match=r"^trajectory 0 \(step 0\) failed 2 times: EngineRefused: no$"):
        book.failed(e, "EngineRefused: no", "trajectory 0 (step 0)")
    assert list(book.queue) == [a[1]]
    with pytest.raises(ValueError, match="max_tries"):
        RolloutBook(max_tries=0)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_dropped_batch_leaves_the_queue_and_none_of_it_comes_back(grouped):
    book = RolloutBook(LengthPredictor() if grouped else None)
    prompts = (lambda step: [(0, step, i) for i in range(3)]) if grouped else (lambda step: None)
    old, new = _batch(book, 3, prompts(0)), _batch(book, 3, prompts(1))
    running = _start(book, 2)
    book.drop(old)
    assert len(book) == 3 and book.queue[0] is new[0]
    book.put_back([running[0]])
    book.failed(running[1], "EngineRefused: no", "trajectory 1 (step 0)")
    assert len(book) == 3 and book.requeued == 0
    assert _start(book, 3) == new
    assert book.finished(new[0], 1.0, 0) is False and book.completed == 1


def test_a_book_that_orders_by_predicted_length_needs_each_trajectory_s_prompt():
    book = RolloutBook(LengthPredictor())
    with pytest.raises(ValueError, match="prompt"):
        _batch(book, 2)
    a = _batch(book, 4, [("s", 3, 7), ("s", 3, 7), ("s", 3, 8), ("s", 3, 7)])
    assert a[0].group is a[1].group is a[3].group and a[2].group is not a[0].group
    assert (a[0].group.stream, a[0].group.step, a[0].group.prompt, a[0].group.first) == ("s", 3, 7, 0)
    assert a[2].group.first == 2 and book.made == 4


@pytest.mark.parametrize(
    "prompts, dispatch, tries, placement",
    [(False, "predicted", 1, "lowest_gpu"), (True, "predicted", 3, "longest_held"), (True, "drawn", 2, "lowest_gpu")],
)
def test_the_step_machine_holds_the_book_its_plan_calls_for(prompts, dispatch, tries, placement):
    job = SimpleNamespace(staleness=0, rollout_mode="batch", dispatch=dispatch, placement=placement)
    plan = job_plan(
        job, [StreamSpec(name="", steps=2)], stages=lambda i, k: (), size=lambda i, k: 4, prompts=prompts, tries=tries
    )
    book = StepMachine(spec("p", (0,), (0, 1)), plan).book
    assert (book.predictor is not None, book.max_tries, book.longest_held) == (prompts, tries, placement == "longest_held")
    assert isinstance(book.queue, PredictedQueue) == prompts and (not prompts or book.queue.ordered == (dispatch == "predicted"))


def test_a_simulated_shrink_puts_its_trajectories_back_as_they_last_started():
    sim = Simulation(load_trace(TRACES / "two_jobs.json"), "rlix")
    sim.env.run(until=200.0)  # mid rollout: code-b's workers full
    engine = max(sim.pipelines.values(), key=lambda p: p.engine.running).engine
    g, w = max(engine.workers.items(), key=lambda gw: (len(gw[1].active), -gw[0]))
    running = list(w.active.values())
    assert len(running) > 2
    ahead = len(engine.book)
    assert engine.remove_worker(w.worker) == len(running) and len(engine.book) == ahead + len(running)
    back = [engine.book.queue.popleft() for _ in running]
    assert [t.idx for t in back] == [t.idx for t in sorted(running, key=lambda t: t.served)]
    back[0].served = NOT_STARTED  # as if it had never been started: it has no place at the front
    with pytest.raises(ValueError, match="never started"):
        engine.book.put_back(back[:1])


def test_the_simulator_s_engines_drive_their_machines_books():
    sim = Simulation(load_trace(TRACES / "two_jobs.json"), "rlix")
    sim.run()
    for p in sim.pipelines.values():
        assert p.engine.book is p.machine.book and p.machine.book.completed == p.tally.trajectories > 0


def test_free_slots_fill_lowest_gpu_first_or_held_longest_first_where_the_queue_fills_them_all():
    free = [(4, 1, 2), (0, 3, 1), (2, 2, 2)]  # (first GPU, grant, free slots): GPU 4 held longest, GPU 0 newest
    default = RolloutBook()
    _batch(default, 5)
    assert default.fill_order(free) == [0, 2, 4]  # whatever the tenure
    held = RolloutBook(longest_held=True)
    _batch(held, 4)
    assert held.fill_order(free) == [0, 2, 4]  # 4 waiting for 5 slots: some worker stays emptier, so as by default
    _batch(held, 1)
    assert held.fill_order(free) == [4, 2, 0]  # 5 for 5: the same count on each, the front on the one held longest
    assert held.fill_order([(6, 2, 1), (2, 2, 1)]) == [2, 6]  # a tie in tenure: lowest GPU first


def test_a_simulated_job_placed_longest_held_starts_the_front_of_its_queue_on_the_worker_held_longest():
    """two_jobs under rlix with both jobs placed longest_held: wherever a job's queue fills every free slot
    (at each batch's start), the trajectory at its front starts on the free worker it has held longest; a
    worker still loading or syncing is no free worker; every worker the plan gives is stamped in turn."""
    trace = load_trace(TRACES / "two_jobs.json")
    raw = trace.model.model_dump(exclude_none=True)
    for p in raw["pipelines"]:
        p["placement"] = "longest_held"
    sim = Simulation(Trace(TraceModel.model_validate(raw), trace.source), "rlix")
    checked, moved, loading_left_out, seen_grants = 0, 0, 0, []
    for engine in (p.engine for p in sim.pipelines.values()):
        assert engine.book.longest_held
        fill_order, fill = engine.book.fill_order, engine._fill
        seen = []

        def watched(free, fill_order=fill_order, seen=seen, engine=engine):
            nonlocal loading_left_out
            now = seen.pop()
            assert all(engine.workers[g].ready_at <= now for g, *_ in free)
            loading_left_out += any(w.ready_at > now for w in engine.workers.values())
            order = fill_order(free)
            seen.append((order, sum(n for *_, n in free) <= len(engine.book)))
            return order

        def filled(now, touched, fill=fill, seen=seen, engine=engine):
            nonlocal checked, moved
            seen[:] = [now]
            front = engine.book.queue[0] if engine.book.queue else None
            before = {g: len(w.active) for g, w in engine.workers.items()}
            fill(now, touched)
            if not isinstance(seen[0], tuple) or not seen[0][1] or len(seen[0][0]) < 2:
                return  # the book was not asked, or its order fell back to lowest GPU first
            order = seen[0][0]
            if len(engine.workers[order[0]].active) > before[order[0]]:  # not held back by the weight gate
                held = {g: engine.workers[g].grant_seq for g in order}
                assert order[0] == min(order, key=lambda g: (held[g], g)) and front.worker is engine.workers[order[0]]
                checked += 1
                moved += order != sorted(order)

        grants = []
        seen_grants.append((engine, grants))

        def added(worker, *args, add=engine.add_worker, engine=engine, grants=grants):
            add(worker, *args)
            grants.append(worker.gpus[0])
            assert engine.workers[worker.gpus[0]].grant_seq == len(grants)  # stamped in the order the plan gave them

        engine.book.fill_order, engine._fill, engine.add_worker = watched, filled, added
    sim.run()
    assert checked and moved, (checked, moved)  # placement chose, and chose other than lowest GPU first
    assert loading_left_out  # some fill had a worker still loading, and left it out
    for engine, grants in seen_grants:  # every worker the plan gave was stamped (some GPUs granted again)
        assert engine._grants == len(grants) > len(set(grants))
