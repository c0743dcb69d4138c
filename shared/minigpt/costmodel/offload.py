"""Load or recompute (lab 13): lab 00's arithmetic for KV kept in a slower tier.

A cached prefix of L tokens that was evicted from GPU memory to host memory or to a file can be brought back in two
ways:

    load        latency + kv_bytes(L) / link_bandwidth                  bytes over a link (PCIe, NVMe)
    recompute   prefill_flops(L) / (peak * mfu)                          the prefill again, on the GPU

kv_bytes grows linearly in L and prefill FLOPs a little faster (attention's share grows with L), while the load pays
a fixed latency: short prefixes are cheaper to recompute, long ones to load, and the crossover is the shortest L
at which loading wins (`crossover_tokens`). Where the link is slow against the GPU, loading may never win, and a
hierarchical cache only adds work: what users of such caches run into when they see no gain.

Links are nominal figures, named with their source; `mfu` is the share of peak a prefill reaches (about half is
usual for a good kernel at these sizes: a parameter, not a fact).
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.costmodel.calculators import ModelShape, kv_bytes_per_token, prefill_flops
from minigpt.costmodel.hardware import Accelerator

__all__ = ["Link", "LINKS", "load_seconds", "recompute_seconds", "should_load", "crossover_tokens"]

GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float          # bytes/s, one direction
    latency: float            # s per transfer started
    source: str


LINKS = {
    # PCIe 5.0: 32 GT/s a lane, 128b/130b encoding, 16 lanes: 32e9 * 128/130 * 16 / 8 = 63.0 GB/s a direction.
    "PCIe 5.0 x16": Link("PCIe 5.0 x16", 32e9 * 128 / 130 * 16 / 8, 10e-6,
                         "PCI-SIG PCIe 5.0 base specification (32 GT/s, 128b/130b); latency: an order of magnitude"),
    # PCIe 4.0: 16 GT/s a lane: 31.5 GB/s a direction over 16 lanes.
    "PCIe 4.0 x16": Link("PCIe 4.0 x16", 16e9 * 128 / 130 * 16 / 8, 10e-6,
                         "PCI-SIG PCIe 4.0 base specification (16 GT/s, 128b/130b); latency: an order of magnitude"),
    # One NVMe SSD on PCIe 4.0 x4 (7.9 GB/s of link); datasheets of such drives give about 7 GB/s sequential reads.
    "NVMe SSD (PCIe 4.0 x4)": Link("NVMe SSD (PCIe 4.0 x4)", 7.0 * GB, 100e-6,
                                   "drive datasheets, sequential read about 7,000 MB/s; read latency about 100 us"),
}


def load_seconds(shape: ModelShape, tokens: int, link: Link, bytes_per_element: int = 2) -> float:
    """Time to bring `tokens` tokens of KV back over `link`: latency + bytes / bandwidth (0 for no tokens)."""
    if tokens <= 0:
        return 0.0
    return link.latency + tokens * kv_bytes_per_token(shape, bytes_per_element) / link.bandwidth


def recompute_seconds(shape: ModelShape, tokens: int, accelerator: Accelerator, *, precision: str = "bf16",
                      mfu: float = 0.5) -> float:
    """Time to prefill `tokens` tokens again at `mfu` of the accelerator's peak."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    return prefill_flops(shape, tokens) / (accelerator.peak(precision) * mfu) if tokens > 0 else 0.0


def should_load(shape: ModelShape, tokens: int, link: Link, accelerator: Accelerator, **kwargs) -> bool:
    """Whether loading `tokens` cached tokens over `link` beats recomputing them (ties recompute: no transfer)."""
    return load_seconds(shape, tokens, link) < recompute_seconds(shape, tokens, accelerator, **kwargs)


def crossover_tokens(shape: ModelShape, link: Link, accelerator: Accelerator, *, limit: int = 1 << 20,
                     **kwargs) -> int | None:
    """The shortest prefix (tokens) from which loading beats recomputing, by bisection up to `limit`; None when
    loading does not win even at `limit` (the load's per-token cost above the recompute's)."""
    if not should_load(shape, limit, link, accelerator, **kwargs):
        return None
    lo, hi = 0, limit                   # should_load(lo) is False (0 tokens: nothing to load), should_load(hi) True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if should_load(shape, mid, link, accelerator, **kwargs) else (mid, hi)
    return hi
