"""What only a GPU shows about the vLLM rollout backend (skipped without CUDA and vllm).

Sleep mode releases the engine's GPU memory (level 2: weights and KV cache
dropped; level 1: weights offloaded to CPU memory) and wake brings the engine
back serving. Everything else about the backend (generation and log-probs
against the torch backend, weight sync, abort and continue, LoRA, tensor
parallelism, two jobs under Ray) is in tests/test_exec_vllm.py, which runs on
the CPU build as well.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from rlix.exec.data.model import ModelSize, build_model, load_model
from rlix.exec.rollout.torch_backend import GenRequest, VllmOptions
from rlix.weightsync.buckets import publish_of

SIZE = ModelSize(arch="qwen2", hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, seed=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(SIZE, tmp_path_factory.mktemp("gpu_model"))


@pytest.mark.parametrize("level", [2, 1])
def test_sleep_releases_gpu_memory_and_wake_serves_again(model_dir, level):
    from rlix.exec.rollout.vllm_backend import VllmRolloutBackend

    b = VllmRolloutBackend(options=VllmOptions(gpu_memory_utilization=0.2, sleep_level=level, max_model_len=256))
    b.prepare(str(model_dir), "cuda")
    try:
        b.wake(None)
        req = GenRequest(traj_id=0, prompt_ids=(1, 5, 6, 7, 8), max_new_tokens=16, temperature=1e-5, seed=7)
        before = b.generate(req)
        free_awake = torch.cuda.mem_get_info()[0]
        b.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        assert not b.awake and free_asleep > free_awake  # KV cache (and level 2: weights) released
        b.wake(publish_of(load_model(model_dir), 0))
        assert torch.cuda.mem_get_info()[0] < free_asleep  # mapped back
        assert b.generate(req).token_ids == before.token_ids
    finally:
        b.close()  # vLLM's sleep-mode allocator serves one engine per process
