"""The engine: the loops that turn a model and a cache into generated tokens.

* `cached_generation` (lab 01): prefill once, then one-token decode steps on a KV cache.
* `cuda_graph` (lab 01, GPU tier): a fixed-shape decode step replayed from a CUDA graph.
* `paged_generation` (lab 02): a batch of prompts generated together on the paged KV cache.
* lab 03, continuous batching: `request` (Request, Sequence and its states), `scheduler` (iteration-level
  scheduling: token budget, chunked prefill, preemption by recomputation), `packed_batch` (the packed
  varlen layout and its paged attention), `runner` (one model call for mixed prefill chunks and decodes,
  packed or padded), `serving_loop` (arrivals, clock, step records), `baselines` (sequential, static and
  dynamic batching), `metrics` (TTFT, TPOT, ITL, percentiles, goodput).
* `speculative` (lab 06): draft k tokens, verify them in one target forward, accept with min(1, p/q),
  resample from the normalised residual max(0, p - q), bonus token; greedy variant; `ngram_draft`:
  prompt-lookup drafting (no draft model), as a `Drafter` or behind the model protocol (`PromptLookupModel`).
* `prefix_scheduler` (lab 08): the continuous-batching scheduler admitting from the prefix cache.
"""
