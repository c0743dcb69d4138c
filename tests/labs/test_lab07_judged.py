"""Lab 07 checks given Remotes (judged, autograder/judging/judge.py): the verdicts the in-process tests expect hold when
the learner's code runs on the other side of the wire (the kernel's side is a thread here: judged_pair.py)."""

from __future__ import annotations

import pytest

from autograder import lab07
from tests.labs.judged_pair import judged
from tests.labs.test_lab07_checks import lm_head_all_reduced, own_vocab_logits, ref_make_cache


def test_vocab_parallel_ranks_are_replayed_here_calling_the_remote_function():
    with judged(good=own_vocab_logits, reduced=lm_head_all_reduced) as learner:
        lab07.check_vocab_parallel_logits(learner.good)
        with pytest.raises(AssertionError, match="gather the pieces along the vocabulary"):
            lab07.check_vocab_parallel_logits(learner.reduced)


def test_cache_ranks_run_where_the_learner_function_lives():
    with judged(make_cache=ref_make_cache) as learner:
        lab07.check_tp_kv_cache(learner.make_cache)


def test_a_rank_runner_replaced_in_the_kernel_earns_nothing(monkeypatch):
    """Judged, the ranks run in the kernel's copy of this module; one that reports no ranks must not pass."""
    monkeypatch.setattr(lab07, "_on_ranks", lambda *args, **kwargs: [])
    with pytest.raises(AssertionError, match="did not report one result each"):
        lab07.check_tp_kv_cache(ref_make_cache)
