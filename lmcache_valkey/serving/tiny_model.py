"""A Llama-shaped model with random weights and a tokenizer trained here, saved as a
Hugging Face directory that ``vllm serve`` loads with ``HF_HUB_OFFLINE=1`` (nothing is
downloaded). The weights are seeded: the same arguments give the same bytes, so two servers
started on two copies compute the same KV cache.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

# Words of a maintenance manual: the demo's long prefix is made of them.
WORDS = (
    "the valve pump manual section pressure check replace torque bolt seal gasket flow rate sensor "
    "alarm reset panel filter clean inspect cycle motor bearing oil level shaft coupling warning "
    "caution step figure table maintenance schedule daily weekly monthly annual operator must "
    "before after during start stop drain fill open close tighten loosen measure record limit "
    "maximum minimum normal fault code display power supply cable connector ground fuse relay "
    "switch lamp indicator hose clamp fitting nozzle tank reservoir level gauge temperature "
    "cooling fan belt tension pulley gear lubricate grease interval hours service technician"
).split()


@dataclass(frozen=True)
class TinyModel:
    """Shape of the model; the defaults serve 16K-token prompts on two cores."""

    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    intermediate: int = 512
    max_positions: int = 65536
    seed: int = 0

    def stamp(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def manual_text(n_words: int, seed: int = 0) -> str:
    """Deterministic manual-like text of ``n_words`` words."""
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def make_model(path: str | os.PathLike, spec: TinyModel = TinyModel()) -> Path:
    """Write the model to ``path`` unless it already holds this very spec; returns ``path``."""
    out = Path(path)
    stamp = out / "lmcache-valkey-tiny-model.json"
    if stamp.exists() and stamp.read_text() == spec.stamp():
        return out
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([manual_text(60, seed) for seed in range(3000)], trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": spec.max_positions,
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }))
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim, max_position_embeddings=spec.max_positions, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, torch_dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(out))
    stamp.write_text(spec.stamp())
    return out


def vocab_size(path: str | os.PathLike) -> int:
    return int(json.loads((Path(path) / "config.json").read_text())["vocab_size"])


def encode(path: str | os.PathLike, text: str) -> list[int]:
    """``text`` as token ids by the model's own tokenizer."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json")).encode(text).ids
