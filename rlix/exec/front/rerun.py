"""Executor layer: what a rerun continues and what it starts afresh, settled before any actor starts.

A job with ``checkpoint_dir`` resumes after the steps its checkpoints hold:
a full finetune after its newest ``step_<N>``, each adapter of a multi-LoRA
job after its own saved step (an adapter without one starts from the
beginning). The driver says so on stderr, one line per resuming job.

The output directory never mixes two runs, nor does a job's directory
(``<output.dir>/<job>``: ``metrics.jsonl``, TensorBoard events, ``data.json``, ...). A run
through a shared scheduler writes under its job id (``<output.dir>/<id>``, its first job's,
``<output.dir>/<id>/<job>`` for each job), a directory of its own. A private run writes in
``<output.dir>``: the files an earlier run wrote there move to ``previous-<n>/`` (n = 1, 2, ...;
nothing is deleted, and files it did not write stay), so every run writes fresh ones. A resuming
job's fresh ``metrics.jsonl`` starts with the earlier lines of the steps its checkpoint holds (a line's step at
most its stream's resume step); lines of steps it will train again stay only
in ``previous-<n>/`` (through a scheduler: in the earlier run's directory). :class:`~rlix.exec.job.steplog.StepLog` writes the
carried lines into its fresh TensorBoard events when it opens them.
Directories in the job's directory (a checkpoint directory kept there, older
``previous-<n>``) stay where they are.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from rlix.exec.config import ConfigError, JobConfig, RunConfig
from rlix.exec.job.steplog import read_lines


def resume_steps(job: JobConfig) -> dict[str, int]:
    """The step each stream of ``job`` resumes after (the full model as ``""``, an adapter by
    name); streams without a checkpoint are left out, so a job that starts afresh has none."""
    if not job.checkpoint_dir:
        return {}
    if job.kind == "multi_lora":
        from rlix.exec.train.lora import saved_version

        found = {a.name: saved_version(job.checkpoint_dir, a.name) for a in job.adapters}
        return {name: step for name, step in found.items() if step}
    from rlix.exec.train.checkpoint import latest, step_of

    newest = latest(job.checkpoint_dir)
    return {"": step_of(newest)} if newest is not None and step_of(newest) > 0 else {}


def nothing_left(job: JobConfig, resumes: dict[str, int]) -> bool:
    """Every stream of ``job`` has a checkpoint at (or past) its last step: the run trains none of it,
    so the job starts no process and claims no GPU."""
    if job.kind == "multi_lora":
        return bool(job.adapters) and all(resumes.get(a.name, 0) >= a.steps for a in job.adapters)
    return resumes.get("", 0) >= job.steps


def check_resume_shapes(config: RunConfig, models: dict[str, str], resumes: dict[str, dict[str, int]]) -> None:
    """:class:`ConfigError` where a full finetune resumes from a checkpoint whose weights do not fit its
    model (another size in the config since): found before any actor, not by the trainer's load."""
    from rlix.exec.train.checkpoint import latest, shape_clash

    for i, job in enumerate(config.jobs):
        if job.kind == "multi_lora" or "" not in resumes.get(job.name, {}) or job.name not in models:
            continue
        found = latest(job.checkpoint_dir)
        if found is not None and (clash := shape_clash(found, models[job.name])):
            raise ConfigError(
                f"jobs[{i}].checkpoint_dir: job '{job.name}': its checkpoint {found} holds another model than "
                f"jobs[{i}].model ({clash}); give a new checkpoint_dir, or the model it was trained from"
            )


def resume_line(job: JobConfig, resumes: dict[str, int]) -> str:
    """The console's line for a resuming job."""
    left = ": nothing left to train" if nothing_left(job, resumes) else ""
    if job.kind != "multi_lora":
        from rlix.exec.train.checkpoint import latest

        where = latest(job.checkpoint_dir)
        return f"rlix-run: job {job.name} resumes from its checkpoint at step {resumes['']} of {job.steps}{left} ({where})"
    each = ", ".join(
        f"{a.name} at step {resumes[a.name]} of {a.steps}" if a.name in resumes else f"{a.name} from the start"
        for a in job.adapters
    )
    return f"rlix-run: job {job.name} resumes from its checkpoints: {each}{left} ({job.checkpoint_dir})"


