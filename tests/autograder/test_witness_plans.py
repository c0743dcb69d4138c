"""Witness plans (autograder/judging/witness_plans.py): a test cell whose plan is known is graded once, in its witness,
with the kernel waiting; a plan that does not cover what the witness's checks guarded is stale, and the cell is then
graded kernel first, as without one. Either way a passing verdict is a witness's that lacked every reference its own
checks guarded."""

from __future__ import annotations

import nbformat
import pytest

from autograder.judging import judge, witness_plans
from tests.autograder.test_witness import FORGERIES, HASH_TEST, HONEST, HONEST_HASH, SLOT_TEST, _errors, _run, _test_cell

SLOT_GUARD = {"allow": [], "lab": "02", "refs": ["minigpt.cache.block_table:slot_of"], "what": "x"}
HASH_GUARD = {"allow": [], "lab": "02", "refs": ["minigpt.cache.prefix_cache:hash_block"], "what": "y"}


def test_a_plan_covers_a_run_that_guarded_and_asked_for_no_more():
    plan = {"guarded": [SLOT_GUARD, HASH_GUARD], "refused": [], "memory_allowance": 2 << 30}
    run = judge.plan_of({"guarded": [HASH_GUARD, HASH_GUARD], "refused": [], "memory_allowance": 1 << 30})
    assert run["guarded"] == [HASH_GUARD] and judge.covered(run, plan)
    assert not judge.covered({**run, "memory_allowance": 3 << 30}, plan)
    assert not judge.covered({**run, "refused": [{"ops": ["aten::mm"], "what": "z"}]}, plan)
    assert not judge.covered(run, {**plan, "guarded": [SLOT_GUARD]})
    assert not judge.covered(run, {**plan, "memory_allowance": None})


def test_plans_are_keyed_by_the_cells_source_and_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(witness_plans, "_plans", lambda: {witness_plans.cell_key(SLOT_TEST): {
        "grade_id": "t1", "guarded": [SLOT_GUARD], "refused": [], "memory_allowance": None}})
    assert witness_plans.plan_for(SLOT_TEST) == {"guarded": [SLOT_GUARD], "refused": [], "memory_allowance": None}
    assert witness_plans.plan_for(SLOT_TEST + "\n") is None
    monkeypatch.setenv("COURSE_WITNESS_PLANS", "0")
    assert witness_plans.plan_for(SLOT_TEST) is None


def _plans(monkeypatch, guarded: list[dict]) -> list[dict]:
    """Every test cell gets a plan guarding `guarded`; returns the judge's results (their "witness_plan")."""
    from autograder.grading import preprocessors
    from autograder.judging.judge import JudgeProcess

    monkeypatch.setattr(preprocessors, "plan_for",
                        lambda source: {"guarded": guarded, "refused": [], "memory_allowance": None})
    seen, result = [], JudgeProcess.result
    monkeypatch.setattr(JudgeProcess, "result", lambda self, *a, **k: (seen.append(result(self, *a, **k)), seen[-1])[1])
    return seen


@pytest.mark.slow
def test_a_planned_cell_is_graded_in_its_witness_and_the_kernel_gets_what_it_assigned(tmp_path, monkeypatch):
    seen = _plans(monkeypatch, [dict(SLOT_GUARD, what="Exercise 2 (slot_of)")])
    nb = _run(tmp_path, nbformat.v4.new_code_cell(HONEST), _test_cell(SLOT_TEST + "\nseen = 41 + 1"),
              nbformat.v4.new_code_cell("print('the kernel has', seen)"), monkeypatch=monkeypatch)
    assert _errors(nb.cells[1]) == [] and seen[0]["witness_plan"]["used"], seen
    assert [o.get("text") for o in nb.cells[2].outputs] == ["the kernel has 42\n"], nb.cells[2].outputs


@pytest.mark.slow
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_report_earns_nothing_with_a_plan(tmp_path, monkeypatch, forgery):
    seen = _plans(monkeypatch, [dict(SLOT_GUARD, what="Exercise 2 (slot_of)")])
    nb = _run(tmp_path, nbformat.v4.new_code_cell(FORGERIES[forgery]), _test_cell(SLOT_TEST), monkeypatch=monkeypatch)
    errors = _errors(nb.cells[1])
    assert errors and errors[0].startswith("ReferenceHandedIn") and "Exercise 2 (slot_of)" in errors[0], errors
    assert seen[0]["witness_plan"]["used"], seen


@pytest.mark.slow
@pytest.mark.parametrize("forgery", [None, *FORGERIES])
def test_a_stale_plan_is_graded_kernel_first(tmp_path, monkeypatch, forgery):
    """The plan removes another exercise's reference (hash_block), not the one the check guards (slot_of): the
    witness's verdict does not stand, the cell is graded as without a plan, and the result says the plan is stale."""
    seen = _plans(monkeypatch, [dict(HASH_GUARD, what="Exercise 3 (hash_block)")])
    answer = HONEST + HONEST_HASH if forgery is None else FORGERIES[forgery]
    nb = _run(tmp_path, nbformat.v4.new_code_cell(answer), _test_cell(SLOT_TEST), monkeypatch=monkeypatch)
    errors = _errors(nb.cells[1])
    if forgery is None:
        assert errors == [] and seen[0]["witness_plan"] == {"used": False, "stale": True, "lists": {
            "guarded": [dict(SLOT_GUARD, what="Exercise 2 (slot_of)")], "refused": [], "memory_allowance": None}}, seen
    else:
        assert errors and errors[0].startswith("ReferenceHandedIn"), errors
    assert witness_plans.stale_note([{"grade_id": "t1", **seen[0]["witness_plan"]}] if forgery is None else []) in (
        None, "witness plans out of date for t1 (graded the slower way; `python -m autograder witness-plans` writes "
              "them again)")


@pytest.mark.slow
def test_a_planned_cell_that_fails_fails_in_its_witness(tmp_path, monkeypatch):
    seen = _plans(monkeypatch, [dict(HASH_GUARD, what="Exercise 3 (hash_block)")])
    wrong = "def hash_block(parent, tokens):\n    return 0\n"
    hash_test = _test_cell(HASH_TEST)
    nb = _run(tmp_path, nbformat.v4.new_code_cell(wrong), hash_test, monkeypatch=monkeypatch)
    assert _errors(nb.cells[1]) and seen[0]["witness_plan"]["used"], seen
