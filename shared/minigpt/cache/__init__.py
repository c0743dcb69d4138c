"""KV caches: where the keys and values of past tokens live between steps.

* `contiguous` (lab 01): one preallocated (batch, max_seq_len, kv_heads, head_dim) buffer per layer.
* `rollback` (lab 06): `truncate_cache`, forgetting the positions of rejected draft tokens.
* lab 02 adds the paged cache: a pool of fixed-size blocks, per-sequence block tables, paged
  attention, copy-on-write forks and a prefix cache.
"""
