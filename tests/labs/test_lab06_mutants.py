"""Lab 06: wrong versions of the notebook's own solution cells, one edit each, that mutation testing
(`make mutation LAB=06`) found passing; each check below now rejects its edit, with a message that says why."""

from __future__ import annotations

import pytest

from autograder import lab06
from autograder.lab06.generator import _check_generate
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import torch
from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.engine.speculative import sampling_probs, verify_draft
from minigpt.generate import Generation, StopRule, check_request
from minigpt.sampling import SamplingParams, filter_logits, make_generator
from minigpt.tokenizer import EOT_ID
"""

CHECKS = {"ex1_code": ("truncate_cache", lab06.check_truncate_cache),
          "ex2_code": ("sampling_probs", lab06.check_sampling_probs),
          "ex3_code": ("verify_draft", lab06.check_verify_draft),
          "ex4_code": ("generate_speculative", lambda fn: _check_generate(fn, seed=0)),   # the loop, on the tiny pair
          "ex5_code": ("ngram_propose", lab06.check_ngram_propose),
          "ex6_code": (("acceptance_rate", "expected_tokens_per_round"), lab06.check_acceptance_stats)}

# (cell, the edit, what the check's message says)
EDITS = [
    ("ex1_code", {"if isinstance(length, bool) or not": "if isinstance(length, bool) and not"}, "truncate_cache"),
    ("ex2_code", {"one_hot(logits.argmax(-1), logits.shape[-1]).float()":
                  "one_hot(logits.argmax(1), logits.shape[-1]).float()"}, "the last one the vocabulary"),
    ("ex2_code", {"flat = logits.reshape(-1, logits.shape[-1])": "flat = logits.reshape(-1, logits.shape[1])"},
     "bfloat16 logits"),
    ("ex2_code", {"    logits = logits.float()\n": "    logits = logits\n"}, "float32 probabilities"),
    ("ex2_code", {"logits.shape[-1]).float()": "logits.shape[-1])"}, "float32 probabilities"),
    ("ex3_code", {"return [int(torch.multinomial(p[0], 1, generator=generator))], p.new_zeros(0)":
                  "return [int(torch.multinomial(p[0], 1))], p.new_zeros(0)"}, "generator"),
    ("ex3_code", {"generator=generator))], p.new_zeros(0)": "generator=generator))], p.new_zeros(1)"}, "shape \\(0,\\)"),
    ("ex4_code", {"stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)":
                  "stop = StopRule(max_new_tokens, stop_token_ids, (), tokenizer)"}, "stop_strings"),
    ("ex4_code", {'reason = "length" if max_new_tokens == 0 else None': "reason = None"}, "max_new_tokens=0"),
    ("ex4_code", {"n, L = len(emitted) - 1, len(context)": "n, L = len(emitted) - 2, len(context)"}, "computed again"),
    ("ex4_code", {"truncate_cache(t_cache, L + n)": "truncate_cache(t_cache, L - n)"}, "computed again"),
    ("ex4_code", {"truncate_cache(d_cache, min(d_cache.length, L + n))":
                  "truncate_cache(d_cache, min(d_cache.length, L - n))"}, "computed again"),
    ("ex4_code", {"prompt_tokens=len(ids))": "prompt_tokens=None)"}, "prompt_tokens"),
    ("ex5_code", {"if k == 0:": "if k == 1:"}, "k=1"),
    ("ex6_code", {"return torch.minimum(p, q).sum(-1)": "return torch.minimum(p, q).sum(1)"}, "LAST axis"),
]


def _edited(cell: str, edit: dict[str, str]):
    names, _ = CHECKS[cell]
    ns = solution_cells("06_speculative_decoding", cell, preamble=PREAMBLE, replace=edit)
    return [ns[n] for n in names] if isinstance(names, tuple) else [ns[names]]


@pytest.mark.parametrize("cell", sorted(CHECKS))
def test_the_unedited_cell_passes(cell):
    CHECKS[cell][1](*_edited(cell, {}))


@pytest.mark.parametrize("cell, edit, match", EDITS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(EDITS)])
def test_each_edit_is_rejected(cell, edit, match):
    with pytest.raises(AssertionError, match=match):
        CHECKS[cell][1](*_edited(cell, edit))
