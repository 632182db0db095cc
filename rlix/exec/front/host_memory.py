"""Executor layer (driver side): co-tenants' models share a host's memory, so admission counts it.

Each job, while admitted, keeps host memory resident: its trainer's state offloaded between
stages (fp32 weights, Adam's two moments for a full finetune, a reference model with a KL
term) and the CPU weight cache its rollout workers wake from (in the sync dtype). A local run
admits jobs only while those fit in the host's available memory: a queue over the cluster's
GPUs with ``max_resident_gb`` (:class:`rlix.core.QueueSpec`), unless the config declares its
own memory limit. A job that could never fit is a config error before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlix.config import QueueModel
from rlix.exec.config import ConfigError, JobConfig, RunConfig

GB = 1e9
HOST_QUEUE = "host memory"
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def parameters(model_dir: str | Path) -> int:
    """Parameters of the checkpoint in ``model_dir``: its weight files' bytes over its dtype's."""
    root = Path(model_dir)
    size = sum(f.stat().st_size for pattern in _WEIGHT_FILES for f in root.glob(pattern))
    config = root / "config.json"
    dtype = "float32"
    if config.exists():
        raw = json.loads(config.read_text())
        dtype = str(raw.get("torch_dtype") or raw.get("dtype") or dtype)
    return size // _BYTES.get(dtype, 4)


def resident_gb(job: JobConfig, model_dir: str | Path) -> float:
    """Host memory (GB) the job keeps resident while admitted (see the module's docstring)."""
    n = parameters(model_dir)
    per_param = 4 + _BYTES.get(job.sync_dtype(), 2)  # fp32 weights offloaded, the weight cache
    if job.kind == "full_finetune":
        per_param += 8  # Adam's two moments (a LoRA job's adapters are a sliver of the base)
    if job.algo.kl_coef > 0:
        per_param += 4  # the reference model
    return n * per_param / GB


def available_gb() -> float:
    """The host's available memory (GB): MemAvailable, or free pages where /proc is not there."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB


def with_host_memory(config: RunConfig, models: dict[str, str], free_gb: float, skip: frozenset[str] = frozenset()) -> RunConfig:
    """``config`` with each job's ``resident_gb`` (where it gives none) and, unless it declares a memory
    limit of its own, a queue admitting jobs only while their resident memory fits in ``free_gb``.
    A job larger than ``free_gb`` alone raises :class:`ConfigError` (one line, the bytes named).
    Jobs in ``skip`` (by name: those with nothing left to train, never admitted) are left as they are."""
    jobs = []
    for i, job in enumerate(config.jobs):
        if job.name in skip:
            jobs.append(job)
            continue
        need = job.resident_gb or resident_gb(job, models[job.name])
        if need > free_gb:
            raise ConfigError(
                f"jobs[{i}] ({job.name}): its model keeps {need:.2f} GB of host memory resident (trainer state and "
                f"weight cache); this host has {free_gb:.2f} GB available; free memory or set jobs[{i}].resident_gb"
            )
        jobs.append(job.model_copy(update={"resident_gb": need}))
    scheduler = config.scheduler
    if not any(q.max_resident_gb for q in scheduler.queues):
        gpus = list(range(config.cluster.spec().num_gpus))
        queue = QueueModel(name=HOST_QUEUE, gpus=gpus, max_resident_gb=free_gb)
        scheduler = scheduler.model_copy(update={"queues": [*scheduler.queues, queue]})
    return config.model_copy(update={"jobs": jobs, "scheduler": scheduler})
