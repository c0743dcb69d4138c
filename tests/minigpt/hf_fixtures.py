"""Random Llama-family checkpoints written by `transformers` itself (nothing downloaded), for the parity tests.

`write_random_llama(folder, ...)` saves a seeded random `LlamaForCausalLM` (untied head, GQA, llama3 RoPE
scaling by default) in bf16 or fp16, sharded into several safetensors files with their index, plus a small
byte-level BPE tokenizer.json trained here with `tokenizers` and a tokenizer_config.json with a chat template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # everything here is local: never ask the Hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}{{ '<|eot_id|>' }}"
                 "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
TRAINING_TEXT = ["def add(a, b):\n    return a + b\n", "Once upon a time there was a small model.",
                 "The quick brown fox jumps over the lazy dog. " * 3, "for i in range(10):\n    print(i * i)\n",
                 "Hello world! Bonjour le monde. 你好, 世界. Ünïcödé ✓"] * 4


def train_tokenizer(vocab_size: int = 320):
    """A byte-level BPE (GPT-2 alphabet, so any text encodes) with BOS added in front, like Llama 3's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS, EOT, "<|start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def write_random_llama(folder: Path, *, seed: int = 0, layers: int = 3, hidden: int = 64, heads: int = 4,
                       kv_heads: int = 2, ffn: int = 160, dtype: torch.dtype = torch.bfloat16, tie: bool = False,
                       rope_scaling: dict | None = "llama3", max_position_embeddings: int = 256,
                       shard_size: str = "60KB") -> Path:
    """Save a random LlamaForCausalLM and a tokenizer into `folder`; returns the folder."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    if rope_scaling == "llama3":     # original context 32: head_dim 16 has short, blended and long wavelengths
        rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 32}
    eos = [tok.token_to_id(EOS), tok.token_to_id(EOT)]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_position_embeddings,
                      rms_norm_eps=1e-5, rope_theta=50_000.0, rope_scaling=rope_scaling, tie_word_embeddings=tie,
                      bos_token_id=tok.token_to_id(BOS), eos_token_id=eos[0])
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():                 # weights large enough that greedy choices are clear, not near-ties
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=eos)
    model.to(dtype).save_pretrained(folder, max_shard_size=shard_size)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOT,
        "model_max_length": max_position_embeddings, "chat_template": CHAT_TEMPLATE}, indent=1))
    return folder