# What a run writes in its output directory, and in each job's: only these are set aside (a user's own
# files there, a config or a reward file, stay where they are).
RUN_OUTPUTS = ("metrics.json", "timeline.json", "timeline.png", "trace.json", "rlix-run.log", "error.txt")
JOB_OUTPUTS = ("metrics.jsonl", "data.json", "events.out.tfevents.*", "error.txt", "reward_error.txt", "rewards*.log")


def set_aside(directory: Path, resumes: dict[str, int], outputs: tuple[str, ...] = JOB_OUTPUTS) -> Path | None:
    """Move the files an earlier run left in ``directory`` (those named by ``outputs``) to a new
    ``previous-<n>/`` and start a ``metrics.jsonl`` with the lines of the steps ``resumes`` holds;
    returns where they went (None: nothing was there)."""
    found = {p for pattern in outputs for p in directory.glob(pattern)} if directory.is_dir() else set()
    files = sorted(p for p in found if p.is_file())
    if not files:
        return None
    taken = [p.name.removeprefix("previous-") for p in directory.glob("previous-*")]
    aside = directory / f"previous-{max((int(n) for n in taken if n.isdigit()), default=0) + 1}"
    aside.mkdir()
    for f in files:
        shutil.move(f, aside / f.name)
    carry(aside / "metrics.jsonl", directory, resumes)
    return aside


def carry(earlier: Path, directory: Path, resumes: dict[str, int]) -> None:
    """Start ``directory``'s ``metrics.jsonl`` with the lines of ``earlier`` (an earlier run's) whose steps
    ``resumes`` holds."""
    kept = [line for line in read_lines(earlier) if _held(line, resumes)]
    if kept:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in kept), encoding="utf-8")


def newest_earlier(runs: Path, name: str, this_run: Path) -> Path | None:
    """The ``metrics.jsonl`` job ``name`` wrote in the newest earlier run under ``runs``: a private run's
    (``runs/<name>``) or one through the scheduler (``runs/<id>/<name>``); None if there is none."""
    found = [p for p in (runs / name / "metrics.jsonl", *runs.glob(f"*#*/{name}/metrics.jsonl")) if p.is_file()]
    found = [p for p in found if p.parent.parent != this_run]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, str(p)), default=None)


def _held(line: dict, resumes: dict[str, int]) -> bool:
    """The line's step is one its stream's checkpoint holds (it will not be trained again)."""
    return line["step"] <= resumes.get(line.get("adapter", ""), 0)


def prepare_rerun(
    config: RunConfig, out_dir: str | Path, runs: Path | None = None, resumes: dict[str, dict[str, int]] | None = None
) -> dict[str, dict[str, int]]:
    """Before any actor starts: say which jobs resume from which step, and give the run (its
    ``metrics.json``, timeline, trace and log) and every job's directory under ``out_dir`` fresh
    files, an earlier run's moved to ``previous-<n>/``. ``runs``: the directory holding ``out_dir``
    and earlier runs' (a run through the scheduler, whose directory is its own): a resuming job's
    lines come from its newest run there. ``resumes``: each job's :func:`resume_steps`, where the caller
    has read them already. Returns each job's resume steps."""
    out_dir = Path(out_dir)
    set_aside(out_dir, {}, RUN_OUTPUTS)  # an earlier run's outputs are kept, never overwritten
    out = {}
    for job in config.jobs:
        out[job.name] = steps = resumes[job.name] if resumes is not None else resume_steps(job)
        if steps:
            print(resume_line(job, steps), file=sys.stderr)
        if set_aside(out_dir / job.name, steps) is None and steps and runs is not None:
            if (earlier := newest_earlier(runs, job.name, out_dir)) is not None:
                carry(earlier, out_dir / job.name, steps)
    return out
