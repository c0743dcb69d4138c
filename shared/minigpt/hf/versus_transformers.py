"""The course's decoding against transformers' on the same weights: tokens/s, one process, interleaved, medians.

    figures = decode_vs_transformers(load_model("target"), load_model("draft"), prompts, new_tokens=32)
    figures["tokens_per_s"]      # {"course cached": ..., "transformers generate": ..., "course speculative": ...,
                                 #  "transformers assisted": ...}

Four candidates, greedy, each generating exactly `new_tokens` tokens for every prompt (no EOS stop):
lab 01's `generate_kv_cache` against `model.generate`, and lab 06's `generate_speculative` (k drafts per
round) against transformers' assisted generation with the same draft (`assistant_model`, k assistant
tokens per round, constant schedule, its confidence early-exit off, so both draft exactly k). The four
outputs must be the same tokens; timings go through `minigpt.timing.compare` (warm-up, rotated order).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.speculative import generate_speculative
from minigpt.model import GPT
from minigpt.timing import compare

__all__ = ["decode_vs_transformers", "CANDIDATES"]

CANDIDATES = ("course cached", "transformers generate", "course speculative", "transformers assisted")


def _peer(model: GPT, k: int | None = None) -> Any:
    from minigpt.hf.export import to_transformers

    hf = to_transformers(model)
    hf.generation_config.update(do_sample=False, eos_token_id=None, pad_token_id=0)   # exactly max_new_tokens, greedy
    if k is not None:                                   # as an assistant: exactly k drafts per round
        hf.generation_config.num_assistant_tokens = k
        hf.generation_config.num_assistant_tokens_schedule = "constant"
        hf.generation_config.assistant_confidence_threshold = 0.0
    return hf


def decode_vs_transformers(target: GPT, draft: GPT | None, prompts: Sequence[Sequence[int]], *, new_tokens: int = 32,
                           k: int = 4, repeats: int = 5, threads: int = 1,
                           candidates: Sequence[str] = CANDIDATES) -> dict[str, Any]:
    """Time the candidates over all `prompts` (batch 1 each); tokens/s, the ratios between them and whether
    every candidate produced the same tokens. Without a draft, pass only the first two candidates."""
    if unknown := set(candidates) - set(CANDIDATES):
        raise ValueError(f"unknown candidates {sorted(unknown)}; choose from {CANDIDATES}")
    if draft is None and set(candidates) - set(CANDIDATES[:2]):
        raise ValueError("speculative candidates need a draft model")
    hf_target = _peer(target)
    hf_draft = _peer(draft, k) if draft is not None and "transformers assisted" in candidates else None
    device = target.device

    def hf_run(p: Sequence[int], **kw: Any) -> list[int]:
        x = torch.tensor([list(p)], device=device)
        return hf_target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, **kw)[0, len(p):].tolist()

    every = {
        "course cached": lambda: [generate_kv_cache(target, p, new_tokens, stop_token_ids=()).tokens for p in prompts],
        "transformers generate": lambda: [hf_run(p) for p in prompts],
        "course speculative": lambda: [generate_speculative(target, draft, p, new_tokens, k=k, stop_token_ids=()).tokens
                                       for p in prompts],
        "transformers assisted": lambda: [hf_run(p, assistant_model=hf_draft) for p in prompts],
    }
    runs = {name: every[name] for name in candidates}
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()     # assisted generation warns about its own internal call on every run
    try:
        with torch.inference_mode():
            outputs = {name: fn() for name, fn in runs.items()}
            first = next(iter(outputs.values()))
            timings = compare(runs, warmup=1, repeats=repeats, threads=threads, device=device)
    finally:
        hf_logging.set_verbosity(verbosity)
    n = new_tokens * len(prompts)
    tps = {name: n / t.median for name, t in timings.items()}
    ratios = {"cached_over_generate": ("course cached", "transformers generate"),
              "speculative_over_cached": ("course speculative", "course cached"),
              "assisted_over_generate": ("transformers assisted", "transformers generate"),
              "speculative_over_assisted": ("course speculative", "transformers assisted")}
    return {
        "tokens_per_s": tps,
        "spread": {name: t.spread for name, t in timings.items()},
        **{r: tps[a] / tps[b] for r, (a, b) in ratios.items() if a in tps and b in tps},
        "tokens_identical": all(out == first for out in outputs.values()),
        "settings": {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts], "new_tokens": new_tokens,
                     "k": k, "repeats": repeats, "threads": threads, "device": str(device), "dtype": str(target.dtype)},
    }
