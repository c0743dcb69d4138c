"""The engine: the loops that turn a model and a cache into generated tokens.

* `cached_generation` (lab 01): prefill once, then one-token decode steps on a KV cache.
* `cuda_graph` (lab 01, GPU tier): a fixed-shape decode step replayed from a CUDA graph.
* lab 03 adds requests and sequences, the continuous-batching scheduler and the batched runner.
* `speculative` (lab 06): draft k tokens, verify them in one target forward, accept with min(1, p/q),
  resample from the normalised residual max(0, p - q), bonus token; greedy variant; `ngram_draft`:
  prompt-lookup drafting (no draft model).
"""
