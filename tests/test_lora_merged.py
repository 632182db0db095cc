"""rlix.weightsync.lora_merged: a PEFT LoRA model published as its base model's merged weights, which an
engine of the base model loads and serves as the PEFT model computes (TRL's ``peft_config``)."""

from __future__ import annotations

import copy
import re

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from rlix.exec.data.model import ModelSize, build_model, load_model  # noqa: E402
from rlix.weightsync.buckets import load_into, publish_of  # noqa: E402
from rlix.weightsync.lora_merged import MergedLora, merged_state  # noqa: E402

SIZE = ModelSize(arch="qwen2", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(SIZE, tmp_path_factory.mktemp("lora_merged"))


def trained_peft(model_dir, **config):
    """A PEFT LoRA model whose adapters have moved off their zero start (as after some training)."""
    base = load_model(model_dir)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], lora_dropout=0.0, **config)
    model = peft.get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_the_merged_weights_are_peft_s_own_merge_under_the_base_models_names(model_dir):
    model = trained_peft(model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(want) == set(load_model(model_dir).state_dict())
    for name, tensor in want.items():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        load_model(model_dir).state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # out of place: the trained model is as it was
    untouched = model.get_base_model().model.layers[0].self_attn.k_proj.weight
    assert merged["model.layers.0.self_attn.k_proj.weight"].data_ptr() == untouched.data_ptr()  # no copy where no adapter
    assert merged["lm_head.weight"].data_ptr() == merged["model.embed_tokens.weight"].data_ptr()  # tied weights stay tied


def test_an_engine_of_the_base_model_serves_what_the_peft_model_computes(model_dir):
    model = trained_peft(model_dir).eval()
    engine = load_model(model_dir).eval()
    load_into(engine, publish_of(MergedLora(model), 3, "float32"), "cpu")
    ids = torch.tensor([[1, 5, 6, 7, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(engine(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
        with model.disable_adapter():  # the base alone differs: the adapters are in what was loaded
            assert not torch.allclose(engine(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-3)


def test_a_module_peft_trains_whole_replaces_the_base_module(model_dir):
    model = trained_peft(model_dir, modules_to_save=["down_proj"])
    merged = merged_state(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(want)
    trained = model.get_base_model().model.layers[1].mlp.down_proj.modules_to_save["default"].weight
    assert torch.equal(merged["model.layers.1.mlp.down_proj.weight"], trained)
    assert torch.allclose(merged["model.layers.1.mlp.down_proj.weight"], want["model.layers.1.mlp.down_proj.weight"])


def test_only_the_active_adapters_copy_of_a_module_is_published(model_dir):
    model = trained_peft(model_dir, modules_to_save=["down_proj"])
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.0, modules_to_save=["down_proj"])
    model.add_adapter("other", cfg)
    wrapper = model.get_base_model().model.layers[1].mlp.down_proj
    with torch.no_grad():
        wrapper.modules_to_save["other"].weight.fill_(2.0)
    for active in ("default", "other"):
        model.set_adapter(active)
        want = wrapper.modules_to_save[active].weight
        assert torch.equal(merged_state(model)["model.layers.1.mlp.down_proj.weight"], want), active


@pytest.mark.parametrize(
    ("adapter", "message"),
    [
        ("dora", "adapter 'default' uses DoRA (use_dora=True), which the rollout engine's merge does not cover; set it False"),
        ("ia3", "adapter 'default' is IA3; only LoRA adapters are merged for the rollout engine"),
        ("lora_bias", "adapter 'default' sets lora_bias, which the rollout engine's merge does not cover; leave it unset"),
        ("tied_lm_head", "an adapter changes the input embedding or the output layer, which this model ties together"),
        ("tied_embedding", "an adapter changes the input embedding or the output layer, which this model ties together"),
    ],
)
def test_adapters_the_merge_does_not_cover_are_refused_in_one_line(model_dir, adapter, message):
    if adapter == "ia3":
        cfg = peft.IA3Config(target_modules=["q_proj", "down_proj"], feedforward_modules=["down_proj"])
        model = peft.get_peft_model(load_model(model_dir), cfg)
    else:
        options = {
            "dora": {"use_dora": True},
            "lora_bias": {"lora_bias": True},
            "tied_lm_head": {"modules_to_save": ["lm_head"]},
            "tied_embedding": {"target_modules": ["q_proj", "embed_tokens"]},
        }[adapter]
        base = load_model(model_dir)
        assert base.config.tie_word_embeddings
        cfg = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "lora_dropout": 0.0, **options})
        model = peft.get_peft_model(base, cfg)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        merged_state(model)
    assert "\n" not in str(err.value)
