"""Lab 02, exercises 5-6: paged decode and prefill attention, and the paged engine running the learner's attention."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from autograder.harness import assert_finite, call_learner, within
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.attention import naive_attention
from minigpt.cache import paged_attention as reference_module
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.paged_generation import generate_paged_batch
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

__all__ = ["check_paged_decode_attention", "check_paged_attention", "check_paged_generation", "GEN_CONFIG"]

DECODE_WHAT = "Exercise 5 (paged_decode_attention)"
PAGED_WHAT = "Exercise 6 (paged_attention)"

# The package's paged attention (the references of exercises 5 and 6) and its block gather.
REFERENCE_PAGED = (reference_module.paged_decode_attention, reference_module.paged_attention, reference_module.gather_kv)


def _call(what: str, fn: Callable, *args: Any, exercise: str, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) through the harness, refusing a call into the package's paged attention."""
    with no_calls_into(*REFERENCE_PAGED, what=exercise):
        return call_learner(what, fn, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Paged attention
# ---------------------------------------------------------------------------------------------------

def _paged_case(lens: list[int], bs: int, Hkv: int, D: int, g: torch.Generator) -> tuple:
    """Random pools and scattered block tables holding sequences of lengths `lens`; also each sequence's
    dense K/V (1, Hkv, L, D) for the reference."""
    need = [-(-n // bs) for n in lens]
    num_blocks = sum(need) + 3
    k_pool, v_pool = torch.randn(num_blocks, bs, Hkv, D, generator=g), torch.randn(num_blocks, bs, Hkv, D, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, dense, i = [], [], 0
    for n, nb in zip(lens, need):
        t = perm[i:i + nb]
        i += nb
        tables.append(t)
        k = torch.cat([k_pool[b] for b in t])[:n]                 # (n, Hkv, D)
        v = torch.cat([v_pool[b] for b in t])[:n]
        dense.append((k.transpose(0, 1)[None], v.transpose(0, 1)[None]))
    width = max(need)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for r, t in enumerate(tables):
        bt[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return k_pool, v_pool, bt, torch.tensor(lens, dtype=torch.int32), dense


def _scores_far_below_minus_1e4(k_pool: torch.Tensor, q: torch.Tensor, dense: list) -> tuple:
    """The same case with every real score far below -1e4 (positive keys, large negative queries): a mask of -1e4
    instead of -inf then outweighs every visible key, and only a true -inf mask (or dropping the masked slots)
    still gives the dense answer. Scores stay far apart, so the answer is one key's value, with no near ties."""
    k_pool = k_pool.abs() + 0.5
    q = -(q.abs() + 0.5) * 2e4
    return k_pool, q, [(k.abs() + 0.5, v) for k, v in dense]


def check_paged_decode_attention(fn: Callable) -> None:
    """fn(q (B, Hq, D), k_pool, v_pool (num_blocks, bs, Hkv, D), block_tables (B, M) int32, seq_lens (B,) int32)
    -> (B, Hq, D): each sequence's query attends to its seq_lens[b] keys, read through its block table."""
    own_work(fn, REFERENCE_PAGED, what=DECODE_WHAT)
    g = torch.Generator().manual_seed(0)
    for lens, bs, Hq, Hkv, D, far in (([5, 1, 12], 4, 4, 2, 8, False), ([16, 3], 16, 4, 4, 8, False),
                                      ([9, 8, 17, 2], 8, 6, 1, 16, False), ([5, 1, 12], 4, 4, 2, 8, True)):
        k_pool, v_pool, bt, seq_lens, dense = _paged_case(lens, bs, Hkv, D, g)
        q = torch.randn(len(lens), Hq, D, generator=g)
        what = f"lengths {lens}, block_size {bs}, {Hq} query / {Hkv} KV heads"
        if far:
            k_pool, q, dense = _scores_far_below_minus_1e4(k_pool, q, dense)
            what += ", every score below -1e4 (mask with -inf, not a large negative number)"
        got = _call(f"paged decode attention ({what})", fn, q.clone(), k_pool.clone(), v_pool.clone(), bt.clone(), seq_lens.clone(),
                    exercise=DECODE_WHAT)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
            raise AssertionError(f"{what}: expected an output (B, Hq, D) = {tuple(q.shape)}, got "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        for b, (k, v) in enumerate(dense):
            want = naive_attention(q[b][None, :, None], k, v)[0, :, 0]
            assert_finite(got[b], f"{DECODE_WHAT}: {what}: sequence {b}", want)
            if not torch.allclose(got[b].float(), want, atol=1e-5, rtol=1e-4):
                err = (got[b].float() - want).abs().max().item()
                raise AssertionError(f"{what}: sequence {b} (length {lens[b]}) differs from dense attention over its "
                                     f"{lens[b]} keys by up to {err:.3g}. Read block block_tables[b, p // bs] at offset "
                                     "p % bs, mask the slots p >= seq_lens[b], and map query head h to KV head "
                                     "h // (Hq // Hkv).")


def check_paged_attention(fn: Callable) -> None:
    """fn(q (B, Hq, Tq, D), k_pool, v_pool, block_tables, seq_lens, q_lens) -> (B, Hq, Tq, D): sequence b's
    q_lens[b] real queries are its last positions; rows past q_lens[b] are ignored."""
    own_work(fn, REFERENCE_PAGED, what=PAGED_WHAT)
    g = torch.Generator().manual_seed(1)
    cases = (([6, 3, 10], [6, 3, 10], 4, 4, 2, 8, "prefill of 3 prompts"),
             ([9, 13], [1, 1], 4, 4, 2, 8, "decode of 2 sequences"),
             ([11, 7, 5], [4, 1, 5], 4, 6, 3, 8, "mixed batch: a chunk after a cached prefix, a decode, a prefill"),
             ([17], [17], 16, 4, 1, 16, "one prompt crossing a block boundary, MQA"),
             ([11, 7, 5], [4, 1, 5], 4, 6, 3, 8, "mixed batch, every score below -1e4 (mask with -inf, not a large "
                                                 "negative number)"))
    for lens, q_lens, bs, Hq, Hkv, D, what in cases:
        k_pool, v_pool, bt, seq_lens, dense = _paged_case(lens, bs, Hkv, D, g)
        Tq = max(q_lens)
        q = torch.randn(len(lens), Hq, Tq, D, generator=g)
        if "below -1e4" in what:
            k_pool, q, dense = _scores_far_below_minus_1e4(k_pool, q, dense)
        ql = torch.tensor(q_lens, dtype=torch.int32)
        got = _call(f"paged attention ({what})", fn, q.clone(), k_pool.clone(), v_pool.clone(), bt.clone(),
                    seq_lens.clone(), ql.clone(), exercise=PAGED_WHAT)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
            raise AssertionError(f"{what}: expected an output (B, Hq, Tq, D) = {tuple(q.shape)}, got "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        for b, (k, v) in enumerate(dense):
            n = q_lens[b]
            want = naive_attention(q[b:b + 1, :, :n], k, v)[0]
            if not torch.isfinite(got[b, :, :n]).all():
                raise AssertionError(f"{what}: sequence {b} has NaN/inf outputs (a query row that sees no key?)")
            if not torch.allclose(got[b, :, :n].float(), want, atol=1e-5, rtol=1e-4):
                err = (got[b, :, :n].float() - want).abs().max().item()
                raise AssertionError(f"{what}: sequence {b} (length {lens[b]}, {n} new queries) differs from dense "
                                     f"causal attention by up to {err:.3g}. Its query i sits at position "
                                     "seq_lens[b] - q_lens[b] + i and sees keys j <= that position (bottom-right mask), "
                                     "read through its block table.")


# ---------------------------------------------------------------------------------------------------
# End to end: the model on a paged cache against lab 01's contiguous cache
# ---------------------------------------------------------------------------------------------------

GEN_CONFIG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


def check_paged_generation(attention_fn: Callable, *, block_size: int = 4) -> None:
    """The reference paged engine (minigpt.engine.paged_generation) run with YOUR paged attention: greedy and
    seeded-sampling generations, alone and in a batch of different-length prompts, must equal
    minigpt.engine.cached_generation.generate_kv_cache token for token."""
    own_work(attention_fn, REFERENCE_PAGED, what=PAGED_WHAT)
    with fixed_threads(1):                  # tiny model: one thread is fastest and immune to a busy machine
        _check_paged_generation(attention_fn, block_size)


def _check_paged_generation(attention_fn: Callable, block_size: int) -> None:
    torch.manual_seed(0)
    model = GPT(GEN_CONFIG).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 255, (n,), generator=g).tolist() for n in (3, 9, 14, 1)]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)):
        want = [generate_kv_cache(model, p, 12, sampling, stop_token_ids=()).tokens for p in prompts]
        alone = _call("generate_paged_batch with your attention (one prompt)", generate_paged_batch, model, prompts[1:2],
                      12, sampling, stop_token_ids=(), block_size=block_size, attention=attention_fn,
                      exercise=PAGED_WHAT)
        if alone[0].tokens != want[1]:
            raise AssertionError(f"one prompt of {len(prompts[1])} tokens, {sampling}: the paged cache generated "
                                 f"{alone[0].tokens}, the contiguous cache {want[1]}")
        batch = _call("generate_paged_batch with your attention (4 prompts)", generate_paged_batch, model, prompts, 12,
                      sampling, stop_token_ids=(), block_size=block_size, attention=attention_fn,
                      exercise=PAGED_WHAT)
        for p, out, w in zip(prompts, batch, want):
            if out.tokens != w:
                raise AssertionError(f"batch of prompts of lengths {[len(x) for x in prompts]}, {sampling}: the prompt of "
                                     f"{len(p)} tokens generated {out.tokens} in the batch, {w} with the contiguous cache. "
                                     "Padding rows or other sequences' keys leak into this sequence?")
    # Logits of one mixed step within tolerance.
    from minigpt.cache.paged import PagedKVCache
    from minigpt.cache.contiguous import KVCache
    from minigpt.engine.paged_generation import paged_forward
    with torch.inference_mode():
        cache = PagedKVCache.for_model(model, num_blocks=32, block_size=block_size)
        got = _call("paged_forward", paged_forward, model, cache, cache.prepare(list(enumerate(prompts))), attention_fn,
                    exercise=PAGED_WHAT)
        for i, p in enumerate(prompts):
            want = model(torch.tensor([p]), positions=torch.arange(len(p)), kv_caches=KVCache.for_model(model))[0, -1]
            assert_finite(got[i], f"{PAGED_WHAT}: prefill of a batch of prompts: the logits of prompt {i}", want)
            err = (got[i].float() - want.float()).abs().max().item()
            if not within(err, 1e-4):
                raise AssertionError(f"{PAGED_WHAT}: prefill of a batch of prompts of lengths "
                                     f"{[len(x) for x in prompts]}: the logits of prompt {i} differ from the contiguous "
                                     f"cache's by up to {err:.3g}")
