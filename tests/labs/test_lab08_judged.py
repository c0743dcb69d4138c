"""Lab 08 checks given Remotes (judged, autograder/judging/judge.py): the verdicts the in-process tests expect hold when
the learner's functions run on the other side of the wire (the kernel's side is a thread here: judged_pair.py)."""

from __future__ import annotations

import pytest

from autograder import lab08
from autograder.lab08.admission import _check_admission_unit
from autograder.lab08.streaming import _check_sse_unit
from minigpt.serving.admission import admitted
from minigpt.serving.streaming import sse_stream
from tests.labs.judged_pair import judged
from tests.labs.learner_copy import as_learner
from tests.labs.test_lab08_lora_checks import loop_over_rows, merged_per_row, own_lora
from tests.labs.test_lab08_server_checks import admit_waits, sse_no_abort


def test_a_loop_over_rows_is_counted_where_it_runs():
    """The torch calls are counted in the kernel: counted in the judge, a Python loop would make none there."""
    with judged(good=own_lora, loop=loop_over_rows, merged=merged_per_row) as learner:
        lab08.check_lora_delta(learner.good)
        with pytest.raises(AssertionError, match="loops over rows"):
            lab08.check_lora_delta(learner.loop)
        with pytest.raises(AssertionError, match="built a tensor of shape"):     # traced in the kernel too
            lab08.check_lora_delta(learner.merged)


def test_stream_handler_scenarios_run_in_the_kernel_and_are_judged_here():
    with judged(good=as_learner(sse_stream), no_abort=sse_no_abort) as learner:
        _check_sse_unit(learner.good)
        with pytest.raises(AssertionError, match="aborted exactly once"):
            _check_sse_unit(learner.no_abort)


def test_admission_scenario_runs_in_the_kernel_and_is_judged_here():
    with judged(good=as_learner(admitted), waits=admit_waits) as learner:
        _check_admission_unit(learner.good)
        with pytest.raises(AssertionError, match="WAITED"):
            _check_admission_unit(learner.waits)
