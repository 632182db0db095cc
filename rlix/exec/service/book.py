"""Executor layer: the jobs a scheduler service knows, apart from the GPUs they hold.

Who submitted each job and when its submitter last renewed its lease, what
each job said of its progress, and how it ended. The core knows only
registered pipelines; a submitter claims its jobs' names first (so two
submitters never run two jobs of one name), and a job that ended stays
listed for ``rlix status``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlix.protocol import JobClaim, JobNote, NameTaken, Stopped

ENDED = ("finished", "failed", "cancelled")


@dataclass(kw_only=True)
class Claim:
    name: str
    submitter: str
    priority: int
    steps_total: int
    seq: int  # claim order: the tie-breaker between queued jobs


class JobBook:
    """Claims with leases, progress notes and endings, by job name (the pipeline id on the cluster)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s  # a submitter silent this long is gone (seconds)
        self.claims: dict[str, Claim] = {}
        self.renewed: dict[str, float] = {}  # submitter -> when it last renewed
        self.notes: dict[str, JobNote] = {}
        self.ended: dict[str, tuple[str, str]] = {}  # name -> (state, error)
        self.cancel_asked: dict[str, Stopped] = {}  # jobs not started whose cancel was asked for, and why
        self._seq = 0

    def claim(self, submitter: str, jobs: tuple[JobClaim, ...], active: set[str], now: float) -> None:
        """Claim ``jobs`` for ``submitter``; :class:`NameTaken` (nothing claimed) if one is in use.

        ``active``: names of pipelines registered now (an unclaimed external pipeline's included).
        """
        for name in (j.name for j in jobs):
            owner = self.claims.get(name)
            theirs = owner is not None and owner.submitter != submitter
            if theirs and (name not in self.ended or name in active):
                raise NameTaken(f"job '{name}' is already on this cluster (submitted by {owner.submitter}); rename the job")
            if owner is None and name in active:
                raise NameTaken(f"job '{name}' is already running on this cluster; rename the job")
        for job in jobs:
            self._take(submitter, job)
            self.ended.pop(job.name, None)  # a new run of the name: nothing of an earlier one carries over
            self.notes.pop(job.name, None)
            self.cancel_asked.pop(job.name, None)
        self.renewed[submitter] = now

    def renew_claims(self, submitter: str, jobs: tuple[JobClaim, ...], now: float) -> None:
        """The submitter is alive, and ``jobs`` (those it has not seen end) are still its own.

        Never refused: a name someone else holds now is left to them, and one the
        book has seen end stays ended. A name the book does not know (the service
        restarted and forgot its claims; the job may have rejoined already) is
        claimed again for the submitter.
        """
        for job in jobs:
            if job.name not in self.claims and job.name not in self.ended:
                self._take(submitter, job)
        self.renewed[submitter] = now

    def _take(self, submitter: str, job: JobClaim) -> None:
        self._seq += 1
        self.claims[job.name] = Claim(
            name=job.name, submitter=submitter, priority=job.priority, steps_total=job.steps, seq=self._seq
        )

    def registering(self, name: str, submitter: str) -> None:
        """A pipeline of this name registers for ``submitter`` ("": one that claimed no name);
        :class:`NameTaken` if another submitter holds the name, or its cancel was asked for."""
        claim = self.claims.get(name)
        if claim is not None and name not in self.ended and claim.submitter != submitter:
            raise NameTaken(f"job '{name}' is already on this cluster (submitted by {claim.submitter}); rename the job")
        if claim is not None and claim.submitter == submitter and name in self.cancel_asked:
            raise NameTaken(f"job '{name}' was cancelled before it started")
        if claim is None or name in self.ended:  # a new run of the name: nothing of an earlier one carries over
            self.claims.pop(name, None)
            self.ended.pop(name, None)
            self.notes.pop(name, None)
            self.cancel_asked.pop(name, None)

    def renew(self, submitter: str, now: float) -> tuple[tuple[str, Stopped], ...]:
        """The submitter is alive; returns its jobs whose cancel was asked for, and why."""
        self.renewed[submitter] = now
        mine = (n for n in self.cancel_asked if self.claims.get(n) and self.claims[n].submitter == submitter)
        return tuple((n, self.cancel_asked[n]) for n in sorted(mine))

    def expired(self, now: float) -> list[str]:
        """Submitters whose lease ran out (forgotten here; the caller unregisters their pipelines)."""
        gone = sorted(s for s, t in self.renewed.items() if now - t > self.lease_s)
        for s in gone:
            del self.renewed[s]
        return gone

    def jobs_of(self, submitter: str) -> list[str]:
        return sorted(n for n, c in self.claims.items() if c.submitter == submitter)

    def end(self, name: str, state: str, error: str = "") -> None:
        if name not in self.ended:
            self.ended[name] = (state if state in ENDED else "failed", error)

    def open_jobs(self) -> list[str]:
        """Claimed jobs that have not ended, in claim order."""
        return [c.name for c in sorted(self.claims.values(), key=lambda c: c.seq) if c.name not in self.ended]
