"""Executor layer: full-finetune checkpoints (torch), independent of Ray.

``save(learner, dir)`` writes ``dir/step_<N>/``: the trainer's state as a
sharded ``torch.distributed.checkpoint`` (DCP) under ``dcp/`` (each rank
writes its own shards of the weights and optimizer state, so no process ever
holds the whole optimizer), a loadable HF checkpoint (``save_pretrained`` of
the whole weights by rank 0, plus the tokenizer files of the model it
started from) and ``trainer_state.pt`` (N, the steps trained), written last.
It is written under a temporary name and renamed, so a crash never leaves a
half-written checkpoint; the newest :data:`KEEP` are kept. ``restore`` loads
the newest into a fresh learner on any number of ranks (DCP reshards what N
ranks wrote for M) and returns N, the step a rerun continues from. A
checkpoint of several ranks lies on a file system every rank reads and
writes (one machine, or a shared one). The frozen reference model is not
saved: it is the starting checkpoint, which a rerun loads again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

KEEP = 2  # checkpoints kept per job (the newest)
DCP_DIR = "dcp"  # the sharded trainer state inside a checkpoint
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
    """Checkpoint ``learner`` (a :class:`rlix.exec.train.grpo.GrpoLearner`) at its version; returns the directory.

    Every rank calls it (the shards are written and the whole weights gathered together)."""
    import torch
    import torch.distributed.checkpoint as dcp

    directory, ranks = Path(directory), learner.ranks
    lead = ranks.rank == 0
    final = directory / f"step_{learner.version:06d}"
    tmp = directory / f".tmp_step_{learner.version:06d}"
    if lead:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ranks.barrier()  # the directory exists (and holds nothing stale) before any rank writes
    dcp.save(_trainer_state(learner), checkpoint_id=str(tmp / DCP_DIR), no_dist=ranks.world == 1)
    _save_hf(learner, tmp, source_model)
    if lead:
        torch.save({"version": learner.version}, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.replace(final)
        for old in _steps(directory)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    ranks.barrier()  # no rank returns (and, say, saves again) before the checkpoint is in place
    return final


def _trainer_state(learner) -> dict:
    """The learner's weights and optimizer state as DCP saves and loads them: each rank's shards,
    keyed by parameter name (so any number of ranks reads them back)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(learner.model, learner.opt)
    return {"model": model, "optim": optim}


def _save_hf(learner, tmp: Path, source_model: str | Path | None) -> None:
    """The whole weights as an HF checkpoint (gathered: a collective), written by rank 0 with the tokenizer."""
    whole = learner.snapshot().tensors if learner.ranks.world > 1 else None  # one rank: its own state dict
    if learner.ranks.rank != 0:
        return
    learner.model.save_pretrained(str(tmp), state_dict=whole)
    for name in TOKENIZER_FILES if source_model else ():
        src = Path(source_model) / name
        if src.is_file():
            shutil.copy2(src, tmp / name)


def shape_clash(found: Path, model_dir: str | Path) -> str:
    """Why the weights the checkpoint ``found`` holds (its DCP metadata: no tensor read) cannot load into
    the model of ``model_dir`` (its config, on the meta device): the first weight one has and the other
    lacks (layers added or removed), or whose shape differs; "" where they fit, where the checkpoint is
    not a DCP one, or where its metadata cannot be read (the load then says why)."""
    if not (found / DCP_DIR / ".metadata").is_file():
        return ""
    from torch.distributed.checkpoint import FileSystemReader

    from rlix.exec.data.model import meta_model

    try:
        entries = FileSystemReader(str(found / DCP_DIR)).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001 -- another torch's, or damaged: the trainer's load names it
        return ""
    saved = {k.removeprefix("model."): tuple(m.size) for k, m in entries.items() if k.startswith("model.") and hasattr(m, "size")}
    now = {name: tuple(t.shape) for name, t in meta_model(model_dir).state_dict().items()}  # tied weights under each name
    if missing := sorted(now.keys() - saved.keys()):
        return f"{missing[0]} is in the model, not there" + (f", nor {len(missing) - 1} more" if len(missing) > 1 else "")
    if extra := sorted(saved.keys() - now.keys()):
        return f"{extra[0]} is there, not in the model" + (f", nor {len(extra) - 1} more" if len(extra) > 1 else "")
    for name in sorted(now):
        if saved[name] != now[name]:
            return f"{name} is {list(saved[name])} there, {list(now[name])} in the model"
    return ""


def restore(learner, directory: str | Path) -> int:
    """Load the newest checkpoint under ``directory`` into ``learner`` (every rank calls it); returns its
    step (0 if none)."""
    import torch

    found = latest(directory)
    if found is None:
        return 0
    if (found / DCP_DIR).is_dir():
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _trainer_state(learner)  # the shapes and shards to read into
        try:
            dcp.load(state, checkpoint_id=str(found / DCP_DIR), no_dist=learner.ranks.world == 1)
        except dcp.CheckpointException as exc:  # a BaseException naming only the ranks: say what they raised
            rank, (raised, _) = min(exc.failures.items())
            raise RuntimeError(f"checkpoint {found}: rank {rank} could not load it: {type(raised).__name__}: {raised}") from exc
        set_state_dict(learner.model, learner.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        _restore_whole(learner, found)
    state = torch.load(found / "trainer_state.pt", map_location="cpu", weights_only=False)
    learner.version = int(state["version"])
    return learner.version


def _restore_whole(learner, found: Path) -> None:
    """A checkpoint of the earlier layout (one rank: HF weights, and the optimizer in trainer_state.pt)."""
    import torch

    from rlix.exec.data.model import load_model

    if learner.ranks.world > 1:
        raise ValueError(f"{found}: a one-rank checkpoint of an earlier rlix resumes on one rank only; train on one GPU")
    learner.model.load_state_dict(load_model(found, "cpu").state_dict())
    state = torch.load(found / "trainer_state.pt", map_location=learner.device, weights_only=False)
    learner.opt.load_state_dict(state["opt"])
