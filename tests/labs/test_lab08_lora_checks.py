"""Lab 08 multi-LoRA checks: the reference passes, the stub and each plausible wrong implementation fail."""

from __future__ import annotations

import pytest
import torch

import inspect
import textwrap

from autograder import lab08
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.serving.lora import lora_delta
from minigpt.serving.lora_bench import hundred_adapters
from minigpt.costmodel.calculators import PRESETS


def stub(x, A, B, adapter_idx, scaling):
    raise NotImplementedError()


def learner_copy(fn):
    """The reference's source pasted into a notebook cell: the learner's own function object."""
    namespace = dict(fn.__globals__)
    exec(compile(textwrap.dedent(inspect.getsource(fn)), "<learner cell>", "exec"), namespace)
    return namespace[fn.__name__]


own_lora = learner_copy(lora_delta)


def lora_wrapper(x, A, B, adapter_idx, scaling):
    return lora_delta(x, A, B, adapter_idx, scaling)


@pytest.mark.parametrize("check", [lab08.check_lora_delta, lab08.check_lora_engine, lab08.check_lora_server])
def test_the_reference_handed_in_is_refused(check):
    with pytest.raises(ReferenceHandedIn, match="this is the course's reference"):
        check(lora_delta)
    # (behind the server the refusal happens in the engine's thread and comes back in the 500 the check reports)
    with pytest.raises(AssertionError, match=r"calls the course's reference \(lora_delta\)"):
        check(lora_wrapper)


def _apply(x, A, B, idx, scaling, mask):
    out = torch.bmm(B[idx], torch.bmm(A[idx], x.unsqueeze(-1))).squeeze(-1) * scaling
    return out * mask[:, None] if mask is not None else out


def rolled_indices(x, A, B, idx, scaling):
    """Each row uses its neighbour's adapter (an off-by-one in the gather)."""
    i = idx.roll(1)
    return _apply(x, A, B, i.clamp(min=0), scaling, (i >= 0).float())


def sorted_indices(x, A, B, idx, scaling):
    """Indices sorted to group the adapters (SGMV-style), but the rows never put back in their order."""
    i = idx.sort().values
    return _apply(x, A, B, i.clamp(min=0), scaling, (i >= 0).float())


def first_row_adapter(x, A, B, idx, scaling):
    """The whole batch uses row 0's adapter (one adapter per batch)."""
    i = idx[:1].expand_as(idx)
    return _apply(x, A, B, i.clamp(min=0), scaling, (i >= 0).float())


def no_scaling(x, A, B, idx, scaling):
    return _apply(x, A, B, idx.clamp(min=0), 1.0, (idx >= 0).float())


def minus_one_is_last(x, A, B, idx, scaling):
    """A[idx] with idx = -1: Python's negative indexing picks the last adapter."""
    return _apply(x, A, B, idx, scaling, None)


def minus_one_is_first(x, A, B, idx, scaling):
    """clamp(min=0) without the mask: rows with no adapter get adapter 0."""
    return _apply(x, A, B, idx.clamp(min=0), scaling, None)


def b_before_a(x, A, B, idx, scaling):
    """(x B_a) A_a: fits when d_in == d_out."""
    i = idx.clamp(min=0)
    out = torch.bmm(torch.bmm(x.unsqueeze(1), B[i]), A[i]).squeeze(1) * scaling
    return out * (idx >= 0).float()[:, None]


def transposed_delta(x, A, B, idx, scaling):
    """x (B_a A_a): the transposed delta, fits when d_in == d_out."""
    i = idx.clamp(min=0)
    out = torch.bmm(x.unsqueeze(1), torch.bmm(B[i], A[i])).squeeze(1) * scaling
    return out * (idx >= 0).float()[:, None]


def clamps_in_place(x, A, B, idx, scaling):
    """Right values, but clamp_ rewrites the caller's indices: the next layer sees no -1 any more."""
    mask = (idx >= 0).float()
    return _apply(x, A, B, idx.clamp_(min=0), scaling, mask)


def loop_over_rows(x, A, B, idx, scaling):
    """Right values, one Python iteration per row."""
    out = torch.zeros(x.shape[0], B.shape[1])
    for n, a in enumerate(idx.tolist()):
        if a >= 0:
            out[n] = scaling * B[a] @ (A[a] @ x[n])
    return out


