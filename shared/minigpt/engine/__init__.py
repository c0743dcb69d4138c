"""The engine: the loops that turn a model and a cache into generated tokens.

* `cached_generation` (lab 01): prefill once, then one-token decode steps on a KV cache.
* `cuda_graph` (lab 01, GPU tier): a fixed-shape decode step replayed from a CUDA graph.
* `paged_generation` (lab 02): a batch of prompts generated together on the paged KV cache.
* lab 03 adds requests and sequences, the continuous-batching scheduler and the batched runner;
  lab 06 adds speculative decoding.
"""
