"""Executor layer: tiny standard HF models and a tokenizer made in code.

Nothing is downloaded: a job names either a local checkpoint directory or a
size to build with random weights (Qwen2 or Llama architecture) plus a
character-level tokenizer. Built models are saved to a directory and loaded
back with the very ``from_pretrained`` calls a real checkpoint would use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Characters the code-made tokenizer knows, one token each: newline and printable ASCII (space to '~').
# Any other character (accents, other scripts, emoji) becomes UNK, counted when the data is prepared.
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Version of the code-made tokenizer, kept in its tokenizer_config.json and in a built model's
# marker: a model directory built with another version is built again.
TOKENIZER_VERSION = 2


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    """A random-weight model to build; sizes in units of the HF config."""

    arch: str  # "qwen2" | "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    seed: int = 0


def build_tokenizer(out_dir: Path):
    """A character-level fast tokenizer saved under ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2, UNK: 3}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        rlix_tokenizer=TOKENIZER_VERSION,  # load_tokenizer's sign to load it as saved
    )
    fast.save_pretrained(str(out_dir))
    return fast


def build_model(size: ModelSize, out_dir: Path) -> Path:
    """Build a random-weight model + tokenizer in ``out_dir``; returns the directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / "rlix_size.json"
    wanted = json.dumps({**size.__dict__, "tokenizer": TOKENIZER_VERSION}, sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return out_dir  # already built with this exact size, seed and tokenizer (nothing imported)
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = build_tokenizer(out_dir)
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[size.arch]
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    quiet_transformers()
    torch.manual_seed(size.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(out_dir))
    marker.write_text(wanted)
    return out_dir


def quiet_transformers() -> None:
    """No download/progress bars in worker logs."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def load_model(path: str | Path, device: str = "cpu", dtype: str = "float32"):
    """Load a causal LM exactly as a user's checkpoint would be loaded, its weights in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return model.to(device)


def pad_token_id(config) -> int:
    """The token id a batch pads with: the checkpoint's ``pad_token_id``, else its end-of-sequence id (many
    checkpoints, Llama 3 and Qwen2.5 among them, name no pad token; a padded position is masked, so any
    id the vocabulary has will do), else 0."""
    for pad in (config.pad_token_id, config.eos_token_id):
        pad = pad[0] if isinstance(pad, list | tuple) and pad else pad
        if isinstance(pad, int):
            return pad
    return 0


def load_tokenizer(path: str | Path):
    """A checkpoint's tokenizer as ``AutoTokenizer`` loads it; the code-made one exactly as saved.

    (For a qwen2 config, ``AutoTokenizer`` would rebuild the code-made tokenizer as a byte-level BPE,
    which has no token for a space or any character outside the vocabulary and drops them.)
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(path) / "tokenizer_config.json"
    if cfg.is_file() and "rlix_tokenizer" in json.loads(cfg.read_text()):
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def meta_model(path: str | Path):
    """A checkpoint's model built from its config.json on the meta device (no weights read, no memory taken)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    quiet_transformers()
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path), trust_remote_code=False))


def module_names(path: str | Path) -> list[str]:
    """The module names of a checkpoint's model (:func:`meta_model`)."""
    return [name for name, _ in meta_model(path).named_modules()]


def missing_targets(targets: list[str] | tuple[str, ...], names: list[str]) -> list[str]:
    """The LoRA ``targets`` no module of ``names`` is: peft matches a module whose name is the target or
    ends in ``.`` and the target."""
    return [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
