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
    forward_passes: int = 0
    forced_tokens: int = 0          # tokens taken from the grammar's forced text, not sampled


@torch.inference_mode()
def generate_constrained(model: GPT, prompt: Sequence[int], automaton: Automaton, trie: TokenTrie, *,
                         max_new_tokens: int, sampling: SamplingParams | None = None, constrain: bool = True,
                         masks: Callable[[Any], torch.Tensor] | None = None,
                         forced: Callable[[str], list[int]] | None = None,
                         jump_forward: bool = False) -> ConstrainedGeneration:
    """Decode up to `max_new_tokens` after `prompt`, masking the logits at every step with `masks(state)` (default:
    `mask_by_trie`; a `token_cache.ContextCache(grammar, trie).mask` gives the same masks from its cache).

    `forced` (a tokenizer's encode; grammars only): where the grammar admits one continuation
    (`Grammar.forced_text`), take the tokens of that text as `forced` tokenizes it, alone, instead of sampling them
    (no token spans the boundary, so the whole output need not be canonically tokenized: llguidance trims the last
    forced tokens a boundary-spanning token could replace, and this does not). The automaton reads the forced text
    itself, not its tokens' texts: a non-ASCII character is several byte-piece tokens, none a character alone. Without
    `jump_forward` they still go through the model one a pass; with it (SGLang's jump-forward decoding) they all go
    into the next forward pass together, so the output is the same tokens in fewer passes."""
    masks = masks or (lambda state: mask_by_trie(automaton, state, trie))
    sampling = sampling or SamplingParams()
    vocab = trie.vocab
    generator = make_generator(sampling, model.device)
    cache = KVCache.for_model(model, 1, max_seq_len=len(prompt) + max_new_tokens)
    x = torch.tensor([list(prompt)], device=model.device)
    state: Any = automaton.start_state()
    tokens: list[int] = []
    pieces: list[str] = []
    mask_s = model_s = 0.0
    stopped = "length"
    passes = forced_count = 0
    plan: list[int] = []                     # forced tokens still to emit
    plan_text = ""                           # the text they spell (read by the automaton once all are emitted)
    while len(tokens) < max_new_tokens:
        if constrain and forced is not None and not plan and state is not None:
            t0 = time.perf_counter()
            text = automaton.forced_text(state)
            plan, plan_text = _forced_plan(forced, text, max_new_tokens - len(tokens)) if text else ([], "")
            mask_s += time.perf_counter() - t0
            if plan and jump_forward:            # no pass for them: they ride with the next one
                forced_count += len(plan)
                tokens += plan
                state = _read(plan_text, pieces, automaton, state)
                x = torch.cat([x, torch.tensor([plan], device=model.device)], dim=1)
                plan = []
                continue
        t0 = time.perf_counter()
        logits = model(x, positions=cache.next_positions(x.shape[1]), kv_caches=cache)[:, -1].float()
        passes += 1
        model_s += time.perf_counter() - t0
        if plan:                                  # forced, one token a pass: the logits are not used
            new, plan = plan[:1], plan[1:]
            forced_count += 1
            tokens += new
            if not plan:                          # a token may be part of a character: read the text at the end
                state = _read(plan_text, pieces, automaton, state)
            x = torch.tensor([new], device=model.device)
            continue
        if constrain:
            t1 = time.perf_counter()
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
        new = [token]
        state = _append(new, tokens, pieces, vocab, automaton, state)
        x = torch.tensor([new], device=model.device)
    return ConstrainedGeneration(tokens, "".join(pieces), automaton.accepting(state), stopped, mask_s, model_s,
                                 passes, forced_count)


def _forced_plan(forced: Callable[[str], list[int]], text: str, budget: int) -> tuple[list[int], str]:
    """The tokens of the forced `text` (`forced` tokenizes it alone) and the text they spell; where they are more than
    `budget`, the longest prefix of the text whose tokens fit (whole characters: a multi-byte character's byte
    pieces are all taken or none)."""
    plan = forced(text)
    cut = len(text)
    while len(plan) > budget and cut > 0:
        cut -= 1
        plan = forced(text[:cut])
    return plan, text[:cut]


def _read(text: str, pieces: list[str], automaton: Automaton, state: Any) -> Any:
    """Record forced `text` and return the automaton's state after it."""
    pieces.append(text)
    return automaton.walk(state, text) if state is not None else None


def _append(new: list[int], tokens: list[int], pieces: list[str], vocab: Any, automaton: Automaton, state: Any) -> Any:
    """Record `new` tokens and return the automaton's state after their texts (None once it left the language)."""
    for token in new:
        tokens.append(token)
        text = vocab.texts[token]
        pieces.append(text if text is not None else "\ufffd")
        state = automaton.walk(state, text) if state is not None and text is not None else None
    return state
