"""Executor layer: which pipelines a scheduler service must hear from again after its restart.

The service writes the ids of its registered pipelines, with when each was
admitted, to Ray's internal key-value store (which lives in the cluster's
control store, not in the actor) every time one joins, is admitted or
leaves. A restarted service reads them back
and plans nothing until every one of them has rejoined with what it holds,
or left, or ``max_wait_s`` has passed: the GPUs of a pipeline not heard from
yet are not known to be free. A rejoining pipeline keeps its admission time,
so the order in which jobs sharing a home were admitted survives the restart.
A pipeline the service dropped while it still ran (one it cannot stop, which
keeps its GPUs until it leaves) is kept as dropped, so that after a restart
it rejoins with what it holds and is told again that it was dropped, rather
than running on as a new job. Outside a Ray actor (a test building the
scheduler in-process) nothing is written and nothing is awaited.
"""

from __future__ import annotations

import json

KV_KEY = "rlix-scheduler/pipelines"
KV_DROPPED = "rlix-scheduler/dropped"
KV_NAMESPACE = "rlix"


class Roster:
    """The registered pipelines, kept where a restarted scheduler finds them."""

    def __init__(
        self,
        *,
        restarted: bool,
        persist: bool,
        now: float,
        max_wait_s: float,
        before: dict[str, float | None] | None = None,
        dropped_before: set[str] | None = None,
    ) -> None:
        """``before``: the previous life's pipelines and when each was admitted; ``dropped_before``: those of
        them it had dropped (None: read back where restarted and persisted, else none)."""
        self.persist = persist
        self.pipelines: dict[str, float | None] = {}  # registered pipelines -> when admitted (None: not yet)
        self.dropped: set[str] = set()  # registered pipelines dropped while they still run
        load = restarted and persist
        if before is None:
            before = dict(kept(KV_KEY) or {}) if load else {}
        if dropped_before is None:
            dropped_before = set(kept(KV_DROPPED) or ()) if load else set()
        self.before = before
        self.dropped_before = dropped_before
        self.expected: set[str] = set(self.before)  # still to rejoin
        self.until = now + max_wait_s if restarted else float("-inf")
        self._swept = False  # the jobs that did not rejoin have been ended

    def waiting(self, now: float) -> bool:
        """Whether planning waits for pipelines of the scheduler's previous life to rejoin."""
        return bool(self.expected) and now < self.until

    def restarted_and_done(self, now: float) -> bool:
        """True once, the first time it is asked after a restart's rejoin window closed (every pipeline back, or
        its deadline passed): the moment to end the jobs whose pipeline did not come back."""
        if self.until == float("-inf") or self.waiting(now) or self._swept:
            return False
        self._swept = True
        return True

    def awaits(self, pipeline_id: str, now: float) -> bool:
        """Whether the pipeline is of the previous life and has not rejoined yet, within the rejoin window."""
        return pipeline_id in self.expected and self.waiting(now)

    def admitted_before(self, pipeline_id: str) -> float | None:
        """When the previous life admitted a rejoining pipeline (None: it had not, or it is new)."""
        return self.before.get(pipeline_id)

    def was_dropped(self, pipeline_id: str) -> bool:
        """Whether the previous life had dropped the pipeline while it still ran."""
        return pipeline_id in self.dropped_before

    def drop(self, pipeline_id: str) -> None:
        """The pipeline is dropped but still registered: it keeps what it holds until it leaves."""
        self.dropped.add(pipeline_id)
        self._save()

    def joined(self, pipeline_id: str, admitted_at: float | None = None) -> None:
        self.expected.discard(pipeline_id)
        self.pipelines[pipeline_id] = admitted_at
        self._save()

    def admitted(self, pipeline_id: str, at: float) -> None:
        """A plan gave the pipeline GPUs for the first time at ``at``."""
        if pipeline_id in self.pipelines and self.pipelines[pipeline_id] is None:
            self.pipelines[pipeline_id] = at
            self._save()

    def left(self, pipeline_id: str) -> None:
        self.expected.discard(pipeline_id)
        self.pipelines.pop(pipeline_id, None)
        self.dropped.discard(pipeline_id)
        self._save()

    def _save(self) -> None:
        """Write this life's pipelines, and those of the previous life still expected back (a second
        restart must wait for them too), with which of them are dropped."""
        if not self.persist:
            return
        pipelines = {pid: self.before[pid] for pid in self.expected if pid in self.before} | self.pipelines
        dropped = (self.dropped | (self.dropped_before & self.expected)) & pipelines.keys()
        keep(KV_KEY, pipelines)
        keep(KV_DROPPED, sorted(dropped))


def keep(key: str, value) -> None:
    """Write ``value`` (JSON) under ``key`` in Ray's internal key-value store, where a restarted service reads it."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, json.dumps(value, sort_keys=True), namespace=KV_NAMESPACE)


def kept(key: str):
    """What :func:`keep` wrote under ``key`` (None: nothing)."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None
