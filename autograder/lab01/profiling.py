"""The profiling questions: graded against the learner's own profiles, not against a constant.

`profiles` is the notebook's {("prefill" | "decode", batch): torch.profiler.profile} for batches 1 and 32, each
one forward pass of the trained model (a prefill of `prompt_len` positions, or one decode step). What dominates
differs between machines (a laptop CPU, a GPU's launch overhead), so the checks read the learner's tables.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch.profiler import profile

from autograder.harness import check_answer
from autograder.checking.wire import class_of, run_where
from minigpt.teaching.profiling import CATEGORIES, self_seconds_by_category

PASSES = (("prefill", 1), ("decode", 1), ("prefill", 32), ("decode", 32))
NEAR_TIE = 0.8      # a category within 80% of the largest one's self time is accepted too (a near tie)


def is_profile(obj: Any) -> bool:
    """isinstance(obj, torch.profiler.profile) (asked where the object lives: see `_profiles`)."""
    return isinstance(obj, profile)


def _profiles(profiles: Any, what: str) -> dict[tuple[str, int], dict[str, float]]:
    """The notebook's profiles, validated (every pass present, each a profile holding matrix multiplies), as the
    self seconds by category of each pass. A profile cannot leave the kernel it was recorded in, so when the
    check is judged (the profiles are `Remote`s) its tables are read there (`run_where`) and only the sums travel."""
    if not isinstance(profiles, Mapping) or any(key not in profiles for key in PASSES):
        raise AssertionError(f"{what}: pass the notebook's `profiles`, a dict with keys {list(PASSES)}; run the "
                             "profiling cell above first")
    seconds = {}
    for key in PASSES:
        prof = profiles[key]
        if not run_where(prof, is_profile, prof):
            raise AssertionError(f"{what}: profiles[{key}] is a {class_of(prof).__name__}, not a "
                                 "torch.profiler.profile")
        seconds[key] = run_where(prof, self_seconds_by_category, prof)
        if seconds[key]["matmul"] <= 0:
            raise AssertionError(f"{what}: profiles[{key}] holds no matrix multiply: it did not profile a forward "
                                 "pass of the model; run the profiling cell again")
    return seconds


def check_q5_dominant_category(answer: Any, profiles: Any) -> None:
    """answer[(kind, batch)] is the category ("matmul", "attention" or "other") with the most self CPU time in
    the learner's profile of that pass (or one within NEAR_TIE of it)."""
    what = "Q5 (what dominates each pass)"
    by_pass = _profiles(profiles, what)
    if not isinstance(answer, Mapping):
        raise AssertionError(f"{what}: answer with a dict {{(kind, batch): category}}, got {type(answer).__name__}")
    for kind, batch in PASSES:
        given = answer.get((kind, batch))
        if given not in CATEGORIES:
            raise AssertionError(f"{what}: answer[({kind!r}, {batch})] must be one of {CATEGORIES}, got {given!r}")
        seconds = by_pass[kind, batch]
        best = max(seconds.values())
        if seconds[given] >= NEAR_TIE * best:
            continue
        leader = max(seconds, key=seconds.get)
        raise AssertionError(
            f"{what}: in your profile of the {kind} at batch {batch}, {leader!r} takes more self time than "
            f"{given!r}. Add up the Self CPU column of that table by category: aten::mm/addmm/bmm and the "
            "linear/matmul wrappers are 'matmul', scaled_dot_product*/softmax are 'attention', everything else "
            "(element-wise operators, norms, RoPE, copies, views, kernel launches) is 'other'. Rank by self time, not "
            "CPU total (aten::linear's total contains its aten::mm).")


def check_q6_decode_position_cost(answer: Any, profiles: Any, prompt_len: int) -> None:
    """Self CPU time of the batch-1 decode step (one position) divided by the batch-1 prefill's self CPU time per
    position (its total over prompt_len), from the learner's profiles."""
    what = "Q6 (cost of a decode position over a prefill position)"
    total = {key: sum(seconds.values()) for key, seconds in _profiles(profiles, what).items()}
    decode, prefill = total["decode", 1], total["prefill", 1]
    ratio = decode / (prefill / prompt_len)
    check_answer(answer, ratio, what,
                 {1 / ratio: "inverted: divide the decode step's time by the prefill's time PER POSITION.",
                  decode / prefill: f"the prefill processed {prompt_len} positions: divide its time by {prompt_len} "
                                    "before comparing it with the decode step's single position.",
                  total["decode", 32] / (total["prefill", 32] / prompt_len):
                      "those are the batch-32 profiles; the question is about batch 1."},
                 unit="times (a ratio)", rel=0.01,
                 hint="Use the 'Self CPU time total' line under each batch-1 table: decode total / (prefill total / "
                      "positions in the prefill).")
