"""Lab 12's checks: a learner's copy of each reference passes; the stub, the reference handed in, a wrapper around
it and plausible wrong implementations fail, each with the message that names its mistake."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autograder import lab12
from learner_copy import as_learner
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.engine.batch_invariant import invariant_attention, invariant_attention_dense, invariant_matmul
from minigpt.engine.overlap import step_timeline
from minigpt.engine.static_step import pad_decode_batch
from minigpt.serving.overlap_driver import run_overlapped
from minigpt.timing import fixed_threads


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    with fixed_threads(1):
        yield


def _stub(*args, **kwargs):
    raise NotImplementedError


def _wrapper(fn):
    def learner(*args, **kwargs):
        return fn(*args, **kwargs)
    return learner


ANSWERS = {
    "timeline": (lab12.check_step_timeline, lambda: as_learner(step_timeline), step_timeline),
    "loop": (lab12.check_overlapped_loop, lambda: as_learner(run_overlapped), run_overlapped),
    "padding": (lab12.check_pad_decode_batch, lambda: as_learner(pad_decode_batch), pad_decode_batch),
    "matmul": (lab12.check_invariant_matmul, lambda: as_learner(invariant_matmul), invariant_matmul),
    "attention": (lab12.check_invariant_attention, lambda: as_learner(
        invariant_attention_dense, invariant_attention=as_learner(invariant_attention)), invariant_attention_dense),
}


@pytest.mark.parametrize("name", ANSWERS)
def test_a_learners_copy_passes(name):
    check, copy, _ = ANSWERS[name]
    check(copy())


@pytest.mark.parametrize("name", ANSWERS)
def test_the_stub_the_reference_and_a_wrapper_fail(name):
    check, _, reference = ANSWERS[name]
    with pytest.raises(AssertionError, match="not implemented"):
        check(_stub)
    with pytest.raises(AssertionError, match="reference"):
        check(reference)
    with pytest.raises(AssertionError, match="reference"):
        check(_wrapper(reference))


# --- Exercise 1 ----------------------------------------------------------------------------------

def _timeline(start_of):
    def timeline(model_s, cpu_s, *, overlapped, handoff_s=0.0):
        if len(model_s) != len(cpu_s) or min([*model_s, *cpu_s, handoff_s]) < 0:
            raise ValueError("one of each, times >= 0")
        out = []
        for m, c in zip(model_s, cpu_s):
            start = start_of(out, c, overlapped, handoff_s)
            out.append((start, start + m))
        return out
    return timeline


def _serial_first(out, c, overlapped, h):
    return c + (h if overlapped else 0.0)


@pytest.mark.parametrize("start_of, message", [
    (lambda out, c, o, h: _serial_first(out, c, o, h) if not out else
     (max(out[-1][1], c) + h if o else out[-1][1] + c), "when step i-1 is LAUNCHED"),
    (lambda out, c, o, h: _serial_first(out, c, o, h) if not out else
     (out[-1][0] + c + h if o else out[-1][1] + c), "cannot launch before the step before it has ended"),
    (lambda out, c, o, h: _serial_first(out, c, o, h) if not out else
     (max(out[-1][1], out[-1][0] + c) if o else out[-1][1] + c), "pays the hand-off"),
    (lambda out, c, o, h: c + h if not out else out[-1][1] + c + h, "no model thread to hand over to"),
    (lambda out, c, o, h: c if not out else out[-1][1] + c, "runs beside step i-1's model call"),
], ids=["cpu-from-zero", "no-wait-for-model", "no-handoff", "serial-handoff", "never-overlaps"])
def test_wrong_timelines_are_named(start_of, message):
    with pytest.raises(AssertionError, match=message):
        lab12.check_step_timeline(_timeline(start_of))


# --- Exercise 2 ----------------------------------------------------------------------------------

def _serial_loop(driver):
    while driver.has_unfinished():
        flight = driver.launch(driver.schedule())
        driver.apply_ahead(flight)
        driver.land(flight)


def _never_ready(driver):
    flight = None
    while driver.has_unfinished():
        if flight is None:
            flight = driver.launch(driver.schedule())
        driver.apply_ahead(flight)
        ahead = driver.schedule()
        driver.land(flight)
        flight = driver.launch(ahead) if ahead is not None else None


def _lands_before_applying(driver):
    flight = None
    while driver.has_unfinished():
        if flight is None:
            flight = driver.launch(driver.schedule())
        ahead = driver.schedule()
        driver.land(flight)
        flight = driver.launch(driver.ready(ahead)) if ahead is not None else None


def _stops_at_the_first_idle_moment(driver):
    flight = driver.launch(driver.schedule())
    while flight is not None:
        driver.apply_ahead(flight)
        ahead = driver.schedule()
        driver.land(flight)
        ahead = driver.ready(ahead) if ahead is not None else None
        flight = driver.launch(ahead) if ahead is not None else None
        if len(driver.tokens) > 2:
            return


@pytest.mark.parametrize("fn, message", [
    (_serial_loop, "ran beside the scheduling of the next"), (_never_ready, "ready\\(\\) it once"),
    (_lands_before_applying, "scheduled and not launched|before apply_ahead"),
    (_stops_at_the_first_idle_moment, "requests unfinished"),
], ids=["serial", "never-ready", "lands-before-applying", "returns-early"])
def test_wrong_loops_are_named(fn, message):
    with pytest.raises(AssertionError, match=message):
        lab12.check_overlapped_loop(fn)


# --- Exercise 3 ----------------------------------------------------------------------------------

def _padding(**wrong):
    def pad(rows, bucket, max_blocks, null_block, block_size):
        if len(rows) > bucket:
            raise ValueError(f"{len(rows)} rows for a bucket of {bucket}")
        n = len(rows) if wrong.get("unpadded") else bucket
        tables = torch.full((n, max_blocks), wrong.get("table_fill", null_block), dtype=torch.long)
        tokens, positions = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        slots = torch.full((n,), wrong.get("pad_slot", null_block * block_size), dtype=torch.long)
        seq_lens = torch.full((n,), wrong.get("pad_len", 1), dtype=torch.long)
        for i, (token, position, slot, blocks) in enumerate(rows):
            tables[i, :len(blocks)] = torch.tensor(blocks)
            tokens[i], positions[i], slots[i] = token, position, slot
            seq_lens[i] = position + (0 if wrong.get("length_is_position") else 1)
        return {"tokens": tokens, "positions": positions, "slots": slots, "block_tables": tables, "seq_lens": seq_lens}
    return pad


@pytest.mark.parametrize("wrong, message", [
    ({"unpadded": True}, "follow from \\(bucket, max_blocks\\) alone"),
    ({"pad_slot": 0}, "never into a real sequence's block"),
    ({"table_fill": 0}, "then the null block to the width"),
    ({"pad_len": 0}, "a sequence of length 1"),
    ({"length_is_position": True}, "its position \\+ 1"),
])
def test_wrong_paddings_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        lab12.check_pad_decode_batch(_padding(**wrong))


# --- Exercise 4 ----------------------------------------------------------------------------------

def _plain(x, w, tile):
    if tile < 1:
        raise ValueError("tile")
    return x @ w


def _rounded_float64(x, w, tile):
    if tile < 1:
        raise ValueError("tile")
    return (x.double() @ w.double()).float()


def _one_padded_product(x, w, tile):
    """Pads the rows to a multiple of the tile, then ONE product: its row count still changes with the batch."""
    if tile < 1:
        raise ValueError("tile")
    rows = x.reshape(-1, x.shape[-1])
    pad = -rows.shape[0] % tile
    padded = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return (padded @ w)[:rows.shape[0]].reshape(*x.shape[:-1], w.shape[-1])


def _flat_only(x, w, tile):
    """The reference's idea for a 2-D x only: a (2, 5, K) input is taken as 2 rows of 5 K-vectors."""
    if tile < 1:
        raise ValueError("tile")
    pad = -x.shape[0] % tile
    padded = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    out = torch.bmm(padded.view(-1, tile, x[0].numel()), w.expand(padded.shape[0] // tile, *w.shape))
    return out.reshape(padded.shape[0], -1)[:x.shape[0]]


@pytest.mark.parametrize("fn, message", [
    (_plain, "other bits than computed alone"), (_rounded_float64, "float64 product rounded"),
    (_one_padded_product, "other bits than computed alone"), (_flat_only, r"x \(2, 5, 16\)"),
], ids=["plain", "float64", "one-padded-product", "2-d-only"])
def test_wrong_matmuls_are_named(fn, message):
    with pytest.raises(AssertionError, match=message):
        lab12.check_invariant_matmul(fn)


def test_a_row_at_a_time_product_is_invariant_and_passes():
    """Every row its own (1, K) @ (K, N) product: invariant, and slow; the notebook measures what it costs."""
    def row_by_row(x, w, tile):
        if not isinstance(tile, int) or tile < 1:
            raise ValueError("tile")
        rows = x.reshape(-1, x.shape[-1])
        return torch.stack([r @ w for r in rows]).reshape(*x.shape[:-1], w.shape[-1])
    lab12.check_invariant_matmul(row_by_row)


# --- Exercise 5 ----------------------------------------------------------------------------------

def _batched_softmax(q, positions, keys, values, block_size):
    """One einsum over all rows, one softmax: the reduction has the batch's shape."""
    group = q.shape[1] // keys.shape[2]
    k, v = keys.repeat_interleave(group, 2), values.repeat_interleave(group, 2)
    scores = torch.einsum("nhd,nlhd->nhl", q, k) / math.sqrt(q.shape[-1])
    hidden = torch.arange(keys.shape[1])[None, :] > positions[:, None]
    return torch.einsum("nhl,nlhd->nhd", scores.masked_fill(hidden[:, None], float("-inf")).softmax(-1), v)


def _padded_sdpa(q, positions, keys, values, block_size):
    """Fused attention over each row's keys padded to L, masked: its kernel splits L by L."""
    mask = (torch.arange(keys.shape[1])[None, :] <= positions[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None], keys.transpose(1, 2), values.transpose(1, 2),
                                          attn_mask=mask, enable_gqa=True)[:, :, 0]


def _repeat_on_the_wrong_axis(q, positions, keys, values, block_size):
    """repeat_interleave(2, group) for repeat_interleave(group, 2): right when the group is 2, wrong otherwise."""
    group = q.shape[1] // keys.shape[2]
    keys = keys.repeat_interleave(2, group) if group != 2 else keys
    values = values.repeat_interleave(2, group) if group != 2 else values
    L = keys.shape[1]
    return as_learner(invariant_attention_dense, invariant_attention=as_learner(invariant_attention))(
        q, positions.clamp(max=L - 1), keys, values, block_size)


def _no_gqa(q, positions, keys, values, block_size):
    k, v = keys.repeat(1, 1, q.shape[1] // keys.shape[2], 1), values.repeat(1, 1, q.shape[1] // keys.shape[2], 1)
    return as_learner(invariant_attention_dense, invariant_attention=as_learner(invariant_attention))(
        q, positions, k, v, block_size)


@pytest.mark.parametrize("fn, message", [
    (_batched_softmax, "computed alone gives other bits"), (_padded_sdpa, "more \\(masked\\) keys"),
    (_no_gqa, "off from causal attention"), (_repeat_on_the_wrong_axis, "each its own"),
], ids=["batched-softmax", "padded-sdpa", "heads-tiled-not-grouped", "repeat-on-the-wrong-axis"])
def test_wrong_attentions_are_named(fn, message):
    with pytest.raises(AssertionError, match=message):
        lab12.check_invariant_attention(fn)


# --- Interview questions -------------------------------------------------------------------------

def test_each_question_takes_its_answer_and_names_each_mistake():
    from autograder.lab12 import questions as q

    q.check_q1_overlap_on_h100(q._q1())
    q.check_q2_bucket_padding(q._q2())
    q.check_q3_padded_intensity(q._q3())
    for check, wrong, message in [
        (q.check_q1_overlap_on_h100, q._q1(handoff_ms=0.0), "hand-off"),
        (q.check_q1_overlap_on_h100, q._q1(overlapped_ms="model"), "outlasts the model"),
        (q.check_q1_overlap_on_h100, q._q1(bytes_per_element=4), "2 bytes"),
        (q.check_q2_bucket_padding, q._q2(over="real"), "COMPUTED"),
        (q.check_q3_padded_intensity, q._q3(tile=1), "padding rows are computed"),
        (q.check_q3_padded_intensity, ACCELERATORS["H100-SXM"].ridge_point("bf16"), "ridge point"),
    ]:
        with pytest.raises(AssertionError, match=message):
            check(wrong)
    with pytest.raises(AssertionError) as err:
        q.check_q2_bucket_padding(0.5)
    assert f"{q._q2():.4g}" not in str(err.value), "a question's check must not print its answer"
