"""Interview practice (`python -m autograder interview`): every question is graded right for the right answer
and diagnosed for each listed wrong one, on many seeds; sessions repeat with a seed and keep a history."""

from __future__ import annotations

import json
import math
import re
import random
import subprocess
import sys

import pytest

from autograder.interview import draw_questions, run_session
from autograder.interview.questions import FAMILIES, MODELS, kv_cache_question, parse_number
from autograder.interview.reasoning import CHOICE_QUESTIONS, DealtChoice
from autograder.interview.session import TOPICS, history_summary, read_history
from minigpt.costmodel.calculators import GiB, kv_cache_bytes

SEEDS = range(150)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_right_answer_accepted_rounded_as_a_person_would(family):
    for seed in SEEDS:
        q = FAMILIES[family](random.Random(seed))
        assert q.grade(q.expected).correct, (family, seed, q.text)
        typed = f"{q.expected:,}" if isinstance(q.expected, int) else f"{q.expected:.4g} {q.unit}"
        assert q.grade(typed).correct, (family, seed, typed, q.grade(typed).message)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_listed_mistake_is_refused_with_its_diagnosis(family):
    seen = 0
    for seed in SEEDS:
        q = FAMILIES[family](random.Random(seed))
        for wrong, diagnosis in q.mistakes:
            answer = int(wrong) if isinstance(q.expected, int) and float(wrong).is_integer() else wrong
            verdict = q.grade(answer)
            assert not verdict.correct, (family, seed, wrong)
            assert diagnosis in verdict.message, (family, seed, wrong, verdict.message)
            seen += 1
    assert seen >= len(SEEDS), f"{family}: too few diagnosed mistakes over {len(SEEDS)} seeds ({seen})"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_questions_vary_and_repeat_with_the_seed(family):
    texts = {FAMILIES[family](random.Random(seed)).text for seed in range(30)}
    assert len(texts) >= 5, f"{family}: the numbers barely change between seeds"
    assert FAMILIES[family](random.Random(7)) == FAMILIES[family](random.Random(7))


def test_solution_shows_the_expected_number():
    for seed in SEEDS:
        q = kv_cache_question(random.Random(seed))
        assert f"{q.expected:.4g} GiB" in q.solution


def test_kv_anchor_llama3_8b_8k_is_one_gib():
    assert kv_cache_bytes(MODELS["Llama-3-8B"], 8192, 1, 2) == GiB


def test_a_wrong_answer_without_a_known_mistake_gets_no_diagnosis():
    q = kv_cache_question(random.Random(0))
    verdict = q.grade(q.expected * 3.7)
    assert not verdict.correct and "Likely mistake" not in verdict.message


@pytest.mark.parametrize("text,value", [("2.5", 2.5), ("2.5 GiB", 2.5), ("1,024 blocks", 1024), ("3e9", 3e9),
                                        ("about 42", 42), ("-1", -1), ("GiB", None), ("", None)])
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_unreadable_answer_is_not_a_crash():
    q = kv_cache_question(random.Random(0))
    verdict = q.grade("no idea")
    assert not verdict.correct and "could not read a number" in verdict.message


