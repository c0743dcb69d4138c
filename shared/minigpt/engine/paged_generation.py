"""Generation on the paged KV cache (lab 02): a batch of prompts of different lengths, stepped together.

Each step runs ONE forward over every unfinished sequence (the first step prefills all prompts, padded
to the longest; later steps decode one token each). A sequence that stops is freed at once and leaves
the batch. Every sequence samples with its own generator (`make_generator(sampling)`), so each result
is token-identical to `generate_kv_cache` on that prompt alone.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.cache.paged import PagedBatch, PagedKVCache
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.cuda_graph import using_attention
from minigpt.generate import FinishReason, Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

__all__ = ["paged_forward", "generate_paged", "generate_paged_batch"]


def paged_forward(model: GPT, cache: PagedKVCache, batch: PagedBatch, attention: AttentionFn | None = None) -> Tensor:
    """One step of the model on the paged cache: logits (B, V) at each sequence's last new token.
    `attention` replaces the reference paged attention (e.g. a learner's), same arguments as
    `minigpt.cache.paged_attention.paged_attention`."""
    if attention is None:
        fn = cache.attention(batch)
    else:
        def fn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return attention(q, k.transpose(1, 2), v.transpose(1, 2), batch.block_tables, batch.seq_lens, batch.q_lens)
    with using_attention(model, fn):
        logits = model(batch.tokens, positions=batch.positions, kv_caches=cache.layers(batch))
    return batch.last_logits(logits)


@torch.inference_mode()
def generate_paged_batch(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         sampling: SamplingParams = SamplingParams(), *, stop_token_ids: Sequence[int] = (EOT_ID,),
                         stop_strings: Sequence[str] = (), tokenizer: object | None = None, block_size: int = 16,
                         num_blocks: int | None = None, cache: PagedKVCache | None = None,
                         attention: AttentionFn | None = None) -> list[Generation]:
    """Generate for every prompt at once on a paged cache; returns one Generation per prompt, in order.

    By default the cache has just enough blocks for every sequence's prompt + max_new_tokens. A given
    `cache` must hold no sequence with the ids 0..len(prompts)-1 (they are used as sequence ids).
    """
    ids = [check_request(model, p, max_new_tokens) for p in prompts]
    if not ids:
        return []
    if cache is None:
        if num_blocks is None:
            num_blocks = sum(blocks_needed(len(p) + max_new_tokens, block_size) for p in ids)
        cache = PagedKVCache.for_model(model, num_blocks, block_size)
    stops = [StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer) for _ in ids]
    generators = [make_generator(sampling, model.device) for _ in ids]
    reasons: list[FinishReason | None] = ["length" if max_new_tokens == 0 else None for _ in ids]
    pending = {i: ids[i] for i in range(len(ids)) if reasons[i] is None}      # seq id -> tokens to feed next
    try:
        while pending:
            batch = cache.prepare(list(pending.items()))
            logits = paged_forward(model, cache, batch, attention)
            for row, i in enumerate(batch.seq_ids):
                token = int(sample_next(logits[row:row + 1], sampling, generators[i]))
                reasons[i] = stops[i].add(token)
                if reasons[i] is None:
                    pending[i] = [token]
                else:
                    del pending[i]
                    cache.free(i)
    finally:
        for i in pending:
            if i in cache.manager.tables:
                cache.free(i)
    return [Generation(s.tokens, r, prompt_tokens=len(p)) for s, r, p in zip(stops, reasons, ids)]


def generate_paged(model: GPT, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                   **kwargs: object) -> Generation:
    """One prompt on a paged cache (same arguments as `generate_kv_cache`, plus those of `generate_paged_batch`)."""
    return generate_paged_batch(model, [prompt], max_new_tokens, sampling, **kwargs)[0]
