"""Executor layer: the jobs a scheduler service knows, one record per job id, apart from the GPUs they hold.

Every submission of a job gets a job id (``name#N``, N counting every job the
service ever saw, its history included; no job name holds a ``#``); the name is a label, unique among jobs not yet ended, and
it is the pipeline id the core plans with while the job lasts. A record
moves through its phases by the transition table ``MOVES``; any other move
raises :class:`IllegalMove`. ``rlix status`` is a projection of the records.

- *submitted*: an ``rlix-run`` claimed the name; its pipeline has not registered;
- *queued*: registered; no GPU granted yet (its model load waits);
- *loading*: granted GPUs; its model loads;
- *running*: its model is loaded (its progress note says so); it runs steps;
- *finished*, *failed*, *cancelled*: ended (kept for ``rlix status`` until
  the service forgets it, a while after it is in the history).

The id counter and the records not ended are kept in Ray's internal
key-value store (as :class:`~rlix.exec.service.roster.Roster` keeps its
pipelines), so a restarted service gives a rejoining job the id it had.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from rlix.exec.service.roster import keep, kept
from rlix.protocol import JobClaim, JobNote, NameTaken, Outcome, Stopped

KV_KEY = "rlix-scheduler/jobs"


class Phase(enum.Enum):
    SUBMITTED = "submitted"
    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({Phase.FINISHED, Phase.FAILED, Phase.CANCELLED})
_END = frozenset(ENDED)
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.SUBMITTED: frozenset({Phase.QUEUED}) | _END,  # registers; or cancelled, its submitter gone
    Phase.QUEUED: frozenset({Phase.LOADING}) | _END,  # granted GPUs; or left before any
    Phase.LOADING: frozenset({Phase.RUNNING}) | _END,
    Phase.RUNNING: _END,
    Phase.FINISHED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}


class IllegalMove(RuntimeError):
    """A job record asked to move where its transition table does not go."""


@dataclass(kw_only=True)
class JobRecord:
    id: str
    name: str
    submitter: str  # the rlix-run that claimed it (host:pid:tag), "" for a pipeline that claimed none
    user: str  # who submitted it: user@host
    priority: int
    steps_total: int
    seq: int  # creation order: the tie-breaker between queued jobs
    config: str = ""  # the config it was submitted from
    log: str = ""  # its run's log, host:path
    phase: Phase = Phase.SUBMITTED
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, when it was entered)
    note: JobNote | None = None
    error: str = ""
    stopped: Stopped | None = None  # cancelled on request: who asked

    def move(self, to: Phase, now: float) -> None:
        if to not in MOVES[self.phase]:
            raise IllegalMove(f"job {self.id}: {self.phase.value} -> {to.value} is not a move a job makes")
        self.phase = to
        self.phases.append((to.value, now))

    @property
    def ended(self) -> bool:
        return self.phase in ENDED

    @property
    def registered(self) -> bool:
        return self.phase is not Phase.SUBMITTED and not self.ended


class JobLedger:
    """Job records by id, the leases of their submitters, and which id each name has now."""

    def __init__(
        self, lease_s: float, *, persist: bool = False, restarted: bool = False, counted: int = 0, now: float = 0.0
    ) -> None:
        """``counted``: jobs an earlier service gave ids (its history's); ids go on above them."""
        self.lease_s = lease_s  # a submitter silent this long is gone (seconds)
        self.persist = persist
        self.records: dict[str, JobRecord] = {}
        self.by_name: dict[str, list[JobRecord]] = {}  # each name's jobs, oldest first (lookups by name stay short)
        self.renewed: dict[str, float] = {}  # submitter -> when it last renewed
        self.count = counted  # jobs ever given an id
        self.forgotten: set[str] = set()  # ids of ended jobs this life forgot (a late renewal never brings one back)
        if persist:  # ids go on counting from the service's earlier lives (its records only after a restart)
            self._load(records=restarted, now=now)

    # ------------------------------------------------------------ lookups

    def active(self, name: str) -> JobRecord | None:
        """The job of this name not yet ended (names are unique among those)."""
        return next((r for r in reversed(self.by_name.get(name, ())) if not r.ended), None)

    def named(self, name: str) -> JobRecord | None:
        """The job of this name not ended, else the latest of that name."""
        named = self.by_name.get(name, ())
        return self.active(name) or (named[-1] if named else None)

    def find(self, job: str) -> JobRecord | None:
        """A job by its name (as :meth:`named`), else by its id."""
        return self.named(job) or self.records.get(job)

    def id_of(self, name: str) -> str:
        """The id a pipeline's GPU-seconds are booked under: its job's (pipelines go by name; the name itself for
        one the ledger lost)."""
        record = self.named(name)
        return record.id if record is not None else name

    def open_jobs(self) -> list[str]:
        """Names of the jobs not ended, in submission order."""
        return [r.name for r in sorted(self.records.values(), key=lambda r: r.seq) if not r.ended]

    def jobs_of(self, submitter: str) -> list[str]:
        return sorted(r.name for r in self.records.values() if r.submitter == submitter and not r.ended)

    # ------------------------------------------------------------ submitters

    def claim(self, submitter: str, user: str, jobs: tuple[JobClaim, ...], registered: set[str], now: float) -> tuple[str, ...]:
        """Claim ``jobs`` for ``submitter``; returns their new ids (:class:`NameTaken`, nothing claimed, if a
        name is in use: by a job not ended, or by a registered pipeline)."""
        for name in (j.name for j in jobs):
            held = self.active(name)
            if held is not None:
                raise NameTaken(f"job '{name}' is already on this cluster ({held.id}, submitted by {held.user}); rename the job")
            if name in registered:
                raise NameTaken(f"job '{name}' is already running on this cluster; rename the job")
        ids = tuple(self._new(j.name, submitter, user, j.priority, j.steps, now, config=j.config, log=j.log).id for j in jobs)
        self.renewed[submitter] = now
        self._save()
        return ids

    def renew_claims(self, submitter: str, user: str, jobs: tuple[JobClaim, ...], now: float) -> None:
        """The submitter is alive, and ``jobs`` (those it has not seen end) are still its own.

        Never refused: a job the ledger does not know (the service restarted and lost it;
        it may have rejoined already) is recorded again, under the id it was given. A claim that
        names its run's log sets it (a run knows where it writes once it has its ids)."""
        for job in jobs:
            record = self.records.get(job.id)
            if record is not None and record.submitter == submitter and job.log and record.log != job.log:
                record.log = job.log  # its run's log is known once the run has its ids (its directory is named by them)
                self._save()
            elif job.id and record is None and job.id not in self.forgotten and self.active(job.name) is None:
                self._new(job.name, submitter, user, job.priority, job.steps, now, job_id=job.id, config=job.config, log=job.log)
        self.renewed[submitter] = now

    def renew(self, submitter: str, now: float) -> tuple[tuple[str, Stopped], ...]:
        """The submitter is alive; returns its jobs cancelled before they registered, and why."""
        self.renewed[submitter] = now
        mine = (r for r in self.records.values() if r.submitter == submitter and r.stopped is not None)
        return tuple((r.name, r.stopped) for r in sorted(mine, key=lambda r: r.seq) if Phase.QUEUED.value not in dict(r.phases))

    def expired(self, now: float) -> list[str]:
        """Submitters whose lease ran out (forgotten here; the caller ends their jobs)."""
        gone = sorted(s for s, t in self.renewed.items() if now - t > self.lease_s)
        for s in gone:
            del self.renewed[s]
        return gone

    def leave(self, submitter: str, now: float) -> None:
        """A submitter is done: its lease ends, and its jobs not ended end cancelled."""
        self.renewed.pop(submitter, None)
        for name in self.jobs_of(submitter):
            self.end(name, Outcome.CANCELLED, "", now)

    # ------------------------------------------------------------ pipelines

    def registering(self, name: str, submitter: str, user: str, priority: int, now: float) -> JobRecord:
        """A pipeline of this name registers for ``submitter`` ("": one that claimed no name); returns its
        record. :class:`NameTaken` if another submitter's job holds the name, or its cancel came first."""
        record = self.active(name)
        if record is not None and record.submitter != submitter:
            raise NameTaken(f"job '{name}' is already on this cluster ({record.id}, submitted by {record.user}); rename the job")
        if record is None:
            mine = [r for r in self.by_name.get(name, ()) if r.submitter == submitter and submitter]
            if mine and mine[-1].stopped is not None and Phase.QUEUED.value not in dict(mine[-1].phases):
                raise NameTaken(f"job '{name}' was cancelled before it started")
            record = self._new(name, submitter, user, priority, 0, now)
        if record.phase is Phase.SUBMITTED:
            record.move(Phase.QUEUED, now)
        self._save()
        return record

    def rejoined(self, name: str, user: str, admitted: bool, now: float) -> None:
        """A pipeline rejoined a restarted service: its record (recovered, or new) is queued, or loading if admitted."""
        record = self.active(name) or self._new(name, "", user, 0, 0, now)
        if record.phase is Phase.SUBMITTED:
            record.move(Phase.QUEUED, now)
        if admitted and record.phase is Phase.QUEUED:
            record.move(Phase.LOADING, now)
        self._save()

    def granted(self, name: str, now: float) -> None:
        """A plan granted the pipeline GPUs: a queued job is loading from now."""
        record = self.active(name)
        if record is not None and record.phase is Phase.QUEUED:
            record.move(Phase.LOADING, now)
            self._save()

    def noted(self, note: JobNote, now: float) -> None:
        """A pipeline's progress note: a loading job whose model is loaded is running."""
        record = self.active(note.pipeline_id)
        if record is None:
            return
        record.note = note
        record.steps_total = note.steps_total
        if note.loaded and record.phase is Phase.LOADING:
            record.move(Phase.RUNNING, now)
            self._save()

    def cancelled(self, name: str, why: Stopped, now: float) -> None:
        """A job not registered yet was cancelled: it never starts (its submitter learns why at its next renewal)."""
        record = self.active(name)
        if record is not None:
            record.stopped = why
            self.end(name, Outcome.CANCELLED, why.line(), now)

    def end(self, name: str, outcome: Outcome, error: str, now: float) -> None:
        """The job of this name ended."""
        record = self.active(name)
        if record is None:
            return
        record.move(Phase(outcome.value), now)
        record.error = error
        self._save()

    # ------------------------------------------------------------ records kept across restarts

    def _new(
        self,
        name: str,
        submitter: str,
        user: str,
        priority: int,
        steps: int,
        now: float,
        job_id: str = "",
        config: str = "",
        log: str = "",
    ) -> JobRecord:
        self.count += 1
        record = JobRecord(
            id=job_id or f"{name}#{self.count}",
            name=name,
            submitter=submitter,
            user=user,
            priority=priority,
            steps_total=steps,
            seq=self.count,
            phases=[(Phase.SUBMITTED.value, now)],
            config=config,
            log=log,
        )
        self._add(record)
        return record

    def forget(self, job_id: str) -> None:
        """Drop an ended job's record (the history keeps it); the id counter never goes back."""
        record = self.records[job_id]
        if not record.ended:
            raise IllegalMove(f"job {job_id} is {record.phase.value}: only an ended job is forgotten")
        del self.records[job_id]
        self.forgotten.add(job_id)
        named = self.by_name[record.name]
        named.remove(record)
        if not named:
            del self.by_name[record.name]

    def _add(self, record: JobRecord) -> None:
        self.records[record.id] = record
        self.by_name.setdefault(record.name, []).append(record)

    def _save(self) -> None:
        if self.persist:
            keep(KV_KEY, {"count": self.count, "jobs": [_plain(r) for r in self.records.values() if not r.ended]})

    def _load(self, *, records: bool, now: float) -> None:
        saved = kept(KV_KEY)
        if not saved:
            return
        self.count = max(self.count, saved["count"])
        for plain in saved["jobs"] if records else ():
            record = JobRecord(**{**plain, "phase": Phase(plain["phase"]), "phases": [tuple(p) for p in plain["phases"]]})
            self._add(record)
            if record.submitter:  # its lease runs from the restart: a submitter gone meanwhile lapses too
                self.renewed.setdefault(record.submitter, now)

    def unjoined(self, registered: set[str], now: float) -> list[str]:
        """After a restart's rejoin window: jobs registered before it whose pipeline did not rejoin end failed;
        returns their names."""
        lost = [r.name for r in self.records.values() if r.registered and r.name not in registered]
        for name in lost:
            self.end(name, Outcome.FAILED, "it did not rejoin the restarted scheduler", now)
        return lost


def job_number(job_id: str) -> int:
    """N of a job id ``name#N`` (0 for an id of another form)."""
    number = job_id.rpartition("#")[2]
    return int(number) if number.isdigit() else 0


def _plain(record: JobRecord) -> dict:
    """A record as JSON (its note and cancel are the running job's to say again)."""
    out = dataclasses.asdict(record)
    out.update(phase=record.phase.value, note=None, stopped=None)
    return out
