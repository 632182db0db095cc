"""Shared layer: which waiting trajectory starts next, by its predicted length (both shells use it).

A rollout's makespan is set by when its longest trajectories start: one that
starts last and runs longest holds the step open. Trajectories carry a prompt
id; the step's trajectories sharing one are its group. A trajectory's length
is predicted from what is known of its prompt, as a log-length (seconds in the
simulator, tokens in the executor):

- its prompt's lengths in earlier steps (an earlier epoch), and
- its group siblings' lengths that finished in this step.

A job's trajectories carry prompt ids in every step, or it orders none.
:class:`LengthPredictor` keeps that evidence and checks it as each group
completes: until the evidence each member had is seen to track the member's
own length (Pearson's r of log-lengths, within each step, over enough pairs),
nothing is ordered by it, so a job whose lengths do not repeat runs as drawn.

:class:`PredictedQueue` is a rollout's waiting trajectories. Those taken off a
worker (or retried) go first, in the order they last started
(:func:`to_front`). Then, while the predictor is
trusted, one probe per group with no evidence (its first sibling, to learn the
group), then the rest of the groups whose probe still runs or was taken off
its worker (a probe still running is a long one), then the informed groups,
predicted-longest first. A group's trajectories go in their drawn order; ties go by the first drawn. While
it is not trusted, everything goes in the drawn order.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Hashable, Iterable

MIN_PAIRS = 500  # evidence-vs-length pairs before the predictor is trusted
MIN_CORRELATION = 0.2  # Pearson's r of log-lengths it must reach (about 3 standard errors of r = 0 at MIN_PAIRS,
# a group's pairs being dependent)


class Group:
    """The trajectories of one step's prompt: those waiting (drawn order), how many run, what finished."""

    __slots__ = (
        "finished",
        "finished_sum",
        "first",
        "key",
        "line",
        "prompt",
        "queued",
        "running",
        "size",
        "step",
        "stream",
        "token",
    )

    def __init__(self, stream: Hashable, step: int, prompt: int, first: int) -> None:
        self.stream = stream
        self.step = step
        self.prompt = prompt
        self.first = first  # the drawn index of its first trajectory: the tie-breaker
        self.queued: deque = deque()  # its waiting trajectories, drawn order
        self.size = 0  # its trajectories
        self.running = 0
        self.finished_sum = 0.0  # log-seconds of its finished trajectories
        self.finished: list[float] = []  # each one's log-seconds
        self.token = 0  # its live heap entry's sequence number (0: none)
        self.key = math.nan  # predicted log-seconds of its trajectories (nan: no evidence)
        self.line: deque | None = None  # the probe or waiting line it stands in, while it has no evidence


class Pearson:
    """Pearson's r of pairs added one at a time, pooled within cohorts (a stream's step).

    Each cohort is centred on its own means, so lengths that differ from one
    step or adapter stream to another (longer answers as training goes on)
    show no correlation that prompts did not make.
    """

    def __init__(self) -> None:
        self.n = 0
        self._means: dict[tuple[int, int], list[float]] = {}  # cohort -> [n, mean x, mean y]
        self._vx = self._vy = self._cov = 0.0  # centred sums of squares and products, every cohort's together

    def add(self, cohort: tuple[int, int], x: float, y: float) -> None:
        """One pair; its cohort's means and the pooled sums move in O(1) (Welford's update), so checking
        r costs the same at the thousandth step as at the first."""
        m = self._means.setdefault(cohort, [0, 0.0, 0.0])
        m[0] += 1
        dx, dy = x - m[1], y - m[2]
        m[1] += dx / m[0]
        m[2] += dy / m[0]
        self._vx += dx * (x - m[1])
        self._vy += dy * (y - m[2])
        self._cov += dx * (y - m[2])
        self.n += 1

    def r(self) -> float:
        """The pooled within-cohort correlation so far (nan: no spread yet)."""
        if self._vx <= 0 or self._vy <= 0:
            return math.nan
        return self._cov / math.sqrt(self._vx * self._vy)


