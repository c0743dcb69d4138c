"""Slower tiers for evicted KV blocks (lab 13): host memory, then files, loaded back asynchronously.

When the GPU pool evicts a cached block, its keys and values need not be lost: `TieredStore.put` copies them to a
host tier (a bounded LRU of tensors); a host tier that overflows spills its least recently used block to a file tier
(safetensors files in a directory, bounded too; the oldest file is deleted when it overflows). A later request whose
prefix was evicted asks `load(key)`, which returns a `Future` at once: a worker thread copies the block back while
the caller computes something else, and the caller must wait for the future before it reads the block (a load read
before it lands would attend to garbage). Whether to load at all or recompute is lab 00's arithmetic
(`minigpt.costmodel.offload`).

Keys are whatever names a block's content (lab 02's chained block hash); a block is (k, v), each
(layers, block_size, kv_heads, head_dim). Writes copy (a caller may reuse its tensors); loads return fresh tensors.
"""

from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Hashable

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

__all__ = ["TieredStore"]

Block = tuple[Tensor, Tensor]


class TieredStore:
    """Host tier of `host_blocks` blocks, optionally a file tier of `file_blocks` in `directory` (a temporary one by
    default, removed by `close`); one loader thread by default."""

    def __init__(self, host_blocks: int, file_blocks: int = 0, directory: str | Path | None = None,
                 loaders: int = 1) -> None:
        for name, value in (("host_blocks", host_blocks), ("file_blocks", file_blocks), ("loaders", loaders)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name != "file_blocks" else 0):
                raise ValueError(f"{name} must be an int >= {1 if name != 'file_blocks' else 0}, got {value!r}")
        self.host_blocks, self.file_blocks = host_blocks, file_blocks
        self._host: OrderedDict[Hashable, Block] = OrderedDict()
        self._files: OrderedDict[Hashable, Path] = OrderedDict()
        self._tmp = tempfile.TemporaryDirectory(prefix="kv-tier-") if file_blocks and directory is None else None
        self.directory = Path(directory if directory is not None else self._tmp.name) if file_blocks else None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=loaders, thread_name_prefix="kv-load")
        self._serial = 0
        self.stats = {"put": 0, "spilled": 0, "dropped": 0, "host_hits": 0, "file_hits": 0}

    def where(self, key: Hashable) -> str | None:
        """"host", "file" or None."""
        with self._lock:
            return "host" if key in self._host else "file" if key in self._files else None

    def __contains__(self, key: Hashable) -> bool:
        return self.where(key) is not None

    def put(self, key: Hashable, k: Tensor, v: Tensor) -> None:
        """Keep a copy of an evicted block in the host tier (most recently used), spilling the host tier's least
        recently used block to the file tier, or dropping it, when the host tier is full."""
        block = (k.detach().to("cpu", copy=True), v.detach().to("cpu", copy=True))
        with self._lock:
            self.stats["put"] += 1
            self._host.pop(key, None)
            self._drop_file(key)
            self._host[key] = block
            while len(self._host) > self.host_blocks:
                old, old_block = self._host.popitem(last=False)
                self._spill(old, old_block)

    def _spill(self, key: Hashable, block: Block) -> None:
        if not self.file_blocks:
            self.stats["dropped"] += 1
            return
        self._serial += 1
        path = self.directory / f"block-{self._serial}.safetensors"
        save_file({"k": block[0].contiguous(), "v": block[1].contiguous()}, str(path))
        self._files[key] = path
        self.stats["spilled"] += 1
        while len(self._files) > self.file_blocks:
            _, old = self._files.popitem(last=False)
            old.unlink(missing_ok=True)
            self.stats["dropped"] += 1

    def _drop_file(self, key: Hashable) -> None:
        path = self._files.pop(key, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def load(self, key: Hashable) -> Future:
        """A Future of the block (k, v) as fresh tensors, read by a loader thread; KeyError at once when no tier holds
        `key`. The block stays in its tier (and becomes the host tier's most recently used)."""
        with self._lock:
            if key in self._host:
                self._host.move_to_end(key)
                block = self._host[key]
                self.stats["host_hits"] += 1
                return self._pool.submit(lambda: (block[0].clone(), block[1].clone()))
            if key in self._files:
                self._files.move_to_end(key)
                path = self._files[key]
                self.stats["file_hits"] += 1

                def read() -> Block:
                    with self._lock:             # a put that drops this file waits until it is read
                        data = load_file(str(path))
                    return data["k"], data["v"]
                return self._pool.submit(read)
        raise KeyError(f"no tier holds block {key!r}")

    def close(self) -> None:
        """Stop the loader threads and delete the files (a temporary directory with them)."""
        self._pool.shutdown(wait=True)
        with self._lock:
            for path in self._files.values():
                path.unlink(missing_ok=True)
            self._files.clear()
            self._host.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
