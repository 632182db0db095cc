"""The executor's torch path on one device, in one process: no Ray, no vLLM.

    python benchmarks/bench_gpu_torch.py [--device cuda] [--preset 0.5b] [--reps 3] [--json out.json]
    python benchmarks/bench_gpu_torch.py --device cpu --preset tiny     # a smoke run
    python benchmarks/bench_gpu_torch.py --switches [--json out.json]  # switches only (within 8 minutes)

The project's own classes, driven as its actors drive them, each section on its own
(one that fails leaves the others' figures, and its error, in the JSON):

- trainer: a :class:`~rlix.exec.train.grpo.GrpoLearner` built as ``TrainerActor.start``
  builds it (then offloaded), then ``--steps`` GRPO steps as the coordinator runs them
  (each stage: reload its parts, work, offload); the seconds of each, and the device
  memory the process still holds after an offload (issue target: at most 1 GiB), then a
  reload of every part, timed;
- weight sync: the trained weights published (:func:`~rlix.weightsync.buckets.publish_of`,
  bfloat16 buckets, a fresh version every time) into a
  :class:`~rlix.exec.rollout.torch_backend.TorchRolloutBackend` on the device: its first
  wake, then ``--reps`` times ``sleep`` (shrink, target <= 2 s), ``wake`` (expand, target
  <= 5 s) and ``update_weights`` while awake (a sync, GB/s of bucket bytes), and
  :func:`~rlix.weightsync.buckets.load_into` through a
  :class:`~rlix.weightsync.buckets.PinnedStaging` alone; on CUDA the plain host-to-device
  copy speed of the same bytes, pinned and pageable (target: a sync >= 50% of pageable);
- switches (``--switches``: setup, this and the sync alone): a trained learner's offload and
  reload (policy and Adam state), through pageable memory (``.to()``) and through the
  learner's page-locked host buffers (:class:`~rlix.exec.train.host_arena.HostArena`,
  reused), the bytes moved, and each against a pinned host-to-device copy of the same
  bytes in the same run (targets: offload + reload <= 0.6 s for 0.5B; a sync through the
  host >= 0.8x pinned);
- hand-off (``--switches``): the learner stages a new version on its GPU and publishes it
  (:mod:`rlix.weightsync.handoff`); a second process on the same GPU (a torch rollout engine)
  loads it over CUDA IPC and through the host buckets, bit-exact against each other (target:
  CUDA IPC <= 0.1 s for 0.5B); also each host bucket page-locked in place and copied once, a
  variant measured for the host path's next step;
- generation: ``GenRequest`` s through the backend (tokens/s), and whether greedy output is
  the same before a sleep and after a wake with the same weights.

Calls on CUDA are timed twice: when the call returns (what an actor's ``SwitchTiming``
reports) and once the device has finished (``torch.cuda.synchronize``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's rlix

PRESETS = {
    "0.5b": {"hidden": 1024, "layers": 28, "heads": 16, "intermediate": 4864},
    "tiny": {"hidden": 256, "layers": 2, "heads": 4, "intermediate": 512},
}
GIB = float(1 << 30)
TARGETS = {
    "held_after_offload_GiB": 1.0,
    "expand_s": 5.0,
    "shrink_s": 2.0,
    "sync_fraction_of_pageable": 0.5,
    "offload_reload_s": 0.6,
    "sync_fraction_of_pinned": 0.8,
    "handoff_s": 0.1,
}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def cuda(ctx: dict) -> bool:
    return ctx["device"].startswith("cuda")


def done(ctx: dict) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if cuda(ctx):
        import torch

        torch.cuda.synchronize()


def timed(ctx: dict, fn: Callable[[], object]) -> tuple[float, float, object]:
    """(seconds until ``fn`` returned, seconds until the device finished too, its result)."""
    done(ctx)
    t = time.perf_counter()
    value = fn()
    returned = time.perf_counter() - t
    done(ctx)
    return returned, time.perf_counter() - t, value


def memory(ctx: dict) -> dict:
    """The device memory this process holds now: PyTorch's allocated and reserved bytes, and the
    driver's count against the baseline taken (CUDA context up) before anything was built."""
    if not cuda(ctx):
        return {"note": "CPU run: device memory not measured"}
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated_GiB": torch.cuda.memory_allocated() / GIB,
        "reserved_GiB": torch.cuda.memory_reserved() / GIB,
        "held_GiB": (ctx["baseline_free"] - free) / GIB,
        "device_used_GiB": (total - free) / GIB,
    }


def section(out: dict, name: str, fn: Callable[[dict, argparse.Namespace, dict], None], args, ctx: dict) -> None:
    """Run one section into ``out[name]``; an exception is recorded there (and what it measured before it kept)."""
    res: dict = {}
    out[name] = res
    log(f"{name}: start")
    t = time.perf_counter()
    try:
        fn(res, args, ctx)
        log(f"{name}: done")
    except Exception as e:  # one section's failure must leave the others' figures
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        log(f"{name}: FAILED {res['error'][:300]}")
    res["section_s"] = time.perf_counter() - t


