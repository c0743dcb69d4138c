"""Exercise 3: a decode step padded to its batch-size bucket (static shapes for a compiled step)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner, expect_value_error
from minigpt.engine.static_step import PADDED_KEYS, pad_decode_batch

EX3 = "Exercise 3 (pad_decode_batch)"
REFERENCES = (pad_decode_batch,)


def _cases() -> list[tuple[list[tuple[int, int, int, list[int]]], int, int, int, int]]:
    """(rows, bucket, max_blocks, null_block, block_size): a full bucket, one row in a large bucket, a row whose
    table fills the width, a null block that is not block 0, then drawn steps."""
    cases = [([(11, 16, 64, [3, 4, 5])], 1, 4, 0, 16), ([(7, 0, 32, [2]), (9, 31, 63, [6, 3])], 8, 4, 1, 16),
             ([(5, 63, 95, [2, 3, 4, 5]), (6, 2, 146, [9])], 4, 4, 7, 16)]
    g = torch.Generator().manual_seed(21)
    for bucket, width, null in ((4, 6, 0), (16, 3, 2), (2, 8, 5)):
        n = int(torch.randint(1, bucket + 1, (1,), generator=g))
        pool = [b for b in torch.randperm(64, generator=g).tolist() if b != null]
        rows = []
        for _ in range(n):
            length = int(torch.randint(1, width * 8 + 1, (1,), generator=g))
            blocks = [pool.pop() for _ in range(-(-length // 8))]
            position = length - 1
            rows.append((int(torch.randint(0, 500, (1,), generator=g)), position,
                         blocks[position // 8] * 8 + position % 8, blocks))
        cases.append((rows, bucket, width, null, 8))
    return cases


def _hint(key: str, got: torch.Tensor, want: torch.Tensor, n: int) -> str:
    if got.shape != want.shape:
        return (f"shape {tuple(got.shape)}, expected {tuple(want.shape)}: every shape must follow from (bucket, "
                "max_blocks) alone, or each batch size compiles a graph of its own")
    real, pad = (got[:n] != want[:n]).any().item(), (got[n:] != want[n:]).any().item()
    if real:
        return {"seq_lens": "a sequence's length after this step is its position + 1",
                "block_tables": "a row's table is its blocks, then the null block to the width"}.get(
            key, "the real rows carry each sequence's own value")
    if pad:
        return {"slots": "a padding row writes its K and V into the null block (slot null_block * block_size), "
                         "never into a real sequence's block",
                "block_tables": "a padding row's table is the null block throughout",
                "seq_lens": "a padding row is a sequence of length 1 (0 would leave its softmax without a key)"}.get(
            key, "padding rows hold token 0 at position 0")
    return ""


def check_pad_decode_batch(fn: Callable) -> None:
    """fn(rows, bucket, max_blocks, null_block, block_size) -> {tokens, positions, slots, block_tables, seq_lens}
    exactly the reference's on hand-made and drawn steps; more rows than the bucket refused."""
    own_work(fn, REFERENCES, what=EX3)
    fn = watched(fn, REFERENCES, EX3)
    for rows, bucket, width, null, bs in _cases():
        what = f"{EX3}, {len(rows)} rows, bucket {bucket}, max_blocks {width}, null_block {null}, block_size {bs}"
        got = call_learner(EX3, fn, [(t, p, s, list(b)) for t, p, s, b in rows], bucket, width, null, bs, context=what)
        want = pad_decode_batch(rows, bucket, width, null, bs)
        if not isinstance(got, dict) or set(got) != set(PADDED_KEYS):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise AssertionError(f"{what}: expected a dict with keys {list(PADDED_KEYS)}, got {keys}")
        for key in PADDED_KEYS:
            value: Any = got[key]
            if not isinstance(value, torch.Tensor) or value.dtype != torch.long:
                kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise AssertionError(f"{what}: {key} must be an int64 tensor, got {kind}")
            if value.shape != want[key].shape or not torch.equal(value, want[key]):
                raise AssertionError(f"{what}: {key} is {value.tolist()}, expected {want[key].tolist()}. "
                                     f"{_hint(key, value, want[key], len(rows))}")
    expect_value_error(f"{EX3}: 3 rows for a bucket of 2", fn, [(1, 0, 0, [1])] * 3, 2, 2, 0, 8)
