"""Exercises 4 and 5: a batch-invariant matmul and a batch-invariant attention.

Both are judged on the bits of the learner's own results: the judge composes the batches (a row alone, then at
several places among other rows; a query's keys padded further with masked blocks; a prefill cut into chunks) and
requires the row's result to be the same bits every time, and near the exact value. Bits are only ever compared
between calls of the learner's function, never against the judge's own arithmetic (another process may run another
thread count, hence other kernels).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from autograder.checking.reference_guard import own_work, watched
from autograder.harness import assert_finite, call_learner, expect_value_error
from minigpt.engine.batch_invariant import invariant_attention, invariant_attention_dense, invariant_matmul

EX4 = "Exercise 4 (invariant_matmul)"
EX5 = "Exercise 5 (invariant_attention)"
MATMUL_REFERENCES = (invariant_matmul,)
ATTENTION_REFERENCES = (invariant_attention, invariant_attention_dense)
ROUNDED_FLOAT64_SHARE = 0.9     # a float32 product over K = 256 equals the correctly rounded one in about 10-15%


def _tensor(got: object, shape: tuple[int, ...], what: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"{what}: expected a tensor of shape {shape}, got {found}")
    if got.dtype != torch.float32:
        raise AssertionError(f"{what}: expected float32, got {got.dtype} (compute in float32 with a fixed order; "
                             "a wider type only makes a change of order rarer, not impossible)")
    return got


# ---------------------------------------------------------------------------------------------------
# Exercise 4
# ---------------------------------------------------------------------------------------------------

def check_invariant_matmul(fn: Callable) -> None:
    """fn(x (..., K), w (K, N), tile) -> (..., N) float32: near x @ w; row 0's bits the same alone and at the start,
    middle and end of batches of 2 .. 300 rows, for tiles 1, 4 and 8; leading dimensions kept; a bad tile refused;
    not a float64 product rounded (that hides the order, it does not fix it)."""
    own_work(fn, MATMUL_REFERENCES, what=EX4)
    fn = watched(fn, MATMUL_REFERENCES, EX4)
    g = torch.Generator().manual_seed(31)
    w = torch.randn(256, 384, generator=g)
    x = torch.randn(300, 256, generator=g)
    exact = (x.double() @ w.double())
    for tile in (1, 4, 8):
        what = f"{EX4}, x (300, 256) @ w (256, 384), tile={tile}"
        got = _tensor(call_learner(EX4, fn, x.clone(), w.clone(), tile, context=what), (300, 384), what)
        assert_finite(got, what)
        err = (got.double() - exact).abs().max().item()
        if err > 1e-3:
            raise AssertionError(f"{what}: off from x @ w by up to {err:.3g}; each row's result must still be its "
                                 "product with w")
        if tile == 8 and (got == exact.float()).float().mean().item() > ROUNDED_FLOAT64_SHARE:
            raise AssertionError(f"{what}: your result equals the float64 product rounded to float32 in more than "
                                 f"{ROUNDED_FLOAT64_SHARE:.0%} of its elements; a float32 product rarely does. Wider "
                                 "arithmetic makes a change of summation order rarer, not impossible: fix the order")
        alone = _tensor(call_learner(EX4, fn, x[:1].clone(), w.clone(), tile, context=what), (1, 384),
                        f"{what}, one row")
        for rows in sorted({2, 3, tile, tile + 1, 37, 300}):
            batch = x[:rows].clone()
            for place in sorted({0, rows // 2, rows - 1}):
                batch[place] = x[0]
                label = f"{what}: row 0 of x placed at row {place} of a batch of {rows}"
                out = _tensor(call_learner(EX4, fn, batch.clone(), w.clone(), tile, context=label), (rows, 384), label)
                changed = (out[place] != alone[0]).float().mean().item()
                if changed:
                    raise AssertionError(f"{label} gives other bits than computed alone ({changed:.0%} of its 384 "
                                         "values differ): the library picks its kernel and its summation order by "
                                         "the number of rows; make every row go through a product of the same shape")
                batch[place] = x[place]
    what = f"{EX4}, x (2, 5, 16) @ w (16, 8), tile=4"
    x3, w3 = torch.randn(2, 5, 16, generator=g), torch.randn(16, 8, generator=g)
    got = _tensor(call_learner(EX4, fn, x3.clone(), w3.clone(), 4, context=what), (2, 5, 8), what)
    if not torch.allclose(got, x3 @ w3, atol=1e-4):
        raise AssertionError(f"{what}: leading dimensions are rows too: reshape to (-1, K), multiply, reshape back")
    for bad in (0, -2, 2.0):
        expect_value_error(f"{EX4}: tile={bad!r}", fn, x3, w3, bad)


# ---------------------------------------------------------------------------------------------------
# Exercise 5
# ---------------------------------------------------------------------------------------------------

def _exact_attention(q: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Causal attention of each row over its own keys 0..position, float64: (N, Hq, D)."""
    out = []
    group = q.shape[1] // keys.shape[2]
    for n, p in enumerate(positions.tolist()):
        k = keys[n, :p + 1].double().repeat_interleave(group, dim=1)             # (p + 1, Hq, D)
        v = values[n, :p + 1].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[n].double(), k) / math.sqrt(q.shape[-1])
        out.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def _draw(g: torch.Generator, n: int, length: int, hq: int = 4, hkv: int = 2, d: int = 16) -> tuple[torch.Tensor, ...]:
    return (torch.randn(n, hq, d, generator=g), torch.randn(n, length, hkv, d, generator=g),
            torch.randn(n, length, hkv, d, generator=g))


