"""Executor layer: what the service's GPUs did since it started, from the ledger's changes.

Per job: GPU-seconds held, borrowed and lent, and its fair share, in the book every shell keeps
(:class:`rlix.lending.HomeBook`, inside the recorder). Every GPU-second some
job holds is counted once in ``used``, so the jobs' ``used`` add up to the
cluster's busy GPU-seconds. The same changes draw the cluster's timeline as
the simulator draws a replay.
"""

from __future__ import annotations

import copy

from rlix.metrics import Activity, UsageRecorder

Holder = tuple[str, str, Activity]  # (job, stage or "rollout", activity)


KINDS = ("used", "lent", "borrowed", "fair")


class ClusterUsage:
    """``totals``: each kind's GPU-seconds per job a restarted service kept (:meth:`totals`); they go on from there."""

    def __init__(self, num_gpus: int, start: float = 0.0, totals: dict[str, dict[str, float]] | None = None) -> None:
        self.num_gpus = num_gpus
        self.recorder = UsageRecorder(num_gpus, start=start)
        self.start = start
        self.held: list[Holder | None] = [None] * num_gpus
        book = self.recorder.homes
        self.used, self.lent, self.borrowed, self.fair = book.used, book.lent, book.borrowed, book.fair
        self.forgotten_s = 0.0  # GPU-seconds of the ended jobs forgotten (their figures are in the history)
        self.forgotten_jobs = 0
        for kind, per_job in (totals or {}).items():
            if kind == "forgotten":
                self.forgotten_s, self.forgotten_jobs = per_job["gpu_s"], int(per_job["jobs"])
            else:
                getattr(self, kind).update(per_job)

    def totals(self, now: float) -> dict[str, dict[str, float]]:
        """Each kind's GPU-seconds per job, up to ``now`` (what a restarted service starts from)."""
        self.integrate(now)
        forgotten = {"gpu_s": self.forgotten_s, "jobs": self.forgotten_jobs}
        return {kind: dict(getattr(self, kind)) for kind in KINDS} | {"forgotten": forgotten}

    def has_home(self, job: str) -> bool:
        return self.recorder.homes.has_home(job)

    def forget(self, job: str) -> None:
        """Drop an ended job's figures (it holds nothing and has no home); its GPU-seconds stay in the busy total."""
        self.forgotten_s += self.used.pop(job, 0.0)
        self.forgotten_jobs += 1
        for kind in KINDS[1:]:
            getattr(self, kind).pop(job, None)

    def set_home(self, now: float, job: str, gpus) -> None:
        """The job's home GPUs (its partition) from ``now`` on; ``()`` once it left."""
        self.recorder.homes.set_home(now, job, gpus)

    def update(self, now: float, held: list[Holder | None]) -> None:
        """From ``now`` on, GPU ``g`` is held as ``held[g]`` (None: free)."""
        for g, (old, new) in enumerate(zip(self.held, held)):
            if old != new:
                if new is None:
                    self.recorder.set((g,), now, Activity.FREE)
                else:
                    self.recorder.set((g,), now, new[2], new[0], new[1])
        self.held = list(held)

    def integrate(self, now: float) -> None:
        """Account every held GPU-second up to ``now``."""
        self.recorder.homes.settle(now)

    def busy_gpu_s(self, now: float) -> float:
        self.integrate(now)
        return sum(self.used.values()) + self.forgotten_s

    def timeline(self, now: float) -> UsageRecorder:
        """A copy of the recorder closed at ``now`` (the live one keeps going)."""
        rec = copy.deepcopy(self.recorder)
        rec.close(now)
        return rec
