"""Cached generation (lab 01): one prefill over the prompt, then one-token decode steps on a KV cache."""

from __future__ import annotations

from typing import Sequence

import torch

from minigpt.cache.contiguous import KVCache
from minigpt.generate import FinishReason, Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

__all__ = ["generate_kv_cache"]


@torch.inference_mode()
def generate_kv_cache(model: GPT, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                      *, stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                      tokenizer: object | None = None, cache: KVCache | None = None) -> Generation:
    """Generate with a KV cache: one prefill over the prompt, then one-token decode steps.

    Same arguments, sampling and stopping rules as `minigpt.generate.generate_naive`, so the greedy
    output is identical token for token. `cache` (optional) must be empty; by default one sized for
    prompt + max_new_tokens positions is allocated.
    """
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    if cache is None:
        cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(ids) + max_new_tokens)
    elif cache.length != 0:
        raise ValueError(f"generate_kv_cache needs an empty cache, this one holds {cache.length} positions; call cache.reset()")
    reason: FinishReason | None = "length" if max_new_tokens == 0 else None
    tokens = torch.tensor([ids], device=model.device)                     # prefill: the whole prompt
    while reason is None:
        logits = model(tokens, positions=cache.next_positions(tokens.shape[1]), kv_caches=cache)[:, -1]   # (1, V)
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]], device=model.device)             # decode: only the new token
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))