def loop_over_adapters(x, A, B, idx, scaling):
    """Right values, one iteration per ADAPTER (the SGMV grouping): accepted, it does not grow with the rows."""
    out = torch.zeros(x.shape[0], B.shape[1])
    for a in range(A.shape[0]):
        rows = idx == a
        out[rows] = scaling * (x[rows] @ A[a].T) @ B[a].T
    return out


def merged_per_row(x, A, B, idx, scaling):
    """Right values and a fixed number of calls, but each row's delta B_a A_a merged first: (N, d_out, d_in)."""
    i = idx.clamp(min=0)
    deltas = torch.bmm(B[i], A[i]) * scaling
    return torch.bmm(deltas, x.unsqueeze(-1)).squeeze(-1) * (idx >= 0).float()[:, None]


def test_a_delta_merged_per_row_is_refused_by_its_size():
    with pytest.raises(AssertionError, match=r"built a tensor of shape \(32, 128, 128\)"):
        lab08.check_lora_delta(merged_per_row)


def test_reference_passes():
    lab08.check_lora_delta(own_lora)
    lab08.check_lora_delta(loop_over_adapters)


@pytest.mark.parametrize("fn, message", [
    (stub, "not implemented"),
    (rolled_indices, "ITS OWN index"),
    (sorted_indices, "ITS OWN index"),
    (first_row_adapter, "ITS OWN index"),
    (no_scaling, "scaling"),
    (minus_one_is_last, "negative"),
    (minus_one_is_first, "adapter 0's delta"),
    (b_before_a, "before A|transposed|raised"),
    (transposed_delta, "transposed|raised"),
    (clamps_in_place, "in place"),
    (loop_over_rows, "loops over rows"),
])
def test_wrong_lora_delta_rejected(fn, message):
    with pytest.raises(AssertionError, match=message):
        lab08.check_lora_delta(fn)


def test_engine_check_passes_reference_and_mixes_adapters():
    counts = lab08.check_lora_engine(own_lora)
    assert counts["mixed_steps"] >= 3


@pytest.mark.parametrize("fn", [first_row_adapter, minus_one_is_last, stub])
def test_engine_check_rejects(fn):
    with pytest.raises(AssertionError):
        lab08.check_lora_engine(fn)


def test_server_check_passes_reference_rejects_wrong_rows():
    texts = lab08.check_lora_server(own_lora)
    assert len(set(texts.values())) >= 3
    with pytest.raises(AssertionError, match="answered"):
        lab08.check_lora_server(first_row_adapter)
    with pytest.raises(AssertionError, match="is your lora_delta implemented"):
        lab08.check_lora_server(stub)


def test_interview_questions():
    h = hundred_adapters(PRESETS["Llama-3-8B"], 16)
    lab08.check_q1_adapter_mib(h["mib_per_adapter"])
    lab08.check_q2_hundred_adapters_share(h["percent_of_base"])
    with pytest.raises(AssertionError, match="float32"):
        lab08.check_q1_adapter_mib(2 * h["mib_per_adapter"])
    with pytest.raises(AssertionError, match="GQA"):
        lab08.check_q1_adapter_mib(h["mib_per_adapter"] * (4 * 8192 + 3 * 18432) / (2 * 8192 + 2 * 5120 + 3 * 18432))
    with pytest.raises(AssertionError, match="counts A"):         # r * d_in per projection only: 5d + q + ff per layer
        lab08.check_q1_adapter_mib(32 * 16 * (5 * 4096 + 4096 + 14336) * 2 / 2**20)
    with pytest.raises(AssertionError, match="percentage"):
        lab08.check_q2_hundred_adapters_share(h["percent_of_base"] / 100)
    lab08.check_q5_gather_mib(32 * h["mib_per_adapter"])
    with pytest.raises(AssertionError, match="in place"):       # the 4 distinct adapters: what SGMV reads
        lab08.check_q5_gather_mib(4 * h["mib_per_adapter"])
    with pytest.raises(AssertionError, match="one per row"):
        lab08.check_q5_gather_mib(h["mib_per_adapter"])
