"""Constrained decoding: the model's next-token distribution with every token the automaton refuses set to -inf
(lab 10, on lab 01's cached loop).

    out = generate_constrained(model, prompt, compile_json_schema(schema), trie, max_new_tokens=64)
    out.text, out.complete          # what was generated; whether the automaton accepts it (a whole document)
    out.mask_seconds, out.model_seconds     # where the time went: masks against forward passes

`constrain=False` runs the same loop without the mask (the baseline whose validity must be measured, not assumed);
its `complete` then says whether the text happens to be in the language. Decoding ends at the end-of-text token
(allowed only where the automaton accepts), at `max_new_tokens`, or, constrained, where no token is allowed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from minigpt.cache.contiguous import KVCache
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.structured.token_masks import Automaton, TokenTrie, mask_by_trie

__all__ = ["ConstrainedGeneration", "generate_constrained"]


@dataclass(frozen=True)
class ConstrainedGeneration:
    tokens: list[int]
    text: str
    complete: bool                  # the automaton accepts the text
    stopped: str                    # "end" (end-of-text chosen), "length", or "no token" (nothing allowed)
    mask_seconds: float
    model_seconds: float


@torch.inference_mode()
def generate_constrained(model: GPT, prompt: Sequence[int], automaton: Automaton, trie: TokenTrie, *,
                         max_new_tokens: int, sampling: SamplingParams | None = None, constrain: bool = True,
                         masks: Callable[[Any], torch.Tensor] | None = None) -> ConstrainedGeneration:
    """Decode up to `max_new_tokens` after `prompt`, masking the logits at every step with `masks(state)` (default:
    `mask_by_trie`; a `token_cache.ContextCache(grammar, trie).mask` gives the same masks from its cache)."""
    masks = masks or (lambda state: mask_by_trie(automaton, state, trie))
    sampling = sampling or SamplingParams()
    vocab = trie.vocab
    generator = make_generator(sampling, model.device)
    cache = KVCache.for_model(model, 1, max_seq_len=len(prompt) + max_new_tokens)
    x = torch.tensor([list(prompt)], device=model.device)
    state: Any = automaton.start_state() if hasattr(automaton, "start_state") else automaton.start
    tokens: list[int] = []
    pieces: list[str] = []
    mask_s = model_s = 0.0
    stopped = "length"
    for _ in range(max_new_tokens):
        t0 = time.perf_counter()
        logits = model(x, positions=cache.next_positions(x.shape[1]), kv_caches=cache)[:, -1].float()
        t1 = time.perf_counter()
        model_s += t1 - t0
        if constrain:
            allowed = masks(state).to(logits.device)
            mask_s += time.perf_counter() - t1
            if not allowed.any():
                stopped = "no token"
                break
            logits = logits.masked_fill(~allowed, float("-inf"))
        token = int(sample_next(logits, sampling, generator))
        if token == vocab.eos_id:
            stopped = "end"
            break
        tokens.append(token)
        text = vocab.texts[token]
        pieces.append(text if text is not None else "\ufffd")
        state = automaton.walk(state, text) if state is not None and text is not None else None
        x = torch.tensor([[token]], device=model.device)
    return ConstrainedGeneration(tokens, "".join(pieces), automaton.accepting(state), stopped, mask_s, model_s)
