"""KV caches: where the keys and values of past tokens live between steps.

* `contiguous` (lab 01): one preallocated (batch, max_seq_len, kv_heads, head_dim) buffer per layer.
* lab 02, the paged cache: `block_pool` (free queue, ref counts, `OutOfBlocks`), `block_table`
  (slot mapping), `prefix_cache` (chained block hashes, LRU reuse), `block_manager` (sequences,
  copy-on-write forks, prefix reuse), `paged_attention` (pure-PyTorch reference, decode and prefill)
  and `paged` (`PagedKVCache`: per-layer block pools serving a batch of sequences).
* `rollback` (lab 06): `truncate_cache`, forgetting the positions of rejected draft tokens.
* lab 13, the hierarchy: `radix_cache` (`RadixCache`: prefixes as runs of blocks in a radix tree, LRU eviction of
  unreferenced leaves), `radix_manager` (the engine's `prefix_cache="radix"`), `cache_aware` (longest cached prefix
  first, with a starvation bound), `tiers` (`TieredStore`: host and file tiers of evicted blocks), `host_loader`
  (copies back into the pool, overlapped: `HostLoader`, `restore_prefix`), `trace_replay` and `admission_replay`
  (a trace replayed against a bounded pool, no model).
"""
