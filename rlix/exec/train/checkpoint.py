"""Executor layer: full-finetune checkpoints (torch), independent of Ray.

``save(learner, dir)`` writes ``dir/step_<N>/``: a loadable HF checkpoint
(``save_pretrained`` plus the tokenizer files of the model it started from)
and ``trainer_state.pt`` (optimizer state and N, the steps trained). It is
written under a temporary name and renamed, so a crash never leaves a
half-written checkpoint; the newest :data:`KEEP` are kept. ``restore``
loads the newest into a fresh learner and returns N, the step a rerun
continues from. The frozen reference model is not saved: it is the starting
checkpoint, which a rerun loads again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

KEEP = 2  # checkpoints kept per job (the newest)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def _steps(directory: Path) -> list[Path]:
    done = [p for p in directory.glob("step_*") if (p / "trainer_state.pt").is_file()]
    return sorted(done, key=lambda p: (int(p.name.removeprefix("step_")), p.name))


def latest(directory: str | Path) -> Path | None:
    found = _steps(Path(directory)) if Path(directory).is_dir() else []
    return found[-1] if found else None


def step_of(found: Path) -> int:
    """The steps trained by the checkpoint ``found`` (a ``step_<N>`` directory): N."""
    return int(found.name.removeprefix("step_"))


def save(learner, directory: str | Path, source_model: str | Path | None = None) -> Path:
    """Checkpoint ``learner`` (a :class:`rlix.exec.train.grpo.GrpoLearner`) at its version; returns the directory."""
    import torch

    directory = Path(directory)
    final = directory / f"step_{learner.version:06d}"
    tmp = directory / f".tmp_step_{learner.version:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    learner.model.save_pretrained(str(tmp))
    for name in TOKENIZER_FILES if source_model else ():
        src = Path(source_model) / name
        if src.is_file():
            shutil.copy2(src, tmp / name)
    torch.save({"version": learner.version, "opt": learner.opt.state_dict()}, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    for old in _steps(directory)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def restore(learner, directory: str | Path) -> int:
    """Load the newest checkpoint under ``directory`` into ``learner``; returns its step (0 if none)."""
    import torch

    from rlix.exec.data.model import load_model

    found = latest(directory)
    if found is None:
        return 0
    weights = load_model(found, "cpu").state_dict()
    learner.model.load_state_dict(weights)
    state = torch.load(found / "trainer_state.pt", map_location=learner.device, weights_only=False)
    learner.opt.load_state_dict(state["opt"])
    learner.version = int(state["version"])
    return learner.version