# ------------------------------------------------------------------ setup


def setup(res: dict, args, ctx: dict) -> None:
    """The device's baseline memory (CUDA context up, nothing built), then the random-weight model on disk."""
    import torch
    import transformers

    from rlix.exec.data.model import ModelSize, build_model

    res |= {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    if cuda(ctx):
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        ctx["baseline_free"] = free
        res |= {"gpu": torch.cuda.get_device_name(), "baseline_used_GiB": (total - free) / GIB, "total_GiB": total / GIB}
    p = PRESETS[args.preset]
    size = ModelSize(
        arch="qwen2", hidden_size=p["hidden"], num_layers=p["layers"], num_heads=p["heads"], intermediate_size=p["intermediate"]
    )
    t = time.perf_counter()
    ctx["path"] = str(build_model(size, Path(ctx["tmp"]) / "model"))
    res["build_model_s"] = time.perf_counter() - t
    res["size"] = size.__dict__


# ------------------------------------------------------------------ trainer


def synthetic_samples(n: int, tokens: int, vocab: int, seed: int = 0) -> list:
    """``n`` trajectories of ``tokens`` tokens (an eighth of them prompt), advantages +-1."""
    import torch

    from rlix.exec.messages import Sample

    g = torch.Generator().manual_seed(seed)
    prompt = max(2, tokens // 8)
    out = []
    for i in range(n):
        ids = torch.randint(4, vocab, (tokens,), generator=g).tolist()
        out.append(Sample(prompt_ids=tuple([1] + ids[1:prompt]), completion_ids=tuple(ids[prompt:]), advantage=(-1.0) ** i))
    return out


def stage(ctx: dict, learner, parts, work: Callable[[], object]) -> tuple[dict, object]:
    """One gang stage as the coordinator runs it: its parts onto the device, the work, an offload."""
    reload_s, _, _ = timed(ctx, lambda: learner.reload(parts))
    work_s, work_done_s, value = timed(ctx, work)
    offload_s, _, _ = timed(ctx, learner.offload)
    return {"reload_s": reload_s, "work_s": work_done_s, "offload_s": offload_s, "held_after_offload": memory(ctx)}, value


def train_step(ctx: dict, learner, samples: list) -> dict:
    """One step's trainer stages: old log-probs (policy), then training (policy and optimizer)."""
    from dataclasses import replace

    from rlix.core import Stage
    from rlix.exec.train.residency import STAGE_PARTS

    old, rows = stage(ctx, learner, STAGE_PARTS[Stage.OLD_LOGPROBS], lambda: learner.logprobs(samples))
    batch = [replace(s, old_logprobs=r) for s, r in zip(samples, rows)]
    grads: list[int] = []

    def train():
        stats = learner.train(batch)
        grads.append(sum(p.grad.numel() * p.grad.element_size() for p in learner.model.parameters() if p.grad is not None))
        return stats

    trained, stats = stage(ctx, learner, STAGE_PARTS[Stage.ACTOR_TRAIN], train)
    return {"old_logprobs": old, "train": trained, "loss": stats.loss, "tokens": stats.tokens, "grad_bytes_kept": grads[0]}


def bench_trainer(res: dict, args, ctx: dict) -> None:
    """The learner built as ``TrainerActor.start`` builds it, ``--steps`` steps, then a reload of every part."""
    from rlix.exec.data.model import param_count
    from rlix.exec.messages import Emulation, GrpoConfig, TrainOptions
    from rlix.exec.train.grpo import GrpoLearner
    from rlix.exec.train.residency import ALL_PARTS

    opts = TrainOptions(precision=args.precision)
    build_s, _, learner = timed(
        ctx, lambda: GrpoLearner(ctx["path"], ctx["device"], GrpoConfig(), Emulation(), dtype="float32", options=opts)
    )
    ctx["learner"] = learner
    res |= {"build_s": build_s, "params": param_count(learner.model), "bf16_compute": learner.bf16, "built": memory(ctx)}
    res["first_offload_s"], _, _ = timed(ctx, learner.offload)  # TrainerActor.start: GPUs are ours only while a stage is granted
    res["after_first_offload"] = memory(ctx)
    samples = synthetic_samples(args.samples, args.tokens, int(learner.model.config.vocab_size))
    res["batch"] = {"samples": len(samples), "tokens_each": args.tokens}
    res["steps"] = []
    for i in range(args.steps):
        res["steps"].append(train_step(ctx, learner, samples))
        step = res["steps"][-1]
        log(f"trainer: step {i + 1}: train {step['train']['work_s']:.2f} s, loss {step['loss']:.4f}")
    last = res["steps"][-1]["train"]
    res["train_step_s"] = [s["train"]["work_s"] for s in res["steps"]]
    res["offload_s"] = last["offload_s"]
    res["grad_bytes_kept_after_train"] = res["steps"][-1]["grad_bytes_kept"]
    if cuda(ctx):
        res["held_after_offload_GiB"] = max(
            s[k]["held_after_offload"]["held_GiB"] for s in res["steps"] for k in ("old_logprobs", "train")
        )
    n = len(learner.residency.moves)
    res["reload_all_s"], res["reload_all_done_s"], _ = timed(ctx, lambda: learner.reload(ALL_PARTS))
    res["after_reload"] = memory(ctx)
    res["reload_moved_bytes"] = {m.part.value: m.nbytes for m in learner.residency.moves[n:]}
    res["offload_again_s"], _, _ = timed(ctx, learner.offload)
    res["after_offload_again"] = memory(ctx)


# ------------------------------------------------------------------ switches


def bench_switches(res: dict, args, ctx: dict) -> None:
    """A trained learner's offload + reload of every part, ``--reps`` times each way: pageable, then pinned."""
    from rlix.exec.messages import Emulation, GrpoConfig, LearnerPart, TrainOptions
    from rlix.exec.train.grpo import GrpoLearner
    from rlix.exec.train.residency import module_to, optimizer_to, release_cached_memory

    opts = TrainOptions(precision=args.precision, gpu_handoff=True)  # the hand-off section stages and publishes
    learner = GrpoLearner(ctx["path"], ctx["device"], GrpoConfig(), Emulation(), options=opts)
    train_step(ctx, learner, synthetic_samples(args.samples, args.tokens, int(learner.model.config.vocab_size)))  # Adam state
    parts = learner.residency.tracked()

    def pageable(device: str) -> None:
        for (part, _), obj in parts.items():
            (optimizer_to if part is LearnerPart.OPTIMIZER else module_to)(obj, device)
        if device == "cpu":
            release_cached_memory(ctx["device"])

    def pinned(onto_device: bool) -> None:
        learner.reload() if onto_device else learner.offload()

    learner.offload()  # the host buffers allocated (once per job), then reused by every round
    learner.reload()
    res["bytes"] = learner.residency.arena.host_bytes()
    res["host_buffers"] = learner.residency.arena.allocations
    for kind, off, on in (  # pinned first: the pageable rounds leave the parts outside the device buffers
        ("pinned", lambda: pinned(False), lambda: pinned(True)),
        ("pageable", lambda: pageable("cpu"), lambda: pageable(ctx["device"])),
    ):
        rounds = [(timed(ctx, off)[1], timed(ctx, on)[1]) for _ in range(args.reps)]
        res[f"{kind}_offload_s"] = statistics.median(r[0] for r in rounds)
        res[f"{kind}_reload_s"] = statistics.median(r[1] for r in rounds)
        res[f"{kind}_offload_reload_s"] = res[f"{kind}_offload_s"] + res[f"{kind}_reload_s"]
        log(f"switches: {kind}: offload {res[f'{kind}_offload_s']:.3f} s, reload {res[f'{kind}_reload_s']:.3f} s")
    res["host_buffers_after"] = learner.residency.arena.allocations  # reused: none allocated by the rounds
    if cuda(ctx):
        res |= h2d_speed(res["bytes"])
        ideal = 2 * res["bytes"] / (res["h2d_pinned_GBps"] * 1e9)  # both ways at the pinned copy's speed
        for kind in ("pageable", "pinned"):
            res[f"{kind}_fraction_of_pinned_copy"] = ideal / res[f"{kind}_offload_reload_s"]
    else:
        res["h2d_note"] = "CPU run: host-to-device copies not measured"
    ctx["switch_learner"] = learner  # the hand-off section stages and publishes its weights


# ------------------------------------------------------------------ hand-off over CUDA IPC


def bench_handoff(res: dict, args, ctx: dict) -> None:
    """The trained learner stages its new version on the GPU (as at the end of a training stage), offloads,
    and publishes; a second process on the same GPU loads it into a torch rollout engine ``--reps`` + 1
    times over CUDA IPC and as many through the host buckets (pinned staging), bit-exact against each other."""
    from dataclasses import replace

    import torch

    if not cuda(ctx):  # the two processes and both loads still run, each through the host
        res["note"] = "CPU run: CUDA IPC needs a GPU; unmeasured"
    learner = ctx["switch_learner"]
    learner.reload()  # the model on the GPU, as a training stage leaves it
    res["stage_s"] = timed(ctx, lambda: learner.stage_handoff("bfloat16"))[1]
    res["held_bytes"] = learner.handoff.nbytes if learner.handoff is not None else 0
    learner.offload()
    res["after_offload"] = memory(ctx)  # the held buckets stay: the hand-off's GPU memory between stages
    res["publish_s"], _, w = timed(ctx, lambda: learner.publish("bfloat16"))
    w = replace(w, handoff=learner.handoff_handles("bfloat16"))  # the handles travel apart, as TrainerLink fetches them
    if w.handoff is None and cuda(ctx):
        raise RuntimeError("the learner published no hand-off (TrainOptions.gpu_handoff off, or no staged version)")
    res["bytes"] = w.nbytes
    mp = torch.multiprocessing.get_context("spawn")
    here, there = mp.Pipe()
    proc = mp.Process(target=handoff_worker, args=(there, ctx["path"], ctx["device"], args.reps), daemon=True)
    proc.start()
    try:
        here.send(w)
        if not here.poll(300):
            raise TimeoutError("the worker process did not answer within 300 s")
        got = here.recv()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if "error" in got:
        raise RuntimeError(f"worker process: {got['error']}")
    res |= got
    for path in ("ipc", "host"):
        res[f"{path}_GBps"] = w.nbytes / res[f"{path}_s_median"] / 1e9
    if cuda(ctx):
        res |= h2d_speed(w.nbytes)
        res["host_fraction_of_pinned"] = res["host_GBps"] / res["h2d_pinned_GBps"]
        res["registered"] = registered_h2d(w)
        res["refused_registration"] = refused_registration()
        before = torch.cuda.memory_allocated()
        learner.handoff.drop()  # a stage needs the room: the bytes come back though a reader opened them
        res["freed_by_drop_bytes"] = before - torch.cuda.memory_allocated()


def handoff_worker(conn, path: str, device: str, reps: int) -> None:
    """The second process: a torch rollout engine on ``device`` loading the published version received on
    ``conn``, over CUDA IPC and then through the host; sends back the seconds and whether both agree."""
    try:
        conn.send(_handoff_loads(conn.recv(), path, device, reps))
    except Exception as e:  # noqa: BLE001 -- the parent records it as the section's error
        conn.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})


