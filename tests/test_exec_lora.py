"""Multi-LoRA in process (no Ray): adapters trained together match each trained alone.

Per-adapter state is independent (own seed-drawn init, own optimizer over its
own parameters, own version), and the rollout engine serves every adapter
per request, so putting adapters side by side changes nothing for any one.
"""

from __future__ import annotations

import pytest

from rlix.exec.config import JobConfig

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]

ADAPTERS = [
    {"name": "copy_a", "task": {"name": "copy", "max_len": 8}, "steps": 3, "seed": 3, "algo": {"lr": 5e-3}},
    {"name": "rev_b", "task": {"name": "reverse", "max_len": 8}, "steps": 3, "seed": 4, "algo": {"lr": 2e-3}},
]


def _job(adapters, **extra) -> JobConfig:
    return JobConfig.model_validate(
        dict(
            name="lora",
            kind="multi_lora",
            model={"size": {"seed": 0}},
            adapters=adapters,
            lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            prompts_per_step=4,
            group_size=4,
            max_new_tokens=10,
            roles={"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
            **extra,
        )
    )


def test_adapters_together_equal_adapters_alone(tmp_path):
    from local_run import run_local_lora

    together = run_local_lora(_job(ADAPTERS), tmp_path)
    assert [s.loss for s in together["copy_a"]] != [s.loss for s in together["rev_b"]]
    for a in ADAPTERS:
        alone = run_local_lora(_job([a]), tmp_path)[a["name"]]
        assert [s.loss for s in together[a["name"]]] == [s.loss for s in alone]
        assert [s.mean_reward for s in together[a["name"]]] == [s.mean_reward for s in alone]
        assert len(alone) == 3


def test_adapter_checkpoint_resumes_where_it_stopped(tmp_path):
    from local_run import run_local_lora

    one = [dict(ADAPTERS[0], steps=4)]
    straight = run_local_lora(_job(one), tmp_path)["copy_a"]
    ck = tmp_path / "ck"
    first = run_local_lora(_job([dict(one[0], steps=2)], checkpoint_dir=str(ck)), tmp_path)["copy_a"]
    assert (ck / "copy_a" / "state.pt").is_file()
    rest = run_local_lora(_job(one, checkpoint_dir=str(ck)), tmp_path)["copy_a"]
    assert [s.step for s in rest] == [2, 3]
    assert [s.loss for s in first + rest] == pytest.approx([s.loss for s in straight], rel=1e-6, abs=1e-9)


def test_stop_reward_ends_an_adapter_early(tmp_path):
    from local_run import run_local_lora

    out = run_local_lora(_job([dict(ADAPTERS[0], steps=5, stop_reward=0.0)]), tmp_path)
    assert len(out["copy_a"]) == 1


def test_vllm_adapter_files_are_peft_format_and_base_names_are_hf(tmp_path):
    """What the vLLM backend hands vLLM (checked with peft/transformers, no vllm needed)."""
    import torch
    from local_run import delivered
    from peft import PeftModel

    from rlix.exec.data.model import load_model
    from rlix.exec.rollout.vllm_backend import hf_base_weights, write_peft_adapter
    from rlix.exec.train.grpo import GrpoConfig
    from rlix.exec.train.lora import LoraLearner

    job = _job(ADAPTERS)
    model_dir = job.model.directory(tmp_path)
    spec = job.lora_spec()
    learner = LoraLearner(str(model_dir), "cpu", spec, {n: GrpoConfig(seed=s) for n, s in spec.adapters})
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if ".lora_B.copy_a." in name:
                p.copy_(torch.randn_like(p))
    learner.adapters["copy_a"].version = 1
    snapshot = delivered(learner.adapter_snapshot("copy_a"))  # as a vLLM worker receives it
    path = write_peft_adapter(snapshot, spec, str(model_dir), tmp_path / "copy_a-v1")
    served = PeftModel.from_pretrained(load_model(model_dir), str(path)).eval()
    x = torch.tensor([[1, 5, 6, 7]])
    learner.model.set_adapter("copy_a")
    with torch.no_grad():
        assert torch.allclose(served(input_ids=x).logits, learner.model(input_ids=x).logits, atol=1e-5)
    base = load_model(model_dir)
    missing, unexpected = base.load_state_dict(hf_base_weights(learner.snapshot().tensors), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing)  # the tied head follows the embeddings
