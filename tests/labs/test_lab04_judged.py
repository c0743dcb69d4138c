"""Lab 04's method checks when judged: the learner's code runs in another process (tests/labs/judged.py) and the check
gets Remote handles, as in a graded notebook. The wrong methods are still refused (torch.softmax over the whole row,
a full T x T score matrix, autograd in the tiled backward, a kernel writing past the end of its output, the
package's kernel behind the notebook's launcher, a Triton Function without a Triton kernel), the solution's answers
pass, and the GPU tier's measurements run in the learner's process. One learner process for the module (about 10 s
to start); the cases are the cheap ones (each Triton check below stops at its first case, or runs a small kernel):
about 40 s on a 2-core CPU.
"""

from __future__ import annotations

import pytest

from autograder import lab04
from autograder.checking.thresholds import fixed
from tests.labs.judged import learner_process
from tests.labs.test_lab04_backward_checks import SOLUTION as BACKWARD_SOLUTION
from tests.labs.test_lab04_backward_checks import _SavesLseWithHeadAxis
from tests.labs.test_lab04_checks import (SOLUTION, backward_autograd, backward_full_p, flash_reference,
                                          softmax_torch, tiled_full_attention)
from tests.labs.test_lab04_warmup_checks import SOLUTION as WARMUP_SOLUTION
from tests.labs.test_lab04_warmup_checks import add_no_mask

# what the learner process serves (module-level names of this module)
online_softmax = SOLUTION["online_softmax"]
TiledFunction = BACKWARD_SOLUTION["TiledFunction"]
add = WARMUP_SOLUTION["add"]
TritonFunction = BACKWARD_SOLUTION["TritonFunction"]
SERVED = ["online_softmax", "softmax_torch", "tiled_full_attention", "backward_autograd", "backward_full_p",
          "flash_reference", "add", "add_no_mask", "TiledFunction", "TritonFunction", "_SavesLseWithHeadAxis"]


@pytest.fixture(scope="module")
def learner():
    with learner_process(__name__ if __name__.startswith("tests.") else "tests.labs.test_lab04_judged",
                         SERVED) as names:
        yield names


def test_judged_solutions_pass(learner):
    lab04.check_online_softmax(learner["online_softmax"])
    lab04.check_vector_add(learner["add"])
    lab04.check_attention_function(learner["TiledFunction"], triton=False)


def test_judged_online_softmax_refuses_torch_softmax(learner):
    with pytest.raises(AssertionError, match="wider than one block"):
        lab04.check_online_softmax(learner["softmax_torch"])


@pytest.mark.parametrize("check, wrong, message", [
    (lab04.check_tiled_attention, "tiled_full_attention", "whole"),
    (lab04.check_tiled_backward, "backward_full_p", "whole"),
    (lab04.check_tiled_backward, "backward_autograd", "autograd"),
])
def test_judged_tiled_checks_refuse_the_wrong_method(learner, check, wrong, message):
    with pytest.raises(AssertionError, match=message):
        check(learner[wrong])


def test_judged_warmup_sees_a_store_past_the_end(learner):
    with pytest.raises(AssertionError, match="past the end"):
        lab04.check_vector_add(learner["add_no_mask"])


def test_judged_forward_refuses_the_package_kernel(learner):
    # the kernel's watch raises ReferenceHandedIn there; the judge takes none of the grader's exception types from the
    # kernel, so it arrives as a RemoteError the check turns into its failure, the message kept
    with pytest.raises(AssertionError, match="calls the course's reference"):
        lab04.check_flash_forward(learner["flash_reference"])


def test_judged_function_checks(learner):
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        lab04.check_attention_function(learner["TiledFunction"], triton=True)
    with pytest.raises(AssertionError, match="exactly one log-sum-exp"):
        lab04.check_attention_function(learner["_SavesLseWithHeadAxis"], triton=False)


def test_judged_gpu_tier_measures_where_the_learner_code_runs(learner):
    """The GPU tier's code path on the CPU (small shapes, threshold pinned): the timing and the autograd through the
    learner's Function happen in the learner's process, the verdict here."""
    with fixed(0.0):
        r = lab04.check_flash_speed(learner["flash_reference"], seq_len=32, head_dim=16, batch=1, heads=2, rounds=1,
                                    device="cpu")
        b = lab04.check_flash_backward_speed(learner["TritonFunction"], seq_len=20, head_dim=16, batch=1, heads=2,
                                             rounds=1, device="cpu")
    assert r["speedup"] > 0 and set(b["times_ms"]) == {"sdpa_flash", "learner", "reference"}