def _handoff_loads(w, path: str, device: str, reps: int) -> dict:
    from dataclasses import replace

    import torch

    from rlix.exec.messages import Emulation
    from rlix.exec.rollout.torch_backend import make_backend
    from rlix.weightsync.buckets import PinnedStaging, load_into

    torch.set_num_threads(1)  # as a worker actor runs
    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
    engine = make_backend("torch", Emulation())
    engine.prepare(path, device)
    engine.wake(None)
    model, out = engine.model, {}
    pinned = PinnedStaging() if device.startswith("cuda") else None
    for label, weights, staging in (("ipc", w, None), ("host", replace(w, handoff=None), pinned)):
        secs = []
        for _ in range(reps + 1):
            sync()
            t = time.perf_counter()
            route = load_into(model, weights, device, staging)
            sync()
            secs.append(time.perf_counter() - t)
        out |= {f"{label}_route": route.path.value, f"{label}_reason": route.reason, f"{label}_first_s": secs[0]}
        out[f"{label}_s_median"] = statistics.median(secs[1:])
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if label == "ipc":
            ipc_state = state
    out["bit_exact"] = all(torch.equal(ipc_state[k], v) for k, v in state.items())
    return out


def refused_registration() -> dict:
    """A registration CUDA refuses (the pages are registered already) leaves the registry unchanged and no
    CUDA error behind for the next kernel to report."""
    import torch

    from rlix.weightsync.host_pages import HostPages

    cudart = torch.cuda.cudart()
    buf = torch.empty(4 << 20, dtype=torch.uint8)
    if cudart.cudaHostRegister(buf.data_ptr(), buf.numel(), 0) != 0:
        return {"error": "could not register the test buffer"}
    lo, hi = buf.data_ptr() // 4096 * 4096, -(-(buf.data_ptr() + buf.numel()) // 4096) * 4096
    as_shared = f"{lo:x}-{hi:x} rw-s 00000000 00:1a 1 /dev/shm/bench\n"  # the heap buffer, taken for the store's
    reg = HostPages(1 << 30, read_maps=lambda: as_shared)
    out = {"clears_with": getattr(reg._clear, "__name__", str(reg._clear))}
    out["pinned"] = reg.pinned(buf.data_ptr() + 4096, 4096)
    try:
        (torch.ones(8, device="cuda") * 2).sum().item()
        out["kernel_after"] = "ok"
    except RuntimeError as e:
        out["kernel_after"] = f"{type(e).__name__}: {e}"[:300]
    cudart.cudaHostUnregister(buf.data_ptr())
    return out


