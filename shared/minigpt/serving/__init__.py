"""Serving (lab 08): the engine behind an OpenAI-compatible HTTP server, with metrics, backpressure,
multi-LoRA batching, a prefix-aware router and a load generator.

* `lora` (multi-LoRA): adapters as stacked low-rank factors per projection, A (n, r, d_in), B (n, d_out, r);
  `lora_delta`, the batched LoRA matmul (Punica's BGMV: gather each row's factors, two batched matmuls,
  -1 = no adapter); `with_lora` wraps a model's projections, `using_adapters` sets the rows' adapters,
  `merge_adapter` (W + s B_a A_a) is the reference; safetensors save/load. `lora_runner`: lab 03's runner
  giving each packed token row its request's adapter, so one step serves many adapters. `lora_bench`:
  adapter bytes (100 adapters on one base) and the measured cost of batched LoRA.
"""