def test_reasoning_questions_numbered_like_readme(repo_root):
    section = (repo_root / "README.md").read_text().split("## Interview questions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"(?m)^\| (\d+) \| .+ \| (\d\d) \|", section)
    assert [(q.number, q.lab) for q in CHOICE_QUESTIONS] == [(int(n), lab) for n, lab in rows]


@pytest.mark.parametrize("question", CHOICE_QUESTIONS, ids=lambda q: f"Q{q.number}")
def test_choice_right_letter_and_every_wrong_one_diagnosed(question):
    positions = set()
    for seed in range(40):
        dealt = question.deal(random.Random(seed))
        right = dealt.right_letter
        positions.add(right)
        assert dealt.grade(right.lower()).correct and dealt.grade(f"{right})").correct
        for letter, (option, why) in zip(dealt.letters, dealt.options):
            if letter != right:
                verdict = dealt.grade(letter)
                assert not verdict.correct and why in verdict.message
        assert question.right in dealt.text and question.explanation in dealt.solution
    assert positions == set("ABCD"), "the right option should move between seeds"
    assert all(why for _, why in question.wrong), "every wrong option needs a diagnosis"


def test_choice_answer_that_is_not_a_letter():
    dealt = CHOICE_QUESTIONS[0].deal(random.Random(0))
    assert "answer with one letter" in dealt.grade("x").message


def test_draw_covers_every_topic_and_repeats_with_seed():
    qs = draw_questions(len(TOPICS), 5)
    numeric_topics = {FAMILIES[f](random.Random(0)).topic for f in FAMILIES}
    assert {q.topic for q in qs if not isinstance(q, DealtChoice)} == numeric_topics
    assert sum(isinstance(q, DealtChoice) for q in qs) == 1
    assert [q.text for q in qs] == [q.text for q in draw_questions(len(TOPICS), 5)]
    assert [q.text for q in qs] != [q.text for q in draw_questions(len(TOPICS), 6)]


def test_draw_refuses_an_unknown_topic():
    with pytest.raises(ValueError, match="unknown topic"):
        draw_questions(3, 0, ("kv-cache", "astrology"))


def _scripted(answers):
    it = iter(answers)

    def read(prompt: str) -> str:
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def test_session_grades_records_and_summarises(tmp_path):
    history = tmp_path / "history.jsonl"
    questions = draw_questions(4, 11)
    right = [q.right_letter if hasattr(q, "right_letter") else str(q.expected) for q in questions]
    lines: list[str] = []
    result = run_session(4, 11, read=_scripted(["not a number", right[0], "s", right[2], "0.000001"]),
                         write=lines.append, history=history)
    assert result.score == 2 and len(result.answered) == 4 and not result.stopped
    assert result.answered[1].skipped
    out = "\n".join(lines)
    assert out.count("Worked solution") == 4 and "Score: 2 / 4" in out
    assert "seed 11" in out
    [record] = read_history(history)
    assert record["seed"] == 11 and record["score"] == 2 and len(record["questions"]) == 4
    run_session(2, 12, read=_scripted(["s", "s"]), write=lines.append, history=history)
    summary = history_summary(history)
    assert "2 session(s)" in summary and "last 2/4, 0/2" in summary


def test_session_stops_on_q_and_on_end_of_input(tmp_path):
    result = run_session(5, 1, read=_scripted(["q"]), write=lambda s: None, history=tmp_path / "h.jsonl")
    assert result.stopped and result.answered == []
    assert not (tmp_path / "h.jsonl").exists()
    result = run_session(5, 1, read=_scripted(["s"]), write=lambda s: None, history=None)
    assert result.stopped and len(result.answered) == 1


def test_history_survives_a_corrupt_line(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text("{not json\n" + json.dumps({"score": 1, "asked": 2, "questions": []}) + "\n")
    assert len(read_history(path)) == 1


def test_command_line_session(tmp_path, repo_root):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{repo_root / 'shared'}:{repo_root}",
           "COURSE_INTERVIEW_HISTORY": str(tmp_path / "h.jsonl")}
    first = draw_questions(2, 3)[0]
    answer = first.right_letter if hasattr(first, "right_letter") else repr(first.expected)
    proc = subprocess.run([sys.executable, "-m", "autograder", "interview", "--seed", "3", "-n", "2"],
                          input=f"{answer}\nq\n", capture_output=True, text=True, cwd=repo_root, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Right: " in proc.stdout and "Score: 1 / 1 (stopped after 1 of 2)" in proc.stdout
    assert proc.stderr == ""
    assert read_history(tmp_path / "h.jsonl")[0]["score"] == 1


def test_expected_values_are_finite():
    for seed in range(50):
        for q in draw_questions(len(TOPICS), seed):
            expected = getattr(q, "expected", 0)
            assert math.isfinite(expected)
