"""Exercise 1: the packed (varlen) layout of one step."""

from __future__ import annotations

import math
from typing import Callable

import torch

from autograder.harness import call_learner
from autograder.lab03.common import _rand_tokens
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.cache.block_manager import BlockManager
from minigpt.engine.packed_batch import pack_chunks


def check_pack_chunks(pack_fn: Callable) -> None:
    """pack_fn(chunks, manager) with chunks (seq_id, tokens, start, slots) -> PackedBatch fields equal the reference."""
    what_ex = "Exercise 1 (pack_chunks)"
    own_work(pack_fn, pack_chunks, what=what_ex)
    m = BlockManager(32, 4)
    g = torch.Generator().manual_seed(0)
    a_prompt, b_prompt = _rand_tokens(11, g), _rand_tokens(5, g)
    r1 = m.add_sequence("a", a_prompt[:6])                 # first chunk of a
    m.add_sequence("b", b_prompt)
    r2 = m.append_tokens("a", a_prompt[6:])                # second chunk: positions 6..10
    r3 = m.append_tokens("b", [7])                         # decode at position 5
    m.add_sequence("c", [3, 4])
    r4 = m.append_tokens("c", [9])
    cases = {
        "one sequence, first chunk": [("a", a_prompt[:6], 0, r1.slots)],
        "a second prefill chunk (start 6), a decode (start 5), a decode (start 2)":
            [("a", a_prompt[6:], 6, r2.slots), ("b", [7], 5, r3.slots), ("c", [9], 2, r4.slots)],
    }
    for what, chunks in cases.items():
        want = pack_chunks(chunks, m)
        with no_calls_into(pack_chunks, what=what_ex):
            got = call_learner(f"pack_chunks ({what})", pack_fn, chunks, m)
        seq_ids = getattr(got, "seq_ids", None)
        if not isinstance(seq_ids, (list, tuple)) or list(seq_ids) != want.seq_ids:
            raise AssertionError(f"{what}: seq_ids should be {want.seq_ids} (the chunks' sequences in the order "
                                 f"given), got {getattr(got, 'seq_ids', None)!r}")
        for name in ("tokens", "positions", "slots", "cu_seqlens_q", "seq_lens"):
            w, x = getattr(want, name), getattr(got, name, None)
            if isinstance(x, torch.Tensor) and x.dtype != w.dtype:
                raise AssertionError(f"{what}: {name} has dtype {x.dtype}, should be {w.dtype} (index tensors are "
                                     "int64: torch.tensor of Python ints)")
            if not isinstance(x, torch.Tensor) or x.shape != w.shape or not torch.equal(x.long().cpu(), w.long()):
                hint = {"positions": " Positions continue across chunks: a chunk starting at `start` covers "
                                     "start .. start + n - 1, not 0 .. n - 1.",
                        "cu_seqlens_q": " cu_seqlens_q is [0, n_0, n_0 + n_1, ...] (B + 1 entries).",
                        "seq_lens": " seq_lens[b] = start + n: the sequence's length in the cache after this step."
                        }.get(name, "")
                raise AssertionError(f"{what}: {name} should be {w.tolist()}, got "
                                     f"{x.tolist() if isinstance(x, torch.Tensor) else x!r}.{hint}")
        bt = getattr(got, "block_tables", None)
        if isinstance(bt, torch.Tensor) and bt.dtype != want.block_tables.dtype:
            raise AssertionError(f"{what}: block_tables has dtype {bt.dtype}, should be {want.block_tables.dtype} "
                                 "(what block_tables_tensor makes)")
        for b, (seq_id, toks, start, _) in enumerate(chunks):
            need = math.ceil((start + len(toks)) / 4)
            if bt is None or bt[b, :need].tolist() != m.table(seq_id).blocks[:need]:
                raise AssertionError(f"{what}: block_tables row {b} should start with {m.table(seq_id).blocks}")
    _check_device(pack_fn, m, cases, what_ex)


PACKED_FIELDS = ("tokens", "positions", "slots", "cu_seqlens_q", "seq_lens", "block_tables")


def _check_device(pack_fn: Callable, m: BlockManager, cases: dict, what_ex: str) -> None:
    """Every tensor of the batch is made on the device asked for (the meta device here: it holds no data, so a tensor
    built without `device=` is seen on the CPU on any machine)."""
    chunks = list(cases.values())[-1]
    with no_calls_into(pack_chunks, what=what_ex):
        got = call_learner("pack_chunks(chunks, manager, device='meta')", pack_fn, chunks, m, "meta")
    elsewhere = {name: str(getattr(got, name).device) for name in PACKED_FIELDS
                 if isinstance(getattr(got, name, None), torch.Tensor) and not getattr(got, name).is_meta}
    if elsewhere:
        raise AssertionError(f"{what_ex}: asked for device='meta', but {elsewhere} were made elsewhere: pass "
                             "device=device to every torch.tensor (and to block_tables_tensor), or a GPU step "
                             "gets CPU index tensors")


def refuse_thin_pack(pack_fn: Callable) -> None:
    """A cheap probe before a model run: pack_fn on one chunk while entering the reference's pack_chunks fails."""
    m = BlockManager(8, 4)
    r = m.add_sequence("a", [1, 2, 3])
    with no_calls_into(pack_chunks, what="Exercise 1 (pack_chunks)"):
        call_learner("pack_chunks (one chunk)", pack_fn, [("a", [1, 2, 3], 0, r.slots)], m)
