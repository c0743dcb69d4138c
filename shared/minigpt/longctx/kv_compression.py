"""KV-cache bytes per token for the attention variants: MHA -> GQA -> MQA -> MLA-style latent KV.

    kv_bytes_per_token("GQA", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, bytes_per_element=2)

Per layer and token a cache stores
    MHA  2 * n_heads * head_dim           (a key and a value per query head)
    GQA  2 * n_kv_heads * head_dim        (query heads share n_kv_heads K/V heads)
    MQA  2 * head_dim                     (one K/V head for all)
    MLA  kv_lora_rank + rope_dim          (DeepSeek-V2: one latent vector c_KV, from which every head's K and V
                                           are projected back up, plus one decoupled RoPE key shared by the heads)
elements. MLA's up-projections can be folded into the query and output projections at inference, so the
latent is all that is cached and read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "KVLayout", "LAYOUTS", "kv_elements_per_token_layer", "kv_bytes_per_token", "kv_bytes"]

KINDS = ("MHA", "GQA", "MQA", "MLA")


def kv_elements_per_token_layer(kind: str, n_heads: int, n_kv_heads: int, head_dim: int,
                                kv_lora_rank: int = 0, rope_dim: int = 0) -> int:
    """Cached elements for one token in one layer (see the module docstring)."""
    if kind == "MHA":
        return 2 * n_heads * head_dim
    if kind == "GQA":
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"GQA needs n_kv_heads dividing n_heads, got {n_kv_heads} and {n_heads}")
        return 2 * n_kv_heads * head_dim
    if kind == "MQA":
        return 2 * head_dim
    if kind == "MLA":
        if kv_lora_rank < 1:
            raise ValueError("MLA needs kv_lora_rank >= 1 (the latent width)")
        return kv_lora_rank + rope_dim
    raise ValueError(f"unknown attention kind {kind!r}; choose one of {KINDS}")


def kv_bytes_per_token(kind: str, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int,
                       bytes_per_element: int, kv_lora_rank: int = 0, rope_dim: int = 0) -> int:
    """Cache bytes for one token, all layers."""
    return n_layers * bytes_per_element * kv_elements_per_token_layer(kind, n_heads, n_kv_heads, head_dim,
                                                                      kv_lora_rank, rope_dim)


@dataclass(frozen=True)
class KVLayout:
    """A published model's attention shape, as far as its KV cache is concerned."""

    name: str
    kind: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0
    rope_dim: int = 0
    source: str = ""

    def bytes_per_token(self, bytes_per_element: int = 2) -> int:
        return kv_bytes_per_token(self.kind, self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
                                  bytes_per_element, self.kv_lora_rank, self.rope_dim)


def kv_bytes(layout: KVLayout, context_len: int, batch: int = 1, bytes_per_element: int = 2) -> int:
    """Cache bytes of `batch` requests of `context_len` tokens."""
    return layout.bytes_per_token(bytes_per_element) * context_len * batch


# From the models' config.json on Hugging Face (and the DeepSeek-V2 paper, arXiv 2405.04434, section 2.1).
LAYOUTS: dict[str, KVLayout] = {
    "Llama-2-7B (MHA)": KVLayout("Llama-2-7B (MHA)", "MHA", 32, 32, 32, 128, source="meta-llama/Llama-2-7b-hf"),
    "Llama-3-8B (GQA)": KVLayout("Llama-3-8B (GQA)", "GQA", 32, 32, 8, 128, source="meta-llama/Meta-Llama-3-8B"),
    "Llama-3-70B (GQA)": KVLayout("Llama-3-70B (GQA)", "GQA", 80, 64, 8, 128, source="meta-llama/Meta-Llama-3-70B"),
    "Llama-3-8B as MQA (hypothetical)": KVLayout("Llama-3-8B as MQA (hypothetical)", "MQA", 32, 32, 1, 128),
    "DeepSeek-V2 as MHA (hypothetical)": KVLayout("DeepSeek-V2 as MHA (hypothetical)", "MHA", 60, 128, 128, 128),
    "DeepSeek-V2 (MLA)": KVLayout("DeepSeek-V2 (MLA)", "MLA", 60, 128, 128, 128, kv_lora_rank=512, rope_dim=64,
                                  source="deepseek-ai/DeepSeek-V2: kv_lora_rank 512, qk_rope_head_dim 64, 60 layers"),
}
