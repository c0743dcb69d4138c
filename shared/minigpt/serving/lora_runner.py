"""Multi-LoRA in the engine (lab 08): ONE model step serves requests that ask for different adapters.

Lab 03's ModelRunner packs every scheduled token into one row (1, N). This runner gives each token row the
adapter index of the request its chunk belongs to, so the LoRA linears (`minigpt.serving.lora`) add each
row's own delta inside the same batched step:

    chunks   seq a (adapter 2): 5 prefill tokens | seq b (none): 1 decode | seq c (adapter 0): 1 decode
    indices  [2, 2, 2, 2, 2, -1, 0]                                  (1, N): one per packed token row

In the padded layout the index is per sequence (B,). A step whose requests all use the base model skips
the LoRA matmuls entirely (indices None), as vLLM does.

    runner = LoRAModelRunner(with_lora(model, adapters), cache)     # request.adapter: -1 = base model
    engine = engine_with_adapters(model, adapters, EngineConfig(...), tokenizer=enc)   # an LLMEngine
    engine.add_request("r1", prompt, 32, adapter=adapters.index("sql"))   # the server: model="sql"

Prefix caching and adapters: the same prompt has different K/V under each adapter, so cached blocks may only
be shared between requests of the SAME adapter (vLLM salts the block hash with the LoRA id; here
`BlockManager.add_sequence(..., salt=)`). The builder keeps prefix caching on only if the engine's scheduler
salts by adapter (`salts_by_adapter`), and turns it off otherwise: slower, never wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import Tensor

from minigpt.cache.paged import PagedKVCache
from minigpt.engine.request import Sequence
from minigpt.engine.runner import Layout, ModelRunner
from minigpt.engine.scheduler import ScheduledChunk
from minigpt.model import GPT
from minigpt.serving.lora import LoRAAdapters, LoRADeltaFn, lora_delta, using_adapters, with_lora

__all__ = ["request_adapter", "step_adapter_indices", "LoRAModelRunner", "lora_runner_factory", "engine_with_adapters"]


def request_adapter(seq: Sequence) -> int:
    """The adapter a sequence's request asks for: `request.adapter`, -1 (base model) if it has none."""
    return int(getattr(seq.request, "adapter", -1))


def step_adapter_indices(chunks: list[ScheduledChunk], layout: Layout,
                         adapter_of: Callable[[Sequence], int] = request_adapter) -> Tensor | None:
    """Adapter index of every row the step computes: (1, N) per packed token, or (B,) per padded sequence;
    None if no chunk uses an adapter (the step then costs exactly the base model's)."""
    adapters = [adapter_of(c.seq) for c in chunks]
    if all(a < 0 for a in adapters):
        return None
    per_seq = torch.tensor(adapters, dtype=torch.long)
    if layout == "padded":
        return per_seq
    lens = torch.tensor([len(c.tokens) for c in chunks])
    return per_seq.repeat_interleave(lens)[None]


class LoRAModelRunner(ModelRunner):
    """ModelRunner over a model built by `with_lora`: each step sets the adapter index of every row from its
    request (`adapter_of`, default `request.adapter`), then runs lab 03's single model call."""

    def __init__(self, model: GPT, cache: PagedKVCache, layout: Layout = "packed", *,
                 adapter_of: Callable[[Sequence], int] = request_adapter) -> None:
        if getattr(model, "lora_selection", None) is None:
            raise ValueError("LoRAModelRunner needs a model built by minigpt.serving.lora.with_lora(model, adapters)")
        super().__init__(model, cache, layout)
        self.adapter_of = adapter_of
        self.num_lora_steps = 0            # steps that ran the LoRA matmuls (some request had an adapter)

    def forward(self, chunks: list[ScheduledChunk]) -> Tensor:
        indices = step_adapter_indices(chunks, self.layout, self.adapter_of)
        self.num_lora_steps += indices is not None
        with using_adapters(self.model, indices):
            return super().forward(chunks)


def lora_runner_factory(adapters: LoRAAdapters, *, delta_fn: LoRADeltaFn = lora_delta,
                        layout: Layout = "packed") -> Callable[[GPT, PagedKVCache], LoRAModelRunner]:
    """`runner_factory` for LLMEngine: wraps the engine's (possibly quantized) model with the adapters
    (a copy: the caller's model is left untouched) and returns the LoRA runner over the engine's cache."""
    def make(model: GPT, cache: PagedKVCache) -> LoRAModelRunner:
        return LoRAModelRunner(with_lora(model, adapters, delta_fn=delta_fn), cache, layout)
    return make


def engine_with_adapters(model: GPT, adapters: LoRAAdapters, config: Any = None, *,
                         delta_fn: LoRADeltaFn = lora_delta, **kwargs: Any) -> Any:
    """An LLMEngine (minigpt.serving.engine) serving `model` and its adapters: `adapter_names` = adapters.names (what
    a request's `model` field may name), the LoRA runner with `delta_fn`; kwargs go to LLMEngine (tokenizer, ...)."""
    from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
    from minigpt.serving.engine import EngineConfig, LLMEngine

    config = EngineConfig() if config is None else config
    if config.enable_prefix_caching and not getattr(PrefixCachingScheduler, "salts_by_adapter", False):
        config = dataclasses.replace(config, enable_prefix_caching=False)     # never share K/V across adapters
    return LLMEngine(model, config, adapter_names=adapters.names, runner_factory=lora_runner_factory(adapters, delta_fn=delta_fn), **kwargs)
