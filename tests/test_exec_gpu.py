"""The vLLM rollout path on a real GPU (skipped without CUDA and vllm).

A tiny random-weight model: the backend's cold start, generation with real
token log-probs, sleep (weights dropped) and wake with the trainer's
snapshot, aborting and continuing an in-flight request, serving LoRA
adapters per request; then two jobs (full finetune + multi-LoRA) sharing
one GPU end to end under Ray with rollout_backend: vllm.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from rlix.exec.config import parse_config  # noqa: E402
from rlix.exec.grpo import GrpoConfig  # noqa: E402
from rlix.exec.lora import LoraLearner, LoraSpec  # noqa: E402
from rlix.exec.model import ModelSize, build_model, load_model  # noqa: E402
from rlix.exec.recipe import continuation  # noqa: E402
from rlix.exec.rollout import GenRequest, VllmOptions  # noqa: E402
from rlix.exec.weights import snapshot_of  # noqa: E402

SIZE = ModelSize(arch="qwen2", hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, seed=0)
OPTS = VllmOptions(gpu_memory_utilization=0.2, sleep_level=2, max_model_len=256)
SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), adapters=(("a", 1), ("b", 2)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(SIZE, tmp_path_factory.mktemp("gpu_model"))


@pytest.fixture
def make_backend(model_dir):
    """Backends on ``model_dir``, closed at teardown: vLLM's sleep mode allows one engine per process."""
    from rlix.exec.vllm_backend import VllmRolloutBackend

    made = []

    def make(lora=None):
        b = VllmRolloutBackend(lora=lora, options=OPTS)
        b.prepare(str(model_dir), "cuda")
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def _req(traj_id=0, n=24, temperature=1.0, adapter="", seed=7):
    return GenRequest(traj_id=traj_id, prompt_ids=(1, 5, 6, 7, 8), max_new_tokens=n, temperature=temperature, seed=seed, adapter=adapter)


def test_generate_sleep_wake_and_weight_sync(model_dir, make_backend):
    b = make_backend()
    b.wake(None)
    r = b.generate(_req())
    assert r.finished and not r.aborted and len(r.token_ids) == len(r.logprobs) > 0
    assert all(lp <= 0 for lp in r.logprobs)
    free_awake = torch.cuda.mem_get_info()[0]
    b.sleep()
    assert not b.awake and torch.cuda.mem_get_info()[0] > free_awake  # weights and KV cache released
    slept = b.generate(_req())
    assert slept.aborted and slept.token_ids == ()
    # level 2 dropped the weights: waking needs the trainer's snapshot (here: the checkpoint's, v0)
    with pytest.raises(ValueError, match="snapshot"):
        b.wake(None)
    b.wake(snapshot_of(load_model(model_dir), 0))
    before = b.generate(_req(temperature=1e-5))
    b.sleep()
    model = load_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    b.wake(snapshot_of(model, 3))
    assert b.weight_version == 3
    after = b.generate(_req(temperature=1e-5))
    assert after.weight_version == 3 and after.token_ids != before.token_ids
    b.sleep()


def test_abort_returns_partial_tokens_and_continuation_finishes(model_dir, make_backend):
    b = make_backend()
    b.wake(None)
    req = GenRequest(traj_id=1, prompt_ids=(1, 5), max_new_tokens=200, temperature=1.0, seed=3)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", b.generate(req)))
    t.start()
    time.sleep(0.05)
    b.sleep()
    t.join(timeout=30)
    partial = out["r"]
    if partial.finished:  # finished before the abort landed (EOS early): nothing to continue
        return
    assert partial.aborted
    b.wake(snapshot_of(load_model(model_dir), 0))
    rest = b.generate(continuation(req, partial))
    assert rest.finished and rest.token_ids[: len(partial.token_ids)] == partial.token_ids


def test_lora_adapters_served_per_request(model_dir, make_backend):
    b = make_backend(SPEC)
    learner = LoraLearner(str(model_dir), "cpu", SPEC, {n: GrpoConfig(seed=s) for n, s in SPEC.adapters})
    b.wake(learner.snapshot(), tuple(learner.adapter_snapshot(n) for n in SPEC.names))
    base = b.generate(_req(adapter="a", temperature=1e-5))
    with torch.no_grad():  # give adapter "a" a large, non-zero B so it changes the output
        for name, p in learner.model.named_parameters():
            if ".lora_B.a." in name:
                p.copy_(torch.randn_like(p))
    learner.adapters["a"].version = 1
    b.update_adapter(learner.adapter_snapshot("a"))
    assert b.adapter_versions["a"] == 1 and b.adapter_versions["b"] == 0
    tuned = b.generate(_req(adapter="a", temperature=1e-5))
    other = b.generate(_req(adapter="b", temperature=1e-5))
    assert tuned.weight_version == 1 and other.weight_version == 0
    assert other.token_ids == base.token_ids  # b untouched
    assert tuned.token_ids != base.token_ids
    b.sleep()
    b.wake(learner.snapshot(), tuple(learner.adapter_snapshot(n) for n in SPEC.names))  # resumed: all adapters back
    assert b.adapter_versions["a"] == 1
    assert b.generate(_req(adapter="a", temperature=1e-5)).token_ids == tuned.token_ids
    b.sleep()


def test_two_jobs_share_one_gpu_with_vllm(tmp_path):
    from rlix.exec import api
    from rlix.exec.records import JobStatus, SwitchKind

    model = {"size": {"arch": "qwen2", "hidden_size": 256, "num_layers": 2, "num_heads": 4, "intermediate_size": 512, "seed": 0}}
    common = dict(
        model=model, rollout_backend="vllm", vllm={"gpu_memory_utilization": 0.15}, prompts_per_step=16, group_size=8, max_new_tokens=16, slots_per_worker=48,
        roles={"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
    )
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "scheduler": {"min_residency_s": 1.0},
        "output": {"dir": str(tmp_path / "out"), "console": False},
        "jobs": [
            dict(name="full", steps=4, task={"name": "copy", "max_len": 12}, **common),
            dict(
                name="lora", kind="multi_lora", lora={"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
                adapters=[{"name": "a", "steps": 3, "seed": 1, "algo": {"lr": 1e-3}}, {"name": "b", "task": {"name": "reverse"}, "steps": 3, "seed": 2, "algo": {"lr": 1e-3}}],
                checkpoint_dir=str(tmp_path / "ck"), **common,
            ),
        ],
    }
    out = api.run(parse_config(raw), out_dir=str(tmp_path / "out"))
    assert out.metrics.trajectories_lost == 0
    for pid, r in out.results.items():
        assert r.status is JobStatus.FINISHED, (pid, r.error)
        assert all(0.0 <= s.mean_reward <= 1.0 for s in r.steps)
        kinds = {s.kind for s in r.switches}
        assert SwitchKind.SLEEP in kinds and SwitchKind.WAKE in kinds  # one GPU: every gang stage shrinks rollout
    assert sorted({s.stream for s in out.results["lora"].steps}) == ["a", "b"]
    assert all((tmp_path / "ck" / n / "state.pt").is_file() for n in ("a", "b"))
    assert Path(out.files["trace"]).is_file()
