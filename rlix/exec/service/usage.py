"""Executor layer: what the service's GPUs did since it started, from the ledger's changes.

Per job: GPU-seconds held, borrowed (held outside its home GPUs) and lent
(its home GPUs held by another job, shared equally when homes overlap).
Every GPU-second some job holds is counted once in ``used``, so the jobs'
``used`` add up to the cluster's busy GPU-seconds. The same changes feed a
:class:`rlix.metrics.UsageRecorder`, whose segments draw the cluster's
timeline as the simulator draws a replay.
"""

from __future__ import annotations

import copy

from rlix.metrics import Activity, UsageRecorder

Holder = tuple[str, str, Activity]  # (job, stage or "rollout", activity)


class ClusterUsage:
    def __init__(self, num_gpus: int, start: float = 0.0) -> None:
        self.num_gpus = num_gpus
        self.recorder = UsageRecorder(num_gpus, start=start)
        self.start = start
        self.mark = start  # integrated up to here (s)
        self.held: list[Holder | None] = [None] * num_gpus
        self.homes: dict[str, frozenset[int]] = {}
        self.used: dict[str, float] = {}
        self.lent: dict[str, float] = {}
        self.borrowed: dict[str, float] = {}

    def set_home(self, job: str, gpus) -> None:
        """The job's home GPUs (its partition), from its registration on; ``()`` once it left."""
        self.homes.pop(job, None)
        if gpus:
            self.homes[job] = frozenset(gpus)

    def update(self, now: float, held: list[Holder | None]) -> None:
        """From ``now`` on, GPU ``g`` is held as ``held[g]`` (None: free)."""
        self.integrate(now)
        for g, (old, new) in enumerate(zip(self.held, held)):
            if old != new:
                if new is None:
                    self.recorder.set((g,), now, Activity.FREE)
                else:
                    self.recorder.set((g,), now, new[2], new[0], new[1])
        self.held = list(held)

    def integrate(self, now: float) -> None:
        dt = now - self.mark
        if dt <= 0:
            return
        self.mark = now
        for g, h in enumerate(self.held):
            if h is None:
                continue
            job = h[0]
            self.used[job] = self.used.get(job, 0.0) + dt
            if g not in self.homes.get(job, ()):
                self.borrowed[job] = self.borrowed.get(job, 0.0) + dt
            owners = [j for j, home in self.homes.items() if g in home and j != job]
            for j in owners:
                self.lent[j] = self.lent.get(j, 0.0) + dt / len(owners)

    def busy_gpu_s(self, now: float) -> float:
        self.integrate(now)
        return sum(self.used.values())

    def timeline(self, now: float) -> UsageRecorder:
        """A copy of the recorder closed at ``now`` (the live one keeps going)."""
        rec = copy.deepcopy(self.recorder)
        rec.close(now)
        return rec
