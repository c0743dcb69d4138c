"""The differential test that shows a mutant equivalent (autograder/mutation/equivalence.py), and how a failed
check cell is told apart from a crash and a broken run (outcome.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, answers, differential, same_result
from autograder.mutation.outcome import BROKEN, CHECK, CRASH, classify

CELL = '''def last_slot(table, position, block_size):
    ### BEGIN SOLUTION
    if position < 0 or position // block_size >= len(table):
        raise ValueError("outside the table")
    return table[position // block_size] * block_size + position % block_size
    ### END SOLUTION
'''
CONTRACT = Contract("last_slot", lambda ns: st.tuples(st.lists(st.integers(0, 50), max_size=5), st.integers(-2, 30),
                                                      st.integers(1, 6)),
                    corners=lambda ns: [([3, 1], p, 2) for p in (-1, 0, 3, 4)])


def test_a_rewrite_with_the_same_behaviour_is_shown_equivalent():
    same = CELL.replace("position // block_size >= len(table)", "position >= len(table) * block_size")
    assert differential(CONTRACT, {}, CELL, same) is None


def test_a_boundary_the_checks_might_miss_is_split_with_the_input_that_shows_it():
    wrong = CELL.replace("position < 0", "position < -1")
    found = differential(CONTRACT, {}, CELL, wrong)
    assert found is not None and "Raised" in found and "-1" in found


def test_results_compare_dtype_shape_device_and_values():
    a = torch.tensor([1.0, float("nan")])
    assert same_result(a, a.clone()) and not same_result(a, a.double()) and not same_result(a, torch.tensor([1.0, 2.0]))
    assert same_result(torch.empty(2, device="meta"), torch.empty(2, device="meta"))
    assert not same_result(torch.empty(2, device="meta"), torch.empty(2))
    assert same_result([Raised("ValueError"), 1.5], [Raised("ValueError"), 1.5])
    assert not same_result(Raised("ValueError"), Raised("TypeError"))


def test_interview_answers_are_compared_value_by_value():
    assert answers({}, "q1 = 2 ** 10\n", "q1 = 2 ** 10 + 0\n") is None
    assert "q1" in answers({}, "q1 = 2 ** 10\n", "q1 = 2 ** 10 + 1\n")


def _raised(fn):
    try:
        fn()
    except Exception as err:      # noqa: BLE001
        return err
    raise AssertionError("did not raise")


def test_a_failed_check_cell_is_a_check_a_crash_or_broken():
    from autograder.harness import expect_value_error

    ns: dict = {}
    exec(compile("def bad(x):\n    return 1 / x\n", "<mutant>", "exec"), ns)
    verdict = _raised(lambda: expect_value_error("Exercise 1 (bad)", ns["bad"], 1))   # the check says why
    assert classify(verdict, {"<mutant>"}) == CHECK
    assert classify(_raised(lambda: ns["bad"](0)), {"<mutant>"}) == CRASH            # its own code raised
    assert classify(_raised(lambda: sorted([1, "a"])), {"<mutant>"}) == BROKEN       # neither


def test_a_forked_contract_run_sends_plain_data_back_and_a_fault_is_a_result():
    """guard_page.in_fork: the child's result crosses as JSON and safetensors (no pickle), structure and dtypes kept;
    an exception is Raised(its type); a read of the guard page after a tensor is Raised("OutOfBoundsAccess")."""
    import ctypes
    import math

    import torch

    from autograder.mutation.contracts.guard_page import OUT_OF_BOUNDS, guarded, in_fork
    from autograder.mutation.equivalence import Raised

    sent = (torch.arange(6.0).view(2, 3).t(), [1, 2.5, float("nan"), None, "x", True], {"a": Raised("ValueError")},
            torch.zeros(0, dtype=torch.int64))
    got = in_fork(lambda: sent)
    assert isinstance(got, tuple) and torch.equal(got[0], sent[0]) and got[1][:2] == [1, 2.5]
    assert math.isnan(got[1][2]) and got[1][3:] == [None, "x", True] and got[2] == {"a": Raised("ValueError")}
    assert got[3].dtype == torch.int64 and got[3].shape == (0,)

    def raises():
        raise KeyError("x")

    assert in_fork(raises) == Raised("KeyError")
    tensor = guarded((16,), torch.float32)
    assert in_fork(lambda: float(tensor.sum())) == 0.0
    assert in_fork(lambda: ctypes.string_at(tensor.data_ptr() + tensor.numel() * 4, 4)) == Raised(OUT_OF_BOUNDS)