class LengthPredictor:
    """Predicted log-length of a group's trajectories from its prompt's earlier steps and its finished siblings."""

    def __init__(self) -> None:
        self._history: dict[tuple[Hashable, int], list[float]] = {}  # (stream, prompt) -> [sum, n] of earlier log-lengths
        self.check = Pearson()  # the evidence a trajectory had against its own log-length, as its group completes
        self.trusted = False  # the evidence has been seen to track lengths: order by it
        self.dispatched: list[tuple[float, float]] = []  # (prediction at start, actual log-length), predicted ones

    def predict(self, g: Group) -> float:
        """The group's predicted log-length, nan without evidence."""
        h = self._history.get((g.stream, g.prompt))
        total = g.finished_sum + (h[0] if h else 0.0)
        n = len(g.finished) + (h[1] if h else 0)
        return total / n if n else math.nan

    def finished(self, g: Group, seconds: float, predicted_at_start: float) -> None:
        """A trajectory of ``g`` finished at length ``seconds`` (``predicted_at_start``: what it was given, nan: nothing)."""
        own = math.log(max(seconds, 1e-9))
        if predicted_at_start == predicted_at_start:
            self.dispatched.append((predicted_at_start, own))
        g.finished_sum += own
        g.finished.append(own)

    def complete(self, g: Group) -> None:
        """Every trajectory of ``g`` finished: check, for each, what the rest of the evidence said of it.

        Checked only once the group is whole: a sibling that finished first is a
        short one, so evidence read at a finish would track the finishing
        trajectory's length even where lengths do not repeat.
        """
        h = self._history.get((g.stream, g.prompt))
        for own in g.finished:
            n = len(g.finished) - 1 + (h[1] if h else 0)
            if n:
                self.check.add((g.stream, g.step), (g.finished_sum - own + (h[0] if h else 0.0)) / n, own)
        self.trusted = self.check.n >= MIN_PAIRS and self.check.r() >= MIN_CORRELATION

    def close(self, g: Group) -> None:
        """The group is whole: its lengths become its prompt's history, for the prompt's next visit."""
        if g.finished:
            h = self._history.setdefault((g.stream, g.prompt), [0.0, 0])
            h[0] += g.finished_sum
            h[1] += len(g.finished)

    def rank_correlation(self) -> float | None:
        """Spearman's rank correlation of the predictions trajectories started with against their lengths (None: < 2)."""
        return spearman(self.dispatched)


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation of (x, y) pairs, ties at their mean rank (None: fewer than two, or no spread)."""
    if len(pairs) < 2:
        return None
    x, y = zip(*pairs)
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else None


def _ranks(values: tuple[float, ...]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


NOT_STARTED = 1 << 62  # ``served`` of a trajectory that has not started: after every one that has


def to_front(front: deque, t) -> None:
    """Put ``t`` back at the front of ``front``, among the trajectories put back before it, in the order
    they last started (``served``, stamped by the queue that started them): a preemption takes them off
    their workers, not out of the order they were dispatched in, whatever order they come back in."""
    key, i = t.served, 0
    if key == NOT_STARTED:
        raise ValueError(f"trajectory {t.idx} never started: only a started one goes back to the front")
    for other in front:
        if other.served > key:  # a later start, or one that has not started (NOT_STARTED)
            break
        i += 1
    front.insert(i, t)


def _latest_first(trajectories: Iterable) -> list:
    """Trajectories put back together, the one started last first: each then goes in ahead of those put
    back just before it, and :func:`to_front` stops at once (a worker hands them back as they started)."""
    return sorted(trajectories, key=_served, reverse=True)


def _served(t) -> int:
    return t.served


class DrawnQueue(deque):
    """Waiting trajectories in their drawn order, and those put back at the front (:func:`to_front`).
    Each trajectory it starts is stamped with the order it last started in (``served``)."""

    def __init__(self) -> None:
        super().__init__()
        self._starts = itertools.count(1)

    def popleft(self):
        t = super().popleft()
        t.served = next(self._starts)
        return t

    def put_back(self, trajectories: Iterable) -> None:
        for t in _latest_first(trajectories):
            to_front(self, t)


class PredictedQueue:
    """A rollout's waiting trajectories, served predicted-longest first once the predictor is trusted.

    Each trajectory has ``group`` (its :class:`Group`), ``idx`` (unique, in
    drawn order), and ``predicted``, ``served`` (the order it last started
    in, :data:`NOT_STARTED` before) and ``queued``, set here.
    It reads as the deque it stands in for: ``q[0]``, ``popleft`` and
    ``extend`` (a new batch, drawn order); ``put_back`` puts started ones back.
    """

    def __init__(self, predictor: LengthPredictor, *, ordered: bool = True) -> None:
        self.predictor = predictor
        self.ordered = ordered  # False: as drawn even once trusted (the predictor still learns and is scored)
        self._front: deque = deque()  # started ones put back (preempted or retried), first to go, as they last started
        self._drawn: deque = deque()  # every waiting one in drawn order (served ones skipped lazily)
        self._probe: deque[Group] = deque()  # groups with no evidence and none running
        self._waiting: deque[Group] = deque()  # groups with no evidence and some running (a probe)
        self._heap: list[tuple[float, int, int, Group]] = []  # (-key, first, token, group)
        self._filing = False  # groups go into the heap and lines: only while it orders (ordered and trusted)
        self._n = 0
        self._seq = 0
        self._starts = itertools.count(1)  # each start's ``served``
        self._head = None  # the trajectory q[0] showed: popleft serves it

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def extend(self, trajectories: Iterable) -> None:
        groups: dict[int, Group] = {}
        for t in trajectories:
            t.queued = True
            self._drawn.append(t)
            t.group.queued.append(t)
            t.group.size += 1
            groups.setdefault(id(t.group), t.group)
            self._n += 1
        self._head = None
        for g in groups.values():
            self._place(g)

    def discard(self, trajectories: Iterable) -> None:
        """Take these waiting trajectories out (their batch will never be trained)."""
        for t in trajectories:
            if not t.queued:
                continue
            t.queued = False
            self._n -= 1
            g = t.group
            if any(x is t for x in g.queued):
                g.queued = deque(x for x in g.queued if x is not t)
            else:
                self._front = deque(x for x in self._front if x is not t)
        self._head = None

    def put_back(self, trajectories: Iterable) -> None:
        """Started trajectories wait again, ahead of every other, as they last started (:func:`to_front`)."""
        for t in _latest_first(trajectories):
            t.queued = True
            t.group.running -= 1
            to_front(self._front, t)
            self._n += 1
        self._head = None

    def __getitem__(self, i: int):
        if i != 0 or not self._n:
            raise IndexError(i)
        if self._head is None:
            self._head = self._next()
        return self._head

    def popleft(self):
        t = self[0]
        self._head = None
        t.queued = False
        self._n -= 1
        drawn = self._drawn
        while drawn and not drawn[0].queued:  # served ahead of their drawn turn: let them go
            drawn.popleft()
        g = t.group
        if self._front and self._front[0] is t:
            self._front.popleft()
        else:
            g.queued.remove(t) if g.queued[0] is not t else g.queued.popleft()
        g.running += 1
        t.predicted = g.key
        t.served = next(self._starts)
        return t

    def finished(self, t, seconds: float) -> None:
        """``t`` (served from here) finished after ``seconds``: its group learns, and may move up or down."""
        g = t.group
        g.running -= 1
        self.predictor.finished(g, seconds, t.predicted)
        self._head = None
        if g.queued:
            self._place(g)
        elif len(g.finished) == g.size:  # whole: score its evidence, then keep its lengths for its prompt's next visit
            self.predictor.complete(g)
            self.predictor.close(g)

    # ------------------------------------------------------------ order

    def _place(self, g: Group) -> None:
        """Predict ``g`` (each trajectory starts with its prediction, to be scored) and, while the queue
        orders, file it by that evidence: in the heap by prediction, else (once) in the probe line. A
        queue serving the drawn order files nothing, so its heap and lines do not grow with the job."""
        g.key = self.predictor.predict(g)
        if self._filing:
            self._file(g)

    def _file(self, g: Group) -> None:
        if g.key == g.key:
            self._seq += 1
            g.token = self._seq
            heapq.heappush(self._heap, (-g.key, g.first, self._seq, g))
        elif g.line is None:
            g.line = self._probe
            self._probe.append(g)

    def _refile(self) -> None:
        """The predictor is trusted now: file every group with a trajectory waiting, by its last prediction,
        in drawn order (as if each had been filed when it was last predicted)."""
        self._filing = True
        groups = {id(t.group): t.group for t in self._drawn if t.queued}
        for g in sorted(groups.values(), key=lambda g: g.first):
            self._file(g)

    def _next(self):
        if self._front:
            return self._front[0]
        ordering = self.ordered and self.predictor.trusted
        if ordering and not self._filing:
            self._refile()
        elif self._filing and not ordering:
            self._heap.clear()  # trust lost: refiled if it comes back
        self._filing = ordering
        if not ordering:
            drawn = self._drawn
            while not drawn[0].queued:
                drawn.popleft()
            return drawn[0]
        probe, waiting = self._probe, self._waiting
        while probe and (probe[0].running or not probe[0].queued or probe[0].key == probe[0].key):
            g = probe.popleft()  # probed (it waits for its probe now), emptied, or learnt since
            g.line = None
            if g.queued and g.key != g.key:
                g.line = waiting
                waiting.append(g)
        if probe:
            return probe[0].queued[0]
        while waiting and (not waiting[0].queued or waiting[0].key == waiting[0].key):
            waiting.popleft().line = None  # emptied, or its probe finished: in the heap now
        if waiting:
            return waiting[0].queued[0]
        heap = self._heap
        while heap[0][2] != heap[0][3].token or not heap[0][3].queued:
            heapq.heappop(heap)
        return heap[0][3].queued[0]
