"""Rolling a KV cache back (lab 06): forget the positions of rejected draft tokens.

Speculative decoding writes K/V for tokens that may be rejected. Rolling back is only bookkeeping on
the contiguous cache: positions [length, old_length) stay in the buffer but are never read again
and are overwritten by the next write (`LayerKVCache.update` writes at `length`).

On lab 02's paged cache the same operation also returns every block that no longer holds a kept
position to the free pool: a sequence of `length` positions keeps ceil(length / block_size) blocks.
"""

from __future__ import annotations

from minigpt.cache.contiguous import KVCache

__all__ = ["truncate_cache"]


def truncate_cache(cache: KVCache, length: int) -> None:
    """Keep positions [0, length) of every layer; the next write goes at `length`.

    Raises ValueError, changing nothing, unless 0 <= length <= cache.length (a cache cannot grow by
    truncation: positions past its length were never written).
    """
    current = cache.length
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= current:
        raise ValueError(f"truncate_cache: length must be an int in [0, {current}] (the cache holds {current} "
                         f"positions), got {length!r}")
    for layer in cache:
        layer.length = length