def registered_h2d(w) -> dict:
    """Variants not in rlix yet, measured to choose the host path's next step: the buckets copied once to
    the device from page-locked memory where they lie, with no staging copy. ``per_sync``: each bucket
    registered (cudaHostRegister) and unregistered around its copy, every sync. ``once``: the buckets
    placed in one shared-memory mapping, as Ray's object store holds them, registered once (its
    seconds apart) and then copied every sync."""
    import mmap

    import numpy as np
    import torch

    cudart = torch.cuda.cudart()

    def copy_all(buckets) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = [torch.from_numpy(b).to("cuda", non_blocking=True) for b in buckets]
        torch.cuda.synchronize()
        del outs
        return time.perf_counter() - t

    out: dict = {}
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for b in w.buckets:
            if cudart.cudaHostRegister(b.ctypes.data, b.nbytes, 0) != 0:
                return {"error": "cudaHostRegister refused a bucket"}
        copy_all(w.buckets)
        for b in w.buckets:
            cudart.cudaHostUnregister(b.ctypes.data)
        times.append(time.perf_counter() - t)
    out["per_sync_GBps"] = w.nbytes / statistics.median(times) / 1e9
    with tempfile.TemporaryFile(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as f:
        f.truncate(w.nbytes)
        region = mmap.mmap(f.fileno(), w.nbytes)
        arena = np.frombuffer(region, dtype=np.uint8)
        placed, at = [], 0
        for b in w.buckets:
            arena[at : at + b.nbytes] = b
            placed.append(arena[at : at + b.nbytes])
            at += b.nbytes
        t = time.perf_counter()
        if cudart.cudaHostRegister(arena.ctypes.data, w.nbytes, 0) != 0:
            return out | {"error": "cudaHostRegister refused the shared mapping"}
        out["once_register_s"] = time.perf_counter() - t
        out["once_GBps"] = w.nbytes / statistics.median(copy_all(placed) for _ in range(3)) / 1e9
        cudart.cudaHostUnregister(arena.ctypes.data)
        del placed, arena
        region.close()
    return out


# ------------------------------------------------------------------ weight sync


def source_model(ctx: dict):
    """The weights to publish: the trained learner's policy (offloaded, as after a step), else the checkpoint's."""
    if ctx.get("learner") is not None:
        return ctx["learner"].model
    if ctx.get("source") is None:
        from rlix.exec.data.model import load_model

        ctx["source"] = load_model(ctx["path"])
    return ctx["source"]


def publisher(ctx: dict) -> tuple[Callable[[], object], list[float]]:
    """A function publishing a fresh version of the weights each call (bfloat16 buckets, as a trainer
    does after each step), and the seconds each publish took."""
    from rlix.weightsync.buckets import publish_of

    model, seconds = source_model(ctx), []

    def publish():
        ctx["version"] = ctx.get("version", 0) + 1
        t = time.perf_counter()
        w = publish_of(model, ctx["version"], "bfloat16")
        seconds.append(time.perf_counter() - t)
        if cuda(ctx):  # a worker reads the buckets where Ray's object store holds them
            ctx.setdefault("store", ObjectStore(w.nbytes))
            w = ctx["store"].put(w)
        return w

    return publish, seconds


class ObjectStore:
    """Published versions where Ray's object store would hold them for a worker on the trainer's node:
    read-only views into one shared mapping under /dev/shm, allocated once, each version in the slot the
    version before last freed (as the store reuses freed space)."""

    def __init__(self, nbytes: int, slots: int = 2) -> None:
        import mmap

        import numpy as np

        self.slot_bytes = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE + mmap.PAGESIZE
        shm = Path("/dev/shm")
        room = shm.is_dir() and os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize > 2 * self.slot_bytes * slots
        self.shared = bool(room)  # else a temporary file elsewhere: staged, as a store outside /dev/shm would be
        self._file = tempfile.TemporaryFile(dir=str(shm) if room else None)
        self._file.truncate(self.slot_bytes * slots)
        self._map = mmap.mmap(self._file.fileno(), self.slot_bytes * slots)
        self._arena = np.frombuffer(self._map, dtype=np.uint8)
        self._slots, self._next = slots, 0

    def put(self, w):
        from dataclasses import replace

        at = self._next * self.slot_bytes + 64 * self._next  # not page-aligned, as an object's data need not be
        self._next = (self._next + 1) % self._slots
        views = []
        for b in w.buckets:
            view = self._arena[at : at + b.nbytes]
            view[:] = b
            view = view.view()
            view.setflags(write=False)
            views.append(view)
            at += -(-b.nbytes // 64) * 64
        return replace(w, buckets=tuple(views))


def engine_info(backend) -> dict:
    p = next(backend.model.parameters())
    return {"param_dtype": str(p.dtype), "param_device": str(p.device), "weight_version": backend.weight_version}


def switch_round(ctx: dict, backend, publish) -> dict:
    """One shrink (sleep), expand (wake with a new version) and awake sync (another new version)."""
    row: dict = {}
    row["shrink_s"], row["shrink_done_s"], _ = timed(ctx, backend.sleep)
    row["asleep"] = memory(ctx)
    w = publish()
    row["expand_s"], row["expand_done_s"], _ = timed(ctx, lambda: backend.wake(w))
    row["awake"] = memory(ctx)
    w = publish()
    row["sync_s"], row["sync_done_s"], _ = timed(ctx, lambda: backend.update_weights(w))
    row["version"] = backend.weight_version
    ctx["weights"] = w  # what the engine now holds
    return row


def bench_sync(res: dict, args, ctx: dict) -> None:
    """A torch rollout backend on the device: prepare, first wake, then ``--reps`` switch rounds."""
    from rlix.exec.messages import Emulation
    from rlix.exec.rollout.torch_backend import make_backend

    publish, publish_s = publisher(ctx)
    backend = make_backend("torch", Emulation())
    res["prepare_s"], _, _ = timed(ctx, lambda: backend.prepare(ctx["path"], ctx["device"]))
    ctx["backend"] = backend
    w = publish()
    res |= {"weight_bytes": w.nbytes, "buckets": len(w.buckets), "dtype": w.dtype}
    res["first_wake_s"], res["first_wake_done_s"], _ = timed(ctx, lambda: backend.wake(w))
    ctx["weights"] = w
    res |= {"engine": engine_info(backend), "awake": memory(ctx), "reps": []}
    for i in range(args.reps):
        row = switch_round(ctx, backend, publish)
        res["reps"].append(row)
        secs = ", ".join(f"{k} {row[k + '_done_s']:.3f} s" for k in ("shrink", "expand", "sync"))
        log(f"sync: rep {i + 1}: {secs}")
    for key in ("shrink", "expand", "sync"):
        res[f"{key}_s_median"] = statistics.median(r[f"{key}_done_s"] for r in res["reps"])
        res[f"{key}_call_s_median"] = statistics.median(r[f"{key}_s"] for r in res["reps"])
    res["sync_GBps"] = w.nbytes / res["sync_s_median"] / 1e9
    staging = getattr(backend, "_staging", None)
    res["direct_copies"] = staging.direct_copies if staging is not None else 0  # buckets read in place, page-locked
    res["store_in_dev_shm"] = getattr(ctx.get("store"), "shared", None)
    res["expand_GBps"] = w.nbytes / res["expand_s_median"] / 1e9
    bench_load_into(res, args, ctx, publish)
    res["publish_s_median"] = statistics.median(publish_s)
    if cuda(ctx):
        res |= h2d_speed(w.nbytes)
        res["sync_fraction_of_pageable"] = res["sync_GBps"] / res["h2d_pageable_GBps"]
        res["sync_fraction_of_pinned"] = res["sync_GBps"] / res["h2d_pinned_GBps"]
    else:
        res["h2d_note"] = "CPU run: host-to-device copies not measured"


def bench_load_into(res: dict, args, ctx: dict, publish) -> None:
    """``load_into`` (what the backend's wake and sync call) alone, into the awake engine, through a
    fresh ``PinnedStaging`` of N copy threads; its first load (buffers pinned then) apart."""
    from rlix.weightsync.buckets import COPY_THREADS, PinnedStaging, load_into

    backend, device = ctx["backend"], ctx["device"]
    res["copy_threads_default"] = COPY_THREADS
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for threads in sorted({COPY_THREADS, 1, min(16, cpus)}, reverse=True):  # more threads: is the host copy the limit?
        staging = PinnedStaging(copy_threads=threads) if cuda(ctx) else None
        secs = []
        for _ in range(args.reps + 1):
            w = publish()
            secs.append(timed(ctx, lambda w=w, st=staging: load_into(backend.model, w, device, st))[1])
        res[f"load_into_{threads}t_first_s"] = secs[0]
        res[f"load_into_{threads}t_s_median"] = s = statistics.median(secs[1:])
        res[f"load_into_{threads}t_GBps"] = w.nbytes / s / 1e9
        if not cuda(ctx):
            res["load_into_note"] = "CPU run: no staging (the engine copies straight from the buckets)"
            break
    backend.model.tie_weights()  # as the backend's own load does after load_into


def h2d_speed(nbytes: int, reps: int = 5) -> dict:
    """Host-to-device copy speed of ``nbytes`` (GB/s), from pinned and from pageable host memory (warm pages)."""
    import torch

    out = {}
    for kind, pinned in (("pinned", True), ("pageable", False)):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        src.fill_(1)  # pages touched: a pageable copy does not measure first-touch faults
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst.copy_(src)  # warm up
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            dst.copy_(src, non_blocking=pinned)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        out[f"h2d_{kind}_GBps"] = nbytes / statistics.median(times) / 1e9
        del src, dst
    torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------ generation


def ready_backend(ctx: dict):
    """The sync section's backend, awake with the weights it last loaded; else a new one woken with a publish."""
    from rlix.exec.messages import Emulation
    from rlix.exec.rollout.torch_backend import make_backend

    if ctx.get("backend") is None:
        ctx["backend"] = make_backend("torch", Emulation())
        ctx["backend"].prepare(ctx["path"], ctx["device"])
    if ctx.get("weights") is None:
        ctx["weights"] = publisher(ctx)[0]()
    backend, w = ctx["backend"], ctx["weights"]
    if not backend.awake or backend.weight_version != w.version:
        backend.wake(w)
    return backend, w


def requests(n: int, new_tokens: int, vocab: int) -> list:
    """``n`` greedy requests (temperature 0) of 16-token prompts."""
    import torch

    from rlix.exec.messages import GenRequest

    g = torch.Generator().manual_seed(1)
    return [
        GenRequest(
            traj_id=i,
            prompt_ids=(1, *torch.randint(4, vocab, (15,), generator=g).tolist()),
            max_new_tokens=new_tokens,
            temperature=0.0,
            seed=i,
        )
        for i in range(n)
    ]


def bench_generate(res: dict, args, ctx: dict) -> None:
    """Greedy requests one after another (tokens/s), then the same after a sleep and a wake with the same weights."""
    from dataclasses import replace

    backend, w = ready_backend(ctx)
    reqs = requests(args.requests, args.new_tokens, int(backend.config.vocab_size))
    backend.generate(replace(reqs[0], max_new_tokens=4))  # warm up: kernels, allocator
    res["engine"] = engine_info(backend)
    secs, _, before = timed(ctx, lambda: [backend.generate(r) for r in reqs])
    tokens = sum(len(r.token_ids) for r in before)
    res |= {"requests": len(reqs), "tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs}
    res["ms_per_token"] = 1e3 * statistics.median(r.gen_s / max(len(r.token_ids), 1) for r in before)
    res["finished"] = sum(r.finished for r in before)
    res["weight_version"] = before[0].weight_version
    backend.sleep()
    backend.wake(w)
    after = [backend.generate(r) for r in reqs]
    same = [a.token_ids == b.token_ids for a, b in zip(after, before)]
    res["greedy_same_after_sleep_wake"] = all(same)
    res["greedy_mismatched_requests"] = same.count(False)
    res["logprob_max_abs_diff"] = max(
        (abs(x - y) for a, b in zip(after, before) for x, y in zip(a.logprobs, b.logprobs)), default=0.0
    )


# ------------------------------------------------------------------ report


def verdict(value, target: float, most: bool) -> str:
    """'ok' / 'MISSED' against a target (``most``: the value may be at most the target), '-' when unmeasured."""
    if not isinstance(value, int | float) or value != value:
        return "-"
    return "ok" if (value <= target if most else value >= target) else "MISSED"


def fmt(value, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def summary(out: dict) -> str:
    """The figures that matter, one line each, with the issue's targets."""
    setup, tr, sy, gen = (out.get(k, {}) for k in ("setup", "trainer", "sync", "generate"))
    steps = " ".join(fmt(s, ".2f") for s in tr.get("train_step_s", []))
    held, exp, shr, frac = (
        tr.get("held_after_offload_GiB"),
        sy.get("expand_s_median"),
        sy.get("shrink_s_median"),
        sy.get("sync_fraction_of_pageable"),
    )
    lines = [
        f"device {out['args']['device']} ({setup.get('gpu', 'no GPU')}), preset {out['args']['preset']}, "
        f"torch {setup.get('torch', '?')}, transformers {setup.get('transformers', '?')}",
        f"trainer: {fmt(tr.get('params'), ',')} params, train steps {steps} s, "
        f"offload {fmt(tr.get('offload_s'))} s, reload (all parts) {fmt(tr.get('reload_all_done_s'))} s",
        f"trainer: held after offload {fmt(held)} GiB (target <= {TARGETS['held_after_offload_GiB']}: "
        f"{verdict(held, TARGETS['held_after_offload_GiB'], True)}); gradients kept after a step (moved at every "
        f"offload and reload): {fmt(tr.get('grad_bytes_kept_after_train', 0) / 1e9 or None)} GB",
        f"sync: {fmt(sy.get('weight_bytes', 0) / 1e9 or None)} GB buckets; publish {fmt(sy.get('publish_s_median'))} s; "
        f"first wake {fmt(sy.get('first_wake_done_s'))} s",
        f"sync: expand {fmt(exp)} s (target <= {TARGETS['expand_s']}: {verdict(exp, TARGETS['expand_s'], True)}), "
        f"shrink {fmt(shr)} s (target <= {TARGETS['shrink_s']}: {verdict(shr, TARGETS['shrink_s'], True)})",
        f"sync: update_weights {fmt(sy.get('sync_GBps'), '.2f')} GB/s; h2d pinned {fmt(sy.get('h2d_pinned_GBps'), '.1f')}, "
        f"pageable {fmt(sy.get('h2d_pageable_GBps'), '.1f')} GB/s; fraction of pageable {fmt(frac, '.2f')} "
        f"(target >= {TARGETS['sync_fraction_of_pageable']}: {verdict(frac, TARGETS['sync_fraction_of_pageable'], False)})",
        f"generate: {fmt(gen.get('tokens_per_s'), '.1f')} tokens/s on {gen.get('engine', {}).get('param_device', '-')}, "
        f"greedy same after sleep+wake: {gen.get('greedy_same_after_sleep_wake', '-')}",
    ]
    sw = out.get("switches", {})
    if sw:
        both, frac = sw.get("pinned_offload_reload_s"), sy.get("sync_fraction_of_pinned")
        judged = both if out["args"]["device"] == "cuda" else None  # the target is a GPU's: a CPU run is not judged
        lines += [
            f"switches: {fmt(sw.get('bytes', 0) / 1e9 or None)} GB moved each way; offload + reload pageable "
            f"{fmt(sw.get('pageable_offload_reload_s'))} s ({fmt(sw.get('pageable_fraction_of_pinned_copy'), '.2f')}x a pinned "
            f"copy), pinned {fmt(both)} s ({fmt(sw.get('pinned_fraction_of_pinned_copy'), '.2f')}x; target <= "
            f"{TARGETS['offload_reload_s']} s: {verdict(judged, TARGETS['offload_reload_s'], True)}); host buffers "
            f"{sw.get('host_buffers', '-')}, after {out['args']['reps']} rounds {sw.get('host_buffers_after', '-')}",
            f"switches: sync through the host ({sy.get('direct_copies', '-')} buckets read in place, page-locked) "
            f"{fmt(frac, '.2f')}x a pinned copy (target >= "
            f"{TARGETS['sync_fraction_of_pinned']}: {verdict(frac, TARGETS['sync_fraction_of_pinned'], False)})",
        ]
    ho = out.get("handoff", {})
    if ho:
        ipc = ho.get("ipc_s_median") if ho.get("ipc_route") == "cuda_ipc" else None  # judged only in place
        lines.append(
            f"handoff: {fmt(ho.get('bytes', 0) / 1e9 or None)} GB; CUDA IPC to a second process on the GPU "
            f"{fmt(ipc)} s ({ho.get('ipc_route', '-')}; target <= {TARGETS['handoff_s']}: "
            f"{verdict(ipc, TARGETS['handoff_s'], True)}), through the host {fmt(ho.get('host_s_median'))} s "
            f"({fmt(ho.get('host_fraction_of_pinned'), '.2f')}x pinned); bit-exact {ho.get('bit_exact', '-')}; "
            f"stage {fmt(ho.get('stage_s'))} s, publish {fmt(ho.get('publish_s'))} s, dropped after reads: "
            f"{fmt(ho.get('freed_by_drop_bytes', 0) / 1e9 or None)} GB freed; "
            f"host buckets page-locked in place: every sync {fmt(ho.get('registered', {}).get('per_sync_GBps'), '.1f')} "
            f"GB/s, a shared mapping registered once {fmt(ho.get('registered', {}).get('once_GBps'), '.1f')} GB/s "
            f"(+{fmt(ho.get('registered', {}).get('once_register_s'))} s once); a refused registration: pinned "
            f"{ho.get('refused_registration', {}).get('pinned', '-')}, next kernel "
            f"{ho.get('refused_registration', {}).get('kernel_after', '-')}" + (f"; {ho['note']}" if "note" in ho else "")
        )
    lines += [f"{k}: ERROR {v['error']}" for k, v in out.items() if isinstance(v, dict) and "error" in v]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto", help="the trainer's (TrainOptions)")
    ap.add_argument("--steps", type=int, default=2, help="training steps")
    ap.add_argument("--samples", type=int, default=8, help="samples per training batch")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per sample (prompt and completion; the model's limit is 256)")
    ap.add_argument("--reps", type=int, default=3, help="shrink/expand/sync rounds, and load_into repetitions")
    ap.add_argument("--requests", type=int, default=4, help="generation requests")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens each request generates at most")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (the executor's actors run one)")
    ap.add_argument("--json", default=None, help="also write the figures here (after every section)")
    ap.add_argument(
        "--switches",
        action="store_true",
        help="only the switches (setup first): a trainer's offload and reload through pageable memory and "
        "through its page-locked host buffers; the weight hand-off to a second process on the same GPU over "
        "CUDA IPC and through the host buckets (pinned staging); a rollout engine's sync through the host; "
        "each against a pinned host-to-device copy",
    )
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    out: dict = {"args": vars(args)}
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu for a smoke run)")
    torch.set_num_threads(args.torch_threads)
    ctx: dict = {"device": "cuda:0" if args.device == "cuda" else "cpu"}  # as device_for_worker names it
    sections = (("setup", setup), ("trainer", bench_trainer), ("sync", bench_sync), ("generate", bench_generate))
    if args.switches:
        sections = (("setup", setup), ("switches", bench_switches), ("handoff", bench_handoff), ("sync", bench_sync))
    with tempfile.TemporaryDirectory() as tmp:
        ctx["tmp"] = tmp
        for name, fn in sections:
            if name != "setup" and "path" not in ctx:
                out[name] = {"error": "skipped: no model (setup failed)"}
                continue
            section(out, name, fn, args, ctx)
            out["total_s"] = time.perf_counter() - T0
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps(out, indent=1, default=str), flush=True)
    print("\n" + summary(out), flush=True)


if __name__ == "__main__":
    main()
