"""Lab 13's interview questions: each answer needs the lab's reasoning applied to a case the notebook does not run;
each likely mistake is diagnosed, the expected value never shown."""

from __future__ import annotations

import dataclasses
from typing import Any

from autograder.harness import check_answer
from minigpt.cache.block_pool import BlockPool
from minigpt.cache.radix_cache import RadixCache
from minigpt.costmodel.calculators import PRESETS, kv_bytes_per_token, prefill_flops
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.offload import LINKS

H100 = ACCELERATORS["H100-SXM"]
Q1 = dict(model="Llama-3-70B", link="PCIe 4.0 x16", tokens=2048, mfu=0.5)
Q2 = dict(model="Llama-2-7B (MHA)", link="NVMe SSD (PCIe 4.0 x4)", tokens=4096, mfu=0.5)


def _ratio(model: str, link: str, tokens: int, mfu: float, *, kv_heads: int | None = None, kv_factor: float = 1.0,
           latency: bool = True) -> float:
    """Recompute seconds over load seconds for `tokens` of a prefix (above 1: loading wins)."""
    shape = PRESETS[model]
    if kv_heads is not None:
        shape = dataclasses.replace(shape, n_kv_heads=kv_heads)
    lk = LINKS[link]
    load = (lk.latency if latency else 0.0) + tokens * kv_bytes_per_token(shape) * kv_factor / lk.bandwidth
    return prefill_flops(shape, tokens) / (H100.peak("bf16") * mfu) / load


def check_q1_load_speedup(answer: Any) -> None:
    """Llama-3-70B in bf16 on an H100 SXM (mfu 0.5), host tier over PCIe 4.0 x16: recompute time over load time for
    a 2,048-token cached prefix."""
    check_answer(answer, _ratio(**Q1), "Q1 (recompute over load time, Llama-3-70B, 2,048 tokens, PCIe 4.0 x16)",
                 [(_ratio(**Q1, kv_heads=64), "Llama-3-70B has 8 KV heads (GQA): its cache holds 8 heads, not 64."),
                  (_ratio(**Q1, kv_factor=0.5), "the cache holds K AND V."),
                  (_ratio(**{**Q1, "mfu": 1.0}), "the prefill runs at mfu 0.5 of the peak, not at the peak."),
                  (1 / _ratio(**Q1), "the question asks recompute / load (above 1: loading is faster).")],
                 unit="x", rel=1e-4,
                 hint="load = latency + tokens * kv_bytes_per_token / bandwidth; recompute = prefill_flops / "
                      "(bf16 peak * mfu); answer = recompute / load.")


def check_q2_mha_from_nvme(answer: Any) -> None:
    """Llama-2-7B (multi-head attention: 32 KV heads) in bf16 on an H100 SXM (mfu 0.5), its evicted prefix on one NVMe
    SSD (7 GB/s, 100 us): recompute time over load time for a 4,096-token prefix."""
    check_answer(answer, _ratio(**Q2), "Q2 (recompute over load time, Llama-2-7B MHA from an NVMe SSD, 4,096 tokens)",
                 [(_ratio(**Q2, kv_heads=8), "Llama-2-7B is multi-head: 32 KV heads, 4x the KV of a GQA model of its "
                                             "size."),
                  (_ratio(**Q2, kv_factor=0.5), "the cache holds K AND V."),
                  (_ratio(**{**Q2, "link": "PCIe 5.0 x16"}), "the prefix comes from the NVMe SSD, not host memory."),
                  (1 / _ratio(**Q2), "the question asks recompute / load (below 1: recomputing is faster).")],
                 unit="x", rel=1e-4,
                 hint="Same rule as Q1, with this model's KV bytes per token and this link.")


Q3_PROMPTS = ("ABCDE", "ABCXY", "ABZ")


def _nodes(prompts: tuple[str, ...] = Q3_PROMPTS) -> int:
    """Nodes below the root of the package's RadixCache (blocks of one token) after inserting `prompts` in order."""
    pool = BlockPool(32, 1)
    tree = RadixCache(pool)
    for prompt in prompts:
        tokens = [ord(c) for c in prompt]
        hit = tree.match(tokens)
        table = hit + pool.allocate(len(tokens) - len(hit))
        tree.insert(tokens, table)
    return len(tree.nodes())


def check_q3_radix_nodes(answer: Any) -> None:
    """A radix cache, one letter a full block, gets three inserts in this order: A B C D E, then A B C X Y, then
    A B Z. How many nodes (edges) hang below the root afterwards?"""
    check_answer(answer, _nodes(), "Q3 (nodes below the root after three inserts)",
                 [(3, "the third prompt leaves the edge A B C after two blocks: that edge is split too."),
                  (len(set("".join(Q3_PROMPTS))), "that counts blocks; a node holds a RUN of blocks: count the runs."),
                  (1 + len(Q3_PROMPTS), "inserting the second prompt splits A B C D E after C: A B C keeps one "
                                         "node, D E becomes its child beside X Y.")],
                 unit="nodes", rel=0,
                 hint="Draw the tree after each insert; a prompt leaving an edge part way splits it at that block.")