def check_invariant_attention(fn: Callable) -> None:
    """fn(q (N, Hq, D), positions (N,), keys, values (N, L, Hkv, D), block_size) -> (N, Hq, D) float32: near causal
    attention over each row's keys 0..position (GQA); a query's bits the same alone, among other rows at any place,
    with its keys padded further (more masked blocks) and across the chunks of a prefill."""
    own_work(fn, ATTENTION_REFERENCES, what=EX5)
    fn = watched(fn, ATTENTION_REFERENCES, EX5)
    g = torch.Generator().manual_seed(41)
    for block_size in (4, 8):
        what = f"{EX5}, block_size={block_size}"
        q, keys, values = _draw(g, 9, 37)
        positions = torch.tensor([36, 0, 5, 17, 31, 8, 23, 36, 12])
        label = f"{what}: 9 rows over 37 keys, positions {positions.tolist()}"
        got = _tensor(call_learner(EX5, fn, q.clone(), positions.clone(), keys.clone(), values.clone(), block_size,
                                   context=label), (9, 4, 16), label)
        assert_finite(got, label)
        err = (got.double() - _exact_attention(q, positions, keys, values)).abs().max().item()
        if err > 1e-4:
            raise AssertionError(f"{label}: off from causal attention by up to {err:.3g} (row n attends to its keys "
                                 "0..positions[n]; query head h reads KV head h // (Hq // Hkv); scores scaled by "
                                 "1/sqrt(D))")
        for n in (0, 3, 8):
            one = slice(n, n + 1)
            alone = call_learner(EX5, fn, q[one].clone(), positions[one].clone(), keys[one].clone(),
                                 values[one].clone(), block_size, context=f"{label}, row {n} alone")
            if not torch.equal(_tensor(alone, (1, 4, 16), f"{label}, row {n} alone")[0], got[n]):
                raise AssertionError(f"{label}: row {n} computed alone gives other bits than among the 9 rows: a "
                                     "reduction of the batch's shape (a matmul over the rows, one softmax over all "
                                     "of them) changes its order with the batch; reduce each query over its own "
                                     "keys block by block")
            longer = [torch.cat([t[one], torch.randn(1, 3 * block_size + 2, *t.shape[2:], generator=g)], 1)
                      for t in (keys, values)]
            padded = call_learner(EX5, fn, q[one].clone(), positions[one].clone(), *longer, block_size,
                                  context=f"{label}, row {n} with its keys padded by masked blocks")
            if not torch.equal(_tensor(padded, (1, 4, 16), f"{label}, row {n} padded")[0], got[n]):
                raise AssertionError(f"{label}: row {n} with {3 * block_size + 2} more (masked) keys after its own "
                                     "gives other bits: a block past the query's position must leave the running "
                                     "max, sum and output exactly as they were (in a batch, or after chunking, a "
                                     "sequence's keys are padded to another length)")
        _check_chunks(fn, g, block_size, what)
    for hq, hkv in ((2, 2), (3, 1)):                            # MHA and MQA: one KV head per query head, or for all
        q, keys, values = _draw(g, 3, 11, hq, hkv)
        positions = torch.tensor([10, 4, 0])
        label = f"{EX5}, {hq} query heads over {hkv} KV head(s), block_size=4"
        got = _tensor(call_learner(EX5, fn, q.clone(), positions.clone(), keys.clone(), values.clone(), 4,
                                   context=label), (3, hq, 16), label)
        err = (got.double() - _exact_attention(q, positions, keys, values)).abs().max().item()
        if not err <= 1e-4:
            raise AssertionError(f"{label}: off from causal attention by up to {err:.3g} (query head h reads KV head "
                                 "h // (Hq // Hkv): with as many KV heads as query heads, each its own)")


def _check_chunks(fn: Callable, g: torch.Generator, block_size: int, what: str) -> None:
    """One sequence's 29-token prefill: all rows at once, then in chunks of 1, 5 and 12 rows, each chunk seeing the
    keys written so far (padded to the next block): the same bits."""
    q, keys, values = _draw(g, 1, 29)
    qs = q.expand(29, -1, -1).clone() + torch.randn(29, 4, 16, generator=g)
    positions = torch.arange(29)
    full = call_learner(EX5, fn, qs.clone(), positions.clone(), keys.expand(29, -1, -1, -1).clone(),
                        values.expand(29, -1, -1, -1).clone(), block_size, context=f"{what}: a 29-token prefill")
    full = _tensor(full, (29, 4, 16), f"{what}: a 29-token prefill")
    for chunk in (1, 5, 12):
        parts = []
        for start in range(0, 29, chunk):
            end = min(start + chunk, 29)
            seen = -(-end // block_size) * block_size                  # the keys written so far, whole blocks
            k = torch.cat([keys, torch.zeros(1, max(0, seen - 29), *keys.shape[2:])], 1)[:, :seen]
            v = torch.cat([values, torch.zeros(1, max(0, seen - 29), *values.shape[2:])], 1)[:, :seen]
            n, label = end - start, f"{what}: prefill chunk {start}..{end - 1}"
            part = call_learner(EX5, fn, qs[start:end].clone(), positions[start:end].clone(),
                                k.expand(n, -1, -1, -1).clone(), v.expand(n, -1, -1, -1).clone(), block_size,
                                context=label)
            parts.append(_tensor(part, (n, 4, 16), label))
        got = torch.cat(parts)
        if not torch.equal(got, full):
            rows = (got != full).flatten(1).any(-1).nonzero().flatten().tolist()
            raise AssertionError(f"{what}: the 29-token prefill in chunks of {chunk} gives other bits than in one "
                                 f"piece at rows {rows[:8]}: a query's result must not depend on which other "
                                 "queries share its call nor on how many keys follow its own")
