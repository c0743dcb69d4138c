"""autograder.harness: GPU gating, ratio-based speed checks, silencing (no absolute-time assertions)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

from autograder import harness


def _sleeper(seconds: float):
    """A call that costs `seconds` on the clock of `costs_as_time` (no verdict depends on the machine's load)."""
    return lambda: seconds


@pytest.fixture
def costs_as_time(monkeypatch):
    """compare() times each call with time_call: here a call's time is the cost it returns."""
    monkeypatch.setattr("minigpt.timing.time_call", lambda fn, device="cpu": fn())


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(harness, "gpu_available", lambda: False)


def test_under_autograde_reads_env(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert not harness.under_autograde()
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert not harness.under_autograde()
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert harness.under_autograde()


def test_gpu_available_matches_torch():
    import torch
    assert harness.gpu_available() == torch.cuda.is_available()


def test_require_gpu_raises_under_autograde_without_gpu(no_gpu, monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="needs a GPU: fused decode speed; this machine has none, "
                                             "so no points are awarded"):
        harness.require_gpu("fused decode speed")
    assert "SKIPPED" not in capsys.readouterr().out


def test_require_gpu_prints_skipped_otherwise(no_gpu, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert harness.require_gpu("fused decode speed") is False
    out, err = capsys.readouterr()
    assert out.strip() == ("SKIPPED (needs a GPU): fused decode speed. "
                           "Run this cell on a machine with a CUDA GPU.")
    assert err == ""


def test_require_gpu_true_with_gpu(monkeypatch, capsys):
    monkeypatch.setattr(harness, "gpu_available", lambda: True)
    for mode in ("autograde", "validate"):
        monkeypatch.setenv("NBGRADER_EXECUTION", mode)
        assert harness.require_gpu("anything") is True
    assert capsys.readouterr().out == ""


# Fake candidates of known relative cost: sleeping does not depend on CPU load, so the ratios
# hold on a busy 2-core machine. baseline 4 units, reference 1 unit (4x), fast learner 1 unit,
# slow learner 4 units (1x).
UNIT = 0.01


def test_check_speedup_passes_fast_candidate(costs_as_time):
    out = harness.check_speedup(_sleeper(UNIT), _sleeper(4 * UNIT), _sleeper(UNIT), what="fake",
                                min_fraction={"cpu": 0.5, "cuda": 0.5}, repeats=3)
    assert set(out) == {"speedup", "reference_speedup", "threshold", "rounds"}
    assert 2.5 < out["reference_speedup"] < 5.0
    assert 2.5 < out["speedup"] < 5.0
    assert out["threshold"] == pytest.approx(0.5 * out["reference_speedup"])
    assert out["speedup"] >= out["threshold"]


def test_check_speedup_fails_slow_candidate_with_all_numbers(costs_as_time):
    with pytest.raises(AssertionError) as info:
        harness.check_speedup(_sleeper(4 * UNIT), _sleeper(4 * UNIT), _sleeper(UNIT), what="fake cache",
                              min_fraction={"cpu": 0.5}, repeats=3)
    msg = str(info.value)
    assert "fake cache" in msg
    # learner ~1x, reference ~4x, threshold ~2x: all three numbers are in the message
    assert msg.count("x") >= 3 and "reference" in msg and "at least" in msg


def test_check_speedup_threshold_is_relative_to_reference(costs_as_time):
    # Same candidate and reference cost: passes with fraction 0.5, fails with fraction 2.0.
    args = (_sleeper(UNIT), _sleeper(3 * UNIT), _sleeper(UNIT))
    harness.check_speedup(*args, what="x", min_fraction={"cpu": 0.5}, repeats=3)
    with pytest.raises(AssertionError):
        harness.check_speedup(*args, what="x", min_fraction={"cpu": 2.0}, repeats=3)


def test_check_speedup_floor_of_its_own(costs_as_time):
    """`min_speedup` is a bar beside the fraction: a candidate no faster than the baseline reaches 30% of a 4x
    reference, yet fails a floor of 1.35x, in every round."""
    args = (_sleeper(4 * UNIT), _sleeper(4 * UNIT), _sleeper(UNIT))
    harness.check_speedup(*args, what="x", min_fraction={"cpu": 0.2}, repeats=3)
    with pytest.raises(AssertionError, match="and at least 1.35x is needed"):
        harness.check_speedup(*args, what="x", min_fraction={"cpu": 0.2}, repeats=3, min_speedup=1.35)
    harness.check_speedup(_sleeper(2 * UNIT), *args[1:], what="x", min_fraction={"cpu": 0.2}, repeats=3,
                          min_speedup=1.35)


def test_check_speedup_measures_again_before_failing(costs_as_time):
    """A round below the threshold is measured again (a busy machine gets more tries); the best round counts, and a
    candidate that is slow in every round fails after `rounds` rounds."""
    costs = iter([4 * UNIT] * 3 + [UNIT] * 100)      # the first round's three samples (repeats=3, no warm-up) slow
    calls: list[str] = []

    def sometimes_slow():
        calls.append("c")
        return next(costs)

    out = harness.check_speedup(sometimes_slow, _sleeper(4 * UNIT), _sleeper(UNIT), what="x",
                                min_fraction={"cpu": 0.5}, repeats=3, warmup=0, rounds=3)
    assert out["rounds"] == 2 and len(calls) == 6
    slow = _sleeper(4 * UNIT)
    counted = []
    with pytest.raises(AssertionError, match="best of 3 measurements"):
        harness.check_speedup(lambda: counted.append(1) or slow(), _sleeper(4 * UNIT), _sleeper(UNIT), what="x",
                              min_fraction={"cpu": 0.5}, repeats=3, warmup=0, rounds=3)
    assert len(counted) == 9


def test_check_speedup_runs_interleaved_with_warmup():
    calls: list[str] = []
    harness.check_speedup(lambda: calls.append("c"), lambda: calls.append("b"), lambda: calls.append("r"),
                          what="x", min_fraction={"cpu": 0.0}, repeats=4, warmup=2)
    assert calls.count("c") == calls.count("b") == calls.count("r") == 6
    assert calls[:6] == ["b", "c", "r", "b", "c", "r"]          # warm-up rounds
    assert len(set(calls[6:9])) == 3                              # each round runs all three


def test_each_call_its_own_input_never_reuses_an_input_of_a_sequence():
    """The i-th call gets the i-th input, kept with its output; a call past the last input fails, it never wraps."""
    seen: list[int] = []
    contender = harness.EachCallItsOwnInput(lambda x: seen.append(x) or 10 * x, [3, 4])
    assert (contender(), contender()) == (30, 40)
    assert seen == [3, 4] and contender.outputs == [(0, 30), (1, 40)]
    with pytest.raises(AssertionError, match="no input is ever reused"):
        contender()
    assert seen == [3, 4]


def test_each_call_its_own_input_asks_a_function_once_per_call_index():
    """inputs(i) is asked once per index and remembered; two contenders on it see the same i-th input, each its own
    copy, and their outputs compare index by index."""
    asked: list[int] = []

    def draw(i: int) -> list[int]:
        asked.append(i)
        return [i, i + 1]

    doubled = harness.EachCallItsOwnInput(lambda x: [2 * v for v in x], draw)
    wrong_on_the_third = harness.EachCallItsOwnInput(lambda x: [2 * v for v in x] if x[0] != 2 else [0, 0], draw)
    for _ in range(5):
        doubled()
        wrong_on_the_third()
    assert asked == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [doubled.input_at(i) for i in range(5)] == [wrong_on_the_third.input_at(i) for i in range(5)]
    assert doubled.input_at(3) is not wrong_on_the_third.input_at(3)
    assert len(asked) == 10                                   # remembered: input_at asks nothing again
    same = lambda got, want: got == want                      # noqa: E731
    assert doubled.first_difference(doubled, same) is None
    assert wrong_on_the_third.first_difference(doubled, same) == 2


def test_each_call_its_own_input_gives_every_round_of_check_speedup_new_inputs(costs_as_time):
    """check_speedup measures again (warm-up and repeats each round): with a function of the index, no call of any
    round sees an input an earlier call saw."""
    given: list[int] = []
    slow_first_round = iter([4 * UNIT] * 4 + [UNIT] * 100)
    candidate = harness.EachCallItsOwnInput(lambda x: given.append(x) or next(slow_first_round), lambda i: 100 + i)
    harness.check_speedup(candidate, _sleeper(4 * UNIT), _sleeper(UNIT), what="x", min_fraction={"cpu": 0.5},
                          repeats=3, warmup=1, rounds=3)
    assert given == list(range(100, 108)) and len(set(given)) == len(given)


def test_check_speedup_unknown_device_class_raises(monkeypatch):
    import minigpt.timing
    monkeypatch.setattr(minigpt.timing, "device_class", lambda device=None: "cuda-sm80")
    with pytest.raises(AssertionError, match="no speed threshold for device class 'cuda-sm80'"):
        harness.check_speedup(_sleeper(0), _sleeper(0), _sleeper(0), what="x", min_fraction={"cpu": 0.5})


def test_threshold_for_cuda_fallback():
    assert harness.threshold_for({"cpu": 0.5, "cuda": 0.7}, "cuda-sm90") == 0.7
    assert harness.threshold_for({"cuda-sm90": 0.9, "cuda": 0.7}, "cuda-sm90") == 0.9
    assert harness.threshold_for({"cpu": 0.5}, "cpu") == 0.5
    with pytest.raises(AssertionError):
        harness.threshold_for({"cuda": 0.7}, "cpu")


def test_quiet_silences_warnings_logging_and_stderr(capfd):
    with harness.quiet():
        warnings.warn("should not be seen", UserWarning)
        logging.getLogger("some.lib").error("should not be seen either")
        print("to stderr", file=sys.stderr)
        os.write(2, b"C-level stderr\n")
        print("to stdout")
    out, err = capfd.readouterr()
    assert "to stdout" in out
    assert err == ""
    os.write(2, b"after\n")                     # fd 2 is restored afterwards
    assert capfd.readouterr().err == "after\n"


def test_quiet_disables_tqdm_and_restores_state(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    before = logging.root.manager.disable
    with harness.quiet():
        assert os.environ["TQDM_DISABLE"] == "1"
    assert "TQDM_DISABLE" not in os.environ
    assert logging.root.manager.disable == before


def test_quiet_silences_tqdm(capfd):
    from tqdm import tqdm
    with harness.quiet():
        for _ in tqdm(range(3)):
            pass
    assert capfd.readouterr().err == ""


def test_quiet_lets_assertions_through():
    with pytest.raises(AssertionError, match="wrong"):
        with harness.quiet():
            raise AssertionError("wrong")


# ---------------------------------------------------------------- the shared numeric-answer checker

def test_check_answer_accepts_exact_ints_and_close_floats():
    from autograder.harness import check_answer

    check_answer(52, 52, "Q", unit="requests")
    check_answer(0.5005, 0.5, "Q", unit="GiB")                    # within the default 1e-3
    check_answer(3.0, 3.0, "Q", unit="ms")


@pytest.mark.parametrize("answer, expected, rel, fragment", [
    (53, 52, 1e-3, "is not right (exact)"),
    (52.0, 52, 1e-3, "right but is a float"),
    (0.51, 0.5, 1e-3, "relative tolerance 0.001"),
    (None, 0.5, 1e-3, "answer with a finite number"),
    (True, 1, 1e-3, "answer with a finite int"),
    (float("nan"), 0.5, 1e-3, "finite"),
    ("52", 52, 1e-3, "finite int"),
])
def test_check_answer_rejects_wrong_answers_naming_the_unit(answer, expected, rel, fragment):
    from autograder.harness import check_answer

    with pytest.raises(AssertionError) as e:
        check_answer(answer, expected, "Q9 (thing)", unit="requests", rel=rel)
    assert fragment in str(e.value) and "[answer in requests]" in str(e.value) and "Q9 (thing)" in str(e.value)


def test_check_answer_diagnoses_known_wrong_values_and_hides_the_answer_unless_asked():
    from autograder.harness import check_answer

    gib = 2.0
    with pytest.raises(AssertionError) as e:
        check_answer(gib * 2**30 / 1e9, gib, "Q1", [(gib * 2**30 / 1e9, "that is GB, not GiB.")], unit="GiB",
                     hint="never shown when a diagnosis matched")
    msg = str(e.value)
    assert "Likely mistake: that is GB, not GiB." in msg and "never shown" not in msg and "expected" not in msg
    with pytest.raises(AssertionError) as e:
        check_answer(7, 8, "f(x)", {7: "off by one."}, unit="blocks", reveal=True)
    assert "expected 8 blocks" in str(e.value) and "off by one." in str(e.value)
    with pytest.raises(AssertionError) as e:
        check_answer(1.0, 8.0, "Q", unit="s", hint="Divide the bytes by the bandwidth.")
    assert "Divide the bytes by the bandwidth." in str(e.value)


# ---------------------------------------------------------------- running learner code

def test_call_learner_turns_failures_into_graded_messages():
    from autograder.harness import call_learner

    def stub(*_):
        raise NotImplementedError()

    def crash(x):
        return [][x]

    class Expected(Exception):
        pass

    def out_of_room():
        raise Expected("no room")

    assert call_learner("double", lambda x: 2 * x, 21) == 42
    with pytest.raises(AssertionError, match="double is not implemented yet"):
        call_learner("double", stub, 1)
    with pytest.raises(AssertionError, match=r"lookup raised IndexError: .* \(on 3 items\)"):
        call_learner("lookup", crash, 5, context="on 3 items")
    with pytest.raises(AssertionError, match="kernel is not implemented yet"):
        call_learner("kernel", lambda: (_ for _ in ()).throw(RuntimeError("NotImplementedError in the interpreter")))
    with pytest.raises(AssertionError, match="expected your function"):
        call_learner("double", None, 1)
    with pytest.raises(Expected):
        call_learner("alloc", out_of_room, passthrough=(Expected,))
    with pytest.raises(AssertionError, match="the learner's own assertion"):
        call_learner("f", lambda: (_ for _ in ()).throw(AssertionError("the learner's own assertion")))


# ---------------------------------------------------------------- numbers against a tolerance

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("err, tol, ok", [
    (0.1, 0.2, True), (0.2, 0.2, True), (0.3, 0.2, False), (NAN, 1.0, False), (INF, 1.0, False), (-INF, 1.0, False),
    ([0.1, 0.01], 0.2, True), ([0.1, NAN], 0.2, False), ([NAN, 0.1], 0.2, False), ([0.1, INF], INF, False)],
    ids=lambda x: repr(x))
def test_within_never_passes_nan_or_inf(err, tol, ok):
    assert harness.within(err, tol) is ok


def test_within_compares_tensors_elementwise_with_a_tensor_tolerance():
    import torch

    bound = torch.tensor([1.0, 2.0])
    assert harness.within(torch.tensor([1.0, 2.0]), bound)
    assert not harness.within(torch.tensor([1.5, 0.0]), bound)          # the first bound is 1, not max(bound)
    assert not harness.within(torch.tensor([0.0, NAN]), bound)


def test_at_least_never_passes_nan_or_inf():
    assert harness.at_least(2.0, 1.0) and harness.at_least(1.0, 1.0)
    assert not harness.at_least(0.5, 1.0)
    assert not harness.at_least(NAN, 1.0) and not harness.at_least(INF, 1.0)


def test_assert_finite_names_the_exercise_and_where_the_nan_or_inf_is():
    import torch

    want = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    harness.assert_finite(want + 1e-7, "Exercise 9 (f)", want)
    for poison in (NAN, INF, -INF):
        got = want.clone()
        got[1, 0] = poison
        with pytest.raises(AssertionError, match=r"^Exercise 9 \(f\) produced NaN/inf \(1 of 4 values, the first at "
                                                 r"index \(1, 0\)\)\. Mind the max\.$"):
            harness.assert_finite(got, "Exercise 9 (f)", want, hint="Mind the max.")
    with pytest.raises(AssertionError, match=r"^Exercise 9 \(f\) produced NaN/inf \(got nan\)\.$"):
        harness.assert_finite(NAN, "Exercise 9 (f)")


def test_assert_finite_keeps_masked_minus_inf_right():
    """A reference with -inf at masked positions: the same -inf there passes, +inf or NaN there fails."""
    import torch

    want = torch.tensor([[0.5, -INF], [1.0, 2.0]])
    harness.assert_finite(want.clone(), "Exercise 9 (masked scores)", want)
    for wrong in (INF, NAN):
        with pytest.raises(AssertionError, match=r"produced NaN/inf \(1 of 4 values, the first at index \(0, 1\)\)"):
            harness.assert_finite(torch.tensor([[0.5, wrong], [1.0, 2.0]]), "Exercise 9 (masked scores)", want)


def test_assert_finite_ignores_integer_tensors_and_matching_infinities():
    import torch

    harness.assert_finite(torch.tensor([1, 2, 3]), "Exercise 9 (codes)")
    harness.assert_finite(torch.tensor([-INF, 1.0]), "Exercise 9 (lse)", torch.tensor([-INF, 0.0]))
    with pytest.raises(AssertionError, match=r"^Exercise 9 \(lse\) produced NaN/inf"):
        harness.assert_finite(torch.tensor([-INF, 1.0]), "Exercise 9 (lse)")


def test_expect_value_error_wants_a_value_error_that_names_the_problem():
    from autograder.harness import expect_value_error

    def refuses(n):
        raise ValueError(f"n={n} is past the capacity 8")
    expect_value_error("n=9", refuses, 9, naming=(8,))
    cases = [(lambda n: n, "nothing was raised"), (lambda n: 1 / 0, "got ZeroDivisionError"),
             (refuses, "should name 7"), (lambda n: (_ for _ in ()).throw(ValueError()), "should name the problem")]
    for fn, message in cases:
        with pytest.raises(AssertionError, match=message):
            expect_value_error("n=9", fn, 9, naming=(7,) if fn is refuses else ())

    def stub(n):
        raise NotImplementedError
    with pytest.raises(AssertionError, match="not implemented yet"):
        expect_value_error("n=9", stub, 9)
