"""A PEFT LoRA model's weights as a rollout engine of its base model serves them: each active adapter
merged in, out of place.

A trainer that fine-tunes with PEFT (TRL's ``peft_config``) trains adapters on a
frozen base; an engine that loaded the base checkpoint takes the merged full
weights under the base model's own names::

    weights = publish_of(MergedLora(peft_model), version, "bfloat16")

Nothing in the trained model changes: each merged weight is the base weight plus
the adapters' deltas (``B @ A`` times their scaling), computed into a new tensor,
so the trainer's base weights never take the rounding of a merge and an unmerge.
A weight no adapter touches is the base tensor itself (tied weights stay tied).
PEFT's ``modules_to_save`` copies replace the modules they copy.
"""

from __future__ import annotations

__all__ = ["MergedLora", "merged_state"]


class MergedLora:
    """What :func:`~rlix.weightsync.buckets.publish_of` reads of a PEFT model: its merged state dict (computed
    once, on the first call)."""

    def __init__(self, peft_model) -> None:
        self.model = peft_model
        self._state: dict | None = None

    def state_dict(self) -> dict:
        if self._state is None:
            self._state = merged_state(self.model)
        return self._state


def merged_state(peft_model) -> dict:
    """``peft_model``'s base model state dict with its active LoRA adapters merged in (detached tensors)."""
    import torch
    from peft.tuners.lora import LoraLayer

    refuse_unmergeable(peft_model)
    base = peft_model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            active = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if active:
                deltas[name] = active
    state = {}
    with torch.no_grad():
        for key, value in base.state_dict().items():
            name = _base_name(base, key)
            if name is None:
                continue
            module = key.rpartition(".base_layer.")[0]
            if key.endswith(".base_layer.weight") and module in deltas:
                layer = base.get_submodule(module)
                value = value + sum(layer.get_delta_weight(a).to(value.dtype) for a in deltas[module])
            state[name] = value.detach()
    return state


def _base_name(base, key: str) -> str | None:
    """The base model's name of a PEFT state-dict key; None for an adapter's own tensor, for the original
    of a module that ``modules_to_save`` replaces, and for the copies of adapters not active."""
    if ".lora_" in key or ".original_module." in key:
        return None
    if ".modules_to_save." in key:
        head, _, rest = key.partition(".modules_to_save.")
        adapter, _, leaf = rest.partition(".")
        return f"{head}.{leaf}" if adapter == base.get_submodule(head).active_adapter else None
    return key.replace(".base_layer.", ".")


NOT_COVERED = "the rollout engine's merge does not cover"
UNCOVERED = ("lora_bias", "trainable_token_indices", "target_parameters", "alora_invocation_tokens")


def refuse_unmergeable(peft_model) -> None:
    """One line if ``peft_model`` holds an adapter this merge does not cover: not plain LoRA, DoRA, a LoRA
    option of :data:`UNCOVERED`, or an adapted embedding tied to the output layer."""
    from peft import PeftType

    for name, config in getattr(peft_model, "peft_config", {}).items():
        if config.peft_type != PeftType.LORA:
            kind = getattr(config.peft_type, "value", config.peft_type)
            raise ValueError(f"adapter '{name}' is {kind}; only LoRA adapters are merged for the rollout engine")
        if getattr(config, "use_dora", False):
            raise ValueError(f"adapter '{name}' uses DoRA (use_dora=True), which {NOT_COVERED}; set it False")
        for option in UNCOVERED:
            if getattr(config, option, None):
                raise ValueError(f"adapter '{name}' sets {option}, which {NOT_COVERED}; leave it unset")
    _refuse_tied(peft_model.get_base_model())


def _refuse_tied(base) -> None:
    """An adapted input embedding or output layer, when the two are tied, cannot be published as one tensor."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    if not getattr(base.config, "tie_word_embeddings", False):
        return
    for module in (base.get_input_embeddings(), base.get_output_embeddings()):
        if isinstance(module, (LoraLayer, ModulesToSaveWrapper)):
            raise ValueError(
                "an adapter changes the input embedding or the output layer, which this model ties together; "
                "leave both out of target_modules and modules_to_save"
            )
