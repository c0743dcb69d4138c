"""A draft head (lab 06, part two): EAGLE's drafter, one decoder layer that reads the target's own features.

The target's feature at position t is f_t = norm(h_t), the vector its LM head turns into the logits of token t+1.
The head learns to run one position ahead in feature space (Li et al. 2024, EAGLE):

    f^_t   = Block(W_in [f_{t-1} ; e(x_t)], position t)          W_in (2d -> d), one target-shaped decoder layer
    q_t    = softmax(lm_head(norm(f^_t)))                          the target's own embedding e and LM head, shared

Drafting a chain: feed (f_{t-1}, x_t) with the target's real f_{t-1}, take x_{t+1} from q_t, then feed (f^_t, x_{t+1}),
its own predicted feature standing in for the target's, and so on. The head has its own one-layer KV cache over the
pairs it was fed (its position t holds the pair (f_{t-1}, x_t); position 0 has no pair). It stores only its own weights
(`save_draft_head`): the embedding and LM head are the target's, handed in at every call.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from minigpt.attention import resolve_attention
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.checkpoint import STORAGE_DTYPE, CheckpointError, checkpoint_paths, sha256_file
from minigpt.config import ModelConfig
from minigpt.model import GPT, Block, LayerCache, RMSNorm, default_linear, rope_angles

__all__ = ["DraftHead", "target_features", "head_cache", "tree_attention", "with_attention", "save_draft_head",
           "load_draft_head"]


class DraftHead(nn.Module):
    """One decoder layer shaped like the target's, over [feature ; token embedding] (see the module docstring)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.block = Block(config, 0, default_linear, resolve_attention("sdpa"))
        self.norm = RMSNorm(d, config.norm_eps)

    def forward(self, features: Tensor, tokens: Tensor, target: GPT, positions: Tensor,
                kv_cache: KVCache | LayerCache | None = None) -> tuple[Tensor, Tensor]:
        """features (B, T, d): f_{t-1}; tokens (B, T): x_t; positions (T,) or (B, T): t; kv_cache: `head_cache`'s
        one-layer cache (or its layer).

        Returns (f^ (B, T, d), logits (B, T, V)): the predicted features f^_t and the draft logits for x_{t+1}.
        """
        x = self.fc(torch.cat([features.to(self.fc.weight.dtype), target.tok_emb(tokens).to(self.fc.weight.dtype)], -1))
        angles = rope_angles(positions, self.config.head_dim, self.config.rope_theta, self.config.rope_scaling)
        layer = kv_cache if kv_cache is None or isinstance(kv_cache, LayerKVCache) else kv_cache[0]   # a KVCache: its layer
        predicted = self.norm(self.block(x, angles, layer))
        return predicted, target.lm_head(predicted.to(target.lm_head.weight.dtype))


def target_features(target: GPT, tokens: Tensor, positions: Tensor | None = None,
                    kv_caches: Sequence[LayerCache] | None = None) -> tuple[Tensor, Tensor]:
    """The target's forward, returning (features f = norm(h) (B, T, d), logits (B, T, V)); logits as `target(...)`.

    The features are what the LM head reads: taken from the target's final norm by a forward hook, so that the
    forward is exactly the model's own (its attention function, caches and checks included).
    """
    seen: list[Tensor] = []
    hook = target.norm.register_forward_hook(lambda _module, _inputs, out: seen.append(out))
    try:
        logits = target(tokens, positions=positions, kv_caches=kv_caches)
    finally:
        hook.remove()
    return seen[-1], logits


def head_cache(head: DraftHead, max_seq_len: int) -> KVCache:
    """A one-layer contiguous KV cache for the head (float32, batch 1)."""
    return KVCache.for_model(dataclasses.replace(head.config, n_layers=1), batch_size=1, max_seq_len=max_seq_len,
                             dtype=head.fc.weight.dtype)


def tree_attention(mask: Tensor):
    """An attention function (q, k, v) -> out that lets query i see key j where mask[i, j] (mask (Tq, Tk) bool)."""
    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if tuple(mask.shape) != (q.shape[2], k.shape[2]):
            raise ValueError(f"tree mask {tuple(mask.shape)} does not match {q.shape[2]} queries and {k.shape[2]} keys")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return attend


@contextmanager
def with_attention(blocks: Sequence[Block], attention) -> Iterator[None]:
    """Run `blocks` with another attention function for the duration, then put each block's own back."""
    saved = [block.attn.attention for block in blocks]
    for block in blocks:
        block.attn.attention = attention
    try:
        yield
    finally:
        for block, fn in zip(blocks, saved):
            block.attn.attention = fn


def save_draft_head(head: DraftHead, name: str, card: dict) -> None:
    """data/checkpoints/<name>.safetensors (the head's own weights, bfloat16) and <name>.json (config, card, sha256)."""
    weights, card_path = checkpoint_paths(name)
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(STORAGE_DTYPE).contiguous() for k, v in head.state_dict().items()}, str(weights))
    full = {**card, "config": head.config.to_dict(), "file": weights.name, "bytes": weights.stat().st_size,
            "sha256": sha256_file(weights), "parameters": sum(p.numel() for p in head.parameters())}
    card_path.write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")


def load_draft_head(name: str = "draft-head", *, dtype: torch.dtype = torch.float32) -> DraftHead:
    """The stored head, checked against its card's sha256, in `dtype`, in eval mode."""
    weights, card_path = checkpoint_paths(name)
    if not weights.exists() or not card_path.exists():
        raise CheckpointError(f"draft head {name!r} not found at {weights}; `make models` trains it")
    card = json.loads(card_path.read_text(encoding="utf-8"))
    if sha256_file(weights) != card["sha256"]:
        raise CheckpointError(f"{weights} does not match the sha256 in {card_path.name}; restore it from git")
    head = DraftHead(ModelConfig.from_dict(card["config"]))
    head.load_state_dict({k: v.to(dtype) for k, v in load_file(str(weights)).items()})
    return head.to(dtype).eval()
