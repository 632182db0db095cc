"""Executor layer: which pipelines a scheduler service must hear from again after its restart.

The service writes the ids of its registered pipelines to Ray's internal
key-value store (which lives in the cluster's control store, not in the
actor) every time one joins or leaves. A restarted service reads them back
and plans nothing until every one of them has rejoined with what it holds,
or left, or ``max_wait_s`` has passed: the GPUs of a pipeline not heard from
yet are not known to be free. Outside a Ray actor (a test building the
scheduler in-process) nothing is written and nothing is awaited.
"""

from __future__ import annotations

import json

KV_KEY = "rlix-scheduler/pipelines"
KV_NAMESPACE = "rlix"


class Roster:
    """The registered pipelines, kept where a restarted scheduler finds them."""

    def __init__(self, *, restarted: bool, persist: bool, now: float, max_wait_s: float) -> None:
        self.persist = persist
        self.pipelines: set[str] = set()
        self.expected: set[str] = self._load() if restarted and persist else set()  # still to rejoin
        self.until = now + max_wait_s if restarted else float("-inf")

    def waiting(self, now: float) -> bool:
        """Whether planning waits for pipelines of the scheduler's previous life to rejoin."""
        return bool(self.expected) and now < self.until

    def joined(self, pipeline_id: str) -> None:
        self.expected.discard(pipeline_id)
        self.pipelines.add(pipeline_id)
        self._save()

    def left(self, pipeline_id: str) -> None:
        self.expected.discard(pipeline_id)
        self.pipelines.discard(pipeline_id)
        self._save()

    def _save(self) -> None:
        if self.persist:
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(KV_KEY, json.dumps(sorted(self.pipelines)), namespace=KV_NAMESPACE)

    def _load(self) -> set[str]:
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(KV_KEY, namespace=KV_NAMESPACE)
        return set(json.loads(raw)) if raw else set()
