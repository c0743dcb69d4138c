"""minigpt.bench.structured: the part runs end to end on a tiny configuration (one schema, a short trace, one pass)
and its ledger rows have their shape and goals, the server's default backend (llguidance as its engine takes it)
among them; a course engine whose masks differ fails loudly; a trace a library
refuses is passed over for the next seed, and said so. No test here asserts a time."""

from __future__ import annotations

import math

import pytest

from minigpt.bench import mask_engines as me
from minigpt.bench import structured
from minigpt.bench.ledger import render_table
from minigpt.structured.evaluation import load_suite
from minigpt.tokenizer import load_tokenizer


TINY = {"schemas": ["settings"], "max_new_tokens": 12, "passes": 1, "compile_repeats": 1, "decode_repeats": 1,
        "regex": {"name": "digits", "prompt": "n = ", "pattern": r"[0-9]{2,4}(\.[0-9])?"}}


def test_the_part_runs_on_a_tiny_configuration_and_its_rows_have_their_shape(tiny_course_lm):
    section = structured.measure_structured(tiny_course_lm, quick=True, overrides=TINY)
    sch = section["schemas"]["settings"]
    assert set(sch["step_s"]) == set(structured.JSON_ENGINES) == set(sch["first_pass_s"])
    assert all(len(steps) == sch["steps"] for steps in sch["step_s"].values())
    assert sch["steps"] == len(sch["trace"]["tokens"]) + (sch["trace"]["stopped"] == "end")
    assert set(sch["compile_s"]) == {"course", "XGrammar", "llguidance", structured.SERVER}
    assert set(sch["decode"]) == {"with masks", "without masks"}
    assert set(section["regex"]["step_s"]) == set(structured.REGEX_ENGINES)
    rows = structured.figures(section)
    assert all({"what", "value", "unit"} <= set(r) for r in rows)
    assert [r.get("goal") for r in rows] == [structured.LIBRARY_GOAL, None, structured.SCAN_GOAL, None, None, None] + \
        [structured.LIBRARY_GOAL, None, structured.SCAN_GOAL, None, None] + [None] * 5 + \
        [round(structured.DECODE_GOAL, 3)]
    assert all("met" in r for r in rows if "goal" in r)
    assert all("ratio" in r and r["unit"] in ("µs", "ms") for r in rows)
    lines = structured.notes(section)
    assert len(lines) == 6 and all(line.startswith("structured") for line in lines)
    table = render_table({"date": "today", "machine": {"processor": "cpu", "cores": 2, "load_before": 0,
                                                       "load_after": 0},
                          "settings": {"threads": 1}, "versions": {"torch": "x", "transformers": "y"},
                          "figures": rows, "structured": {**section, "notes": lines}})
    assert table.count("| structured:") == len(rows) and "- structured, end to end:" in table
    served = [r for r in rows if structured.SERVER in r["what"]]
    assert [r["unit"] for r in served] == ["µs", "ms"], served                 # a mask per token, a compile per schema
    assert all(math.isfinite(r["value"]) and r["value"] > 0 and math.isfinite(r["ratio"]) for r in served), served
    assert "course" in served[0]["against"] and "course" in served[1]["against"]
    assert "the course server's engine" in lines[1] and "the server's compile" in lines[2]


@pytest.fixture
def shifted_masks():
    """The wrong implementation: the trie walk's mask with one more token allowed."""
    from minigpt.structured.token_masks import mask_by_trie

    def masks(grammar, trie):
        def one_more(state):
            mask = mask_by_trie(grammar, state, trie).clone()
            mask[int((~mask).nonzero()[0])] = True
            return mask
        return one_more
    return masks


def test_a_course_engine_with_other_masks_fails_loudly(trie, shifted_masks):
    entry = next(e for e in load_suite() if e.name == "settings")
    course = me.compile_course_json(entry.schema, trie)
    wrong = me.CourseEngine(course.automaton, shifted_masks(course.automaton, trie), trie)
    tokens = load_tokenizer().encode('{"theme":"dark"')
    with pytest.raises(RuntimeError, match="wrong gave other masks than course"):
        structured.time_masks({"course": course, "wrong": wrong}, tokens, ended=False, passes=1, reference="course")


class Refusing:
    """A library that refuses one token id."""

    def __init__(self, refused: int) -> None:
        self.refused = refused

    def reset(self) -> None:
        pass

    def advance(self, token: int) -> None:
        if token == self.refused:
            raise RuntimeError(f"refuses token {token}")


def test_a_trace_a_library_refuses_is_passed_over_for_the_next_seed(trie):
    traces = {0: [5, 6, 7], 1: [5, 8]}
    found = structured._common_trace(lambda seed: {"tokens": traces[seed], "text": str(seed)}, [Refusing(7)], trie, 0)
    assert found["seed"] == 1 and found["tokens"] == [5, 8]
    assert [k["seed"] for k in found["skipped"]] == [0] and "refuses token 7" in found["skipped"][0]["why"]
    with pytest.raises(RuntimeError, match="no trace every library takes"):
        structured._common_trace(lambda seed: {"tokens": [7], "text": ""}, [Refusing(7)], trie, 0, tries=2)

