"""Lab 07 checks given Remotes (judged, autograder/judging/judge.py): the verdicts the in-process tests expect hold when
the learner's code runs on the other side of the wire (the kernel's side is a thread here: judged_pair.py, or a
second process: judged.py). The judge plays the ranks itself: the learner's layers and functions are called over the
wire, their collectives are requests the judge answers and counts, and nothing the kernel runs for itself decides."""

from __future__ import annotations

import pytest
import torch

from autograder import lab07
from tests.labs.judged import learner_process
from tests.labs.judged_pair import judged
from tests.labs.test_lab07_checks import (AllReduceColumn, NoAllReduceRow, OwnColumn, OwnRow, full_cache,  # noqa: F401
                                          lm_head_all_reduced, own_vocab_logits, ref_make_cache, shared_layer_cache)


def test_parallel_linears_run_in_the_judge_calling_the_remote_layers():
    with judged(column=OwnColumn, row=OwnRow, reducing=AllReduceColumn, partial=NoAllReduceRow) as learner:
        lab07.check_parallel_linears(learner.column, learner.row)
        with pytest.raises(AssertionError, match="column-parallel layer must NOT all-reduce"):
            lab07.check_parallel_linears(learner.reducing, learner.row)
        with pytest.raises(AssertionError, match="partial sum"):
            lab07.check_parallel_linears(learner.column, learner.partial)


def test_vocab_parallel_ranks_are_replayed_here_calling_the_remote_function():
    with judged(good=own_vocab_logits, reduced=lm_head_all_reduced) as learner:
        lab07.check_vocab_parallel_logits(learner.good)
        with pytest.raises(AssertionError, match="gather the pieces along the vocabulary"):
            lab07.check_vocab_parallel_logits(learner.reduced)


def test_the_learner_cache_is_read_over_the_wire_and_generation_runs_in_the_judge():
    with judged(make_cache=ref_make_cache, shared=shared_layer_cache) as learner:
        lab07.check_tp_kv_cache(learner.make_cache)
        with pytest.raises(AssertionError, match="share their buffers"):
            lab07.check_tp_kv_cache(learner.shared)


def forge_the_kernel_side() -> None:
    """What a notebook cell can do in its own kernel: replace lab 07's rank runner there (the checks used to run the
    ranks in the kernel through it) by one that reports what right ranks would: the one-process logits with two
    all-reduces a layer (Exercise 2), the one-process tokens with the right heads and bytes (Exercise 4)."""
    import autograder.lab07 as kernel_lab07
    from minigpt.engine.cached_generation import generate_kv_cache
    from minigpt.model import GPT
    from minigpt.parallel import sharding

    def forged_ranks(worker, tp, *args, **options):
        if worker.__name__ == "_cache_worker":
            _, name, full_state, prompt, n = args
        else:
            name, full_state = args[:2]
        cfg = kernel_lab07.CONFIGS[name]
        whole = GPT(cfg).eval()
        whole.load_state_dict(full_state)
        if worker.__name__ == "_cache_worker":
            local = len(sharding.kv_heads(cfg, tp, 0))
            nbytes = 2 * cfg.n_layers * (len(prompt) + n) * local * cfg.head_dim * 4
            return [(generate_kv_cache(whole, prompt, n).tokens, [local] * cfg.n_layers, nbytes)] * tp
        with torch.no_grad():
            logits = whole(kernel_lab07._tokens(cfg))
        calls = 2 * cfg.n_layers
        return [(logits.clone(), {"all_reduce": calls}, {"all_reduce": calls * logits[..., :cfg.d_model].numel() * 4})
                for _ in range(tp)]
    kernel_lab07._on_ranks = forged_ranks


def test_a_rank_runner_forged_in_the_kernel_earns_nothing():
    """The kernel is a second process here, so what it patches is its own: the judge never asks it to run ranks."""
    module = __name__ if __name__.startswith("tests.") else "tests.labs.test_lab07_judged"
    served = ["forge_the_kernel_side", "OwnColumn", "NoAllReduceRow", "OwnRow", "full_cache", "ref_make_cache"]
    with learner_process(module, served) as learner:
        learner["forge_the_kernel_side"]()
        with pytest.raises(AssertionError, match="partial sum"):
            lab07.check_parallel_linears(learner["OwnColumn"], learner["NoAllReduceRow"])
        with pytest.raises(AssertionError, match="expected 1 each"):
            lab07.check_tp_kv_cache(learner["full_cache"])
        lab07.check_parallel_linears(learner["OwnColumn"], learner["OwnRow"])
        lab07.check_tp_kv_cache(learner["ref_make_cache"])
