"""minigpt.teaching.learner_fallback: a demo cell runs on the reference until the learner's exercise does."""

import pytest

from minigpt.teaching.learner_fallback import yours_or_reference


def reference(x):
    return 2 * x


def test_a_stub_falls_back_to_the_reference_and_says_which_exercise(capsys):
    def stub(x):
        raise NotImplementedError()
    assert yours_or_reference(stub, reference, "Exercise 3", 1) is reference
    assert "Exercise 3 is not done yet" in capsys.readouterr().out


def test_working_code_is_used_silently(capsys):
    def mine(x):
        return x + x
    assert yours_or_reference(mine, reference, "Exercise 3", 1) is mine
    assert capsys.readouterr().out == ""


def test_a_bug_is_not_hidden_behind_the_reference():
    def buggy(x):
        return x / 0
    with pytest.raises(ZeroDivisionError):
        yours_or_reference(buggy, reference, "Exercise 3", 1)


def test_one_note_per_exercise_per_cell(capsys, monkeypatch):
    """A cell that falls back twice for one exercise says so once; the next cell says it again."""
    import IPython

    class Shell:
        execution_count = 7

    shell = Shell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)

    def stub(x):
        raise NotImplementedError()
    for _ in range(2):
        yours_or_reference(stub, reference, "Exercise 4", 1)
        yours_or_reference(stub, reference, "Exercise 5", 1)
    out = capsys.readouterr().out
    assert out.count("Exercise 4 is not done yet") == 1 and out.count("Exercise 5 is not done yet") == 1
    shell.execution_count = 8
    yours_or_reference(stub, reference, "Exercise 4", 1)
    assert capsys.readouterr().out.count("Exercise 4 is not done yet") == 1
