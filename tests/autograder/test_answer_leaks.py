"""The answer-leak scan (tests/answer_leaks.py) finds a key printed above its question and nothing else."""

from __future__ import annotations

import nbformat
from answer_leaks import leaks, searchable


def _notebook(earlier_output: str, answer_output: str = "1790\n") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    shown = nbformat.v4.new_code_cell("print(x)")
    shown.outputs = [nbformat.v4.new_output("stream", name="stdout", text=earlier_output)]
    answer = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nanswer_q3 = 1790\n### END SOLUTION\nprint(answer_q3)")
    answer.outputs = [nbformat.v4.new_output("stream", name="stdout", text=answer_output)]
    check = nbformat.v4.new_code_cell("from autograder.lab03 import check_q3_crossover\ncheck_q3_crossover(answer_q3)")
    nb.cells = [shown, nbformat.v4.new_markdown_cell("**Q3.** ..."), answer, check]
    return nb


def test_a_key_printed_above_its_question_is_found() -> None:
    for text in ("crossover at 1,790 tokens", "1790", "1.79e+03 tokens", "1790.0"):
        assert [leak.answer for leak in leaks(_notebook(text))] == ["answer_q3"], text


def test_other_numbers_and_coarser_roundings_are_not_leaks() -> None:
    for text in ("crossover near 1.8k", "1789 tokens", "17 of 90", "2e+03", "context 179"):
        assert leaks(_notebook(text)) == [], text


def test_a_fractional_key_matches_at_the_digits_printed() -> None:
    assert leaks(_notebook("16.67 ms", "16.665599999999998\n"))
    assert not leaks(_notebook("16.6 ms", "16.665599999999998\n"))


def test_cells_tagged_measured_are_not_searched() -> None:
    nb = _notebook("speedup 1790")
    nb.cells[0].metadata["tags"] = ["measured"]
    assert leaks(nb) == []
    nb.cells[0].metadata["tags"] = ["raises-exception"]
    assert leaks(nb)


def test_every_number_an_answer_cell_prints_is_a_key() -> None:
    assert [leak.key for leak in leaks(_notebook("52 sequences, 1,790 tokens", "52 1790\n"))] == [1790.0]
    assert leaks(_notebook("1790", "{'D', 'C'}\n")) == []          # an answer that is not a number


def test_option_numbers_and_short_keys_are_not_searched() -> None:
    assert not searchable(2) and not searchable(0.25) and not searchable(float("nan"))
    assert searchable(315) and searchable(16.6656) and searchable(0.123)
