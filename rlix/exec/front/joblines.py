"""Executor layer: one job's line, as the live view and the closing summary both show it.

Both read :func:`job_line`, so a job's last live row and its summary line are
the same values: once a job has ended they come from its result, never from
the progress poll before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlix.exec.records import RewardSpan, reward_spans


@dataclass(frozen=True, kw_only=True)
class JobLine:
    name: str
    state: str  # queued, starting, registering, loading model, waiting for GPUs (...), running, or how it ended
    since_s: float | None  # seconds in that state (None: not shown)
    step: int  # steps trained (a resumed job's: those of its checkpoint included)
    steps: int  # steps it will have trained at its end
    rewards: tuple[RewardSpan, ...]
    gpus_held: int
    requeued: int
    jct_s: float | None = None  # arrival to end, once ended
    error: str = ""
    resumed_at: int = 0  # the step its checkpoint held (0: started afresh)
    workers_lost: int = 0  # rollout workers lost (JobResult.workers_lost), once ended

    def status_text(self) -> str:
        return self.state if self.since_s is None else f"{self.state} {self.since_s:.0f}s"

    def reward_text(self) -> str:
        return reward_text(self.rewards)

    def summary(self) -> str:
        """The closing line: how it ended, steps, reward first -> last (each adapter's own), job time, rollout
        workers lost (if any), error."""
        jct = f" jct_s={self.jct_s:.1f}" if self.jct_s is not None else ""
        jct += f" workers_lost={self.workers_lost}" if self.workers_lost else ""
        error = f" {self.error}" if self.error else ""
        resumed = f" (resumed at step {self.resumed_at})" if self.resumed_at else ""
        return f"{self.name}: {self.state} steps={self.step}/{self.steps}{resumed} reward {self.reward_text()}{jct}{error}"


def reward_text(spans: tuple[RewardSpan, ...]) -> str:
    """``0.256 -> 0.389``; per adapter for multi-LoRA (``copy 0.257 -> 0.156, rev 0.168 -> 0.180``); ``-`` before any step."""
    if not spans:
        return "-"
    return ", ".join(f"{s.stream + ' ' if s.stream else ''}{s.first:.3f} -> {s.last:.3f}" for s in spans)


def default_steps(job) -> int:
    """Steps a job trains from scratch: ``steps``, or for multi-LoRA the sum of its adapters' own."""
    if job.kind == "multi_lora" and job.adapters:
        return sum(a.steps for a in job.adapters)
    return job.steps


def job_line(p, now: float) -> JobLine:
    """The line of a session's pipeline ``p`` at ``now`` (seconds since the run started)."""
    job, prog, res = p.job, p.progress, p.result
    planned = prog.steps if prog is not None and prog.steps else default_steps(job)  # 0 until the model loaded
    if res is not None:
        return JobLine(
            name=p.pipeline_id,
            state=res.status.value,
            since_s=None,
            step=res.steps_before + len(res.steps),
            steps=res.steps_planned or planned,
            resumed_at=res.steps_before,
            rewards=reward_spans(res.steps),
            gpus_held=0,
            requeued=res.requeued,
            jct_s=res.finish_s - res.arrival_s,
            error=res.error,
            workers_lost=res.workers_lost,
        )
    base = dict(name=p.pipeline_id, steps=planned, step=0, rewards=(), gpus_held=0, requeued=0)
    if p.coordinator is None:
        waits = now < job.arrival_s
        return JobLine(**base, state=f"queued until {job.arrival_s:.0f}s" if waits else "queued", since_s=None)
    if prog is None:
        return JobLine(**base, state="starting", since_s=None)
    busy = prog.phase != ""
    phase = f"queued: {p.admission}" if p.admission else prog.phase
    return JobLine(
        **{**base, "step": prog.step, "rewards": prog.rewards, "gpus_held": prog.gpus_held, "requeued": prog.requeued},
        state=phase if busy else prog.status.value,
        since_s=max(0.0, now - prog.phase_since_s) if busy else None,
    )
