"""Shared layer: each job's GPU-seconds used, lent and borrowed, against its home partition.

A job's home is the partition it would have to itself under ``static``
(``PipelineSpec.home_gpus``), from its arrival until it leaves. Per job:

- ``used``: GPU-seconds it held (any activity: work, switching, held idle);
- ``borrowed``: the part of ``used`` on GPUs outside its home;
- ``lent``: GPU-seconds other jobs held of its home GPUs while it was there
  (shared equally between the owners of a GPU that lies in several homes).

- ``fair``: its fair share: each GPU-second, held or not, split equally between
  the jobs whose homes hold that GPU (co-tenants time-share their GPUs, so each
  is owed an equal part of them while it is there).

Every held GPU-second is counted once in ``used``. Where homes partition the
cluster, the jobs' ``borrowed`` add up to their ``lent``, less what was held of
the homes of jobs not there (not yet arrived, or gone): nobody lent that. The simulator, the
executor's outputs and the scheduler service all keep this one book.
"""

from __future__ import annotations

from collections.abc import Iterable


class HomeBook:
    """Integrates who holds each GPU against whose home it lies in."""

    def __init__(self, num_gpus: int, start: float = 0.0) -> None:
        self._holder = [""] * num_gpus  # "" = nobody
        self._since = [start] * num_gpus  # accounted up to here (s)
        self._owners: list[tuple[str, ...]] = [()] * num_gpus  # jobs whose home holds the GPU, sorted
        self._homes: dict[str, frozenset[int]] = {}
        self.used: dict[str, float] = {}
        self.lent: dict[str, float] = {}
        self.borrowed: dict[str, float] = {}
        self.fair: dict[str, float] = {}

    def set_home(self, now: float, pipeline_id: str, gpus: Iterable[int]) -> None:
        """From ``now`` on, ``pipeline_id``'s home is ``gpus`` (empty: it left)."""
        old = self._homes.pop(pipeline_id, frozenset())
        new = frozenset(gpus)
        if new:
            self._homes[pipeline_id] = new
        for g in sorted(old | new):
            self._flush(g, now)
            self._owners[g] = tuple(sorted(p for p, home in self._homes.items() if g in home))

    def has_home(self, pipeline_id: str) -> bool:
        return pipeline_id in self._homes

    def hold(self, gpu: int, now: float, pipeline_id: str) -> None:
        """From ``now`` on, ``pipeline_id`` holds ``gpu`` ("" : nobody)."""
        if pipeline_id != self._holder[gpu]:
            self._flush(gpu, now)
            self._holder[gpu] = pipeline_id

    def settle(self, now: float) -> None:
        """Account every GPU up to ``now`` (for a reading while holdings go on)."""
        for g in range(len(self._holder)):
            self._flush(g, now)

    def _flush(self, g: int, now: float) -> None:
        dt = now - self._since[g]
        if dt <= 0:
            return
        self._since[g] = now
        owners = self._owners[g]
        for o in owners:
            self.fair[o] = self.fair.get(o, 0.0) + dt / len(owners)
        pid = self._holder[g]
        if not pid:
            return
        self.used[pid] = self.used.get(pid, 0.0) + dt
        if pid not in owners:
            self.borrowed[pid] = self.borrowed.get(pid, 0.0) + dt
        others = [o for o in owners if o != pid]
        for o in others:
            self.lent[o] = self.lent.get(o, 0.0) + dt / len(others)
