"""An interview practice session: questions drawn with a seed, answers graded and diagnosed, a score history.

    python -m autograder interview                 # 10 questions, a new seed each time (printed)
    python -m autograder interview --seed 7 -n 5   # the same 5 questions as last time with seed 7
    make interview INTERVIEW_ARGS="--topic kv-cache --topic reasoning"

From a notebook cell: `from autograder.interview import ask; ask(5)` (answers typed into the input box).
Type `s` to skip a question (it counts as wrong and shows the solution) and `q` to stop.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import textwrap
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from autograder.interview.questions import FAMILIES, Verdict
from autograder.interview.reasoning import CHOICE_QUESTIONS
from autograder.paths import REPO_ROOT

REASONING = "reasoning"
TOPICS = (*FAMILIES, REASONING)
DEFAULT_HISTORY = REPO_ROOT / ".interview_history.jsonl"


class Question(Protocol):
    topic: str
    lab: str
    text: str
    solution: str

    def grade(self, answer: str) -> Verdict: ...


@dataclass
class Answered:
    topic: str
    lab: str
    correct: bool
    skipped: bool
    seconds: float


@dataclass
class SessionResult:
    seed: int
    answered: list[Answered] = field(default_factory=list)
    stopped: bool = False

    @property
    def score(self) -> int:
        return sum(a.correct for a in self.answered)

    @property
    def seconds(self) -> float:
        return sum(a.seconds for a in self.answered)

    def record(self) -> dict:
        return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seed": self.seed,
                "score": self.score, "asked": len(self.answered), "seconds": round(self.seconds, 1),
                "questions": [a.__dict__ for a in self.answered]}


def draw_questions(n: int, seed: int, topics: tuple[str, ...] = TOPICS) -> list[Question]:
    """n questions for `seed`: topics in turn (shuffled), fresh numbers per numeric question, reasoning questions
    without repeats. The same (n, seed, topics) always gives the same questions."""
    unknown = sorted(set(topics) - set(TOPICS))
    if unknown or not topics:
        raise ValueError(f"unknown topic(s) {unknown}; choose from {', '.join(TOPICS)}")
    rng = random.Random(seed)
    order = list(dict.fromkeys(topics))
    rng.shuffle(order)
    choices = list(CHOICE_QUESTIONS)
    rng.shuffle(choices)
    out: list[Question] = []
    for i in range(n):
        topic = order[i % len(order)]
        if topic == REASONING:
            out.append(choices[(i // len(order)) % len(choices)].deal(rng))
        else:
            out.append(FAMILIES[topic](rng))
    return out


def run_session(n: int = 10, seed: int | None = None, topics: tuple[str, ...] = TOPICS, *,
                read: Callable[[str], str] = input, write: Callable[[str], None] = print,
                history: Path | None = DEFAULT_HISTORY, clock: Callable[[], float] = time.monotonic) -> SessionResult:
    """Ask n questions, grade each answer, show the worked solution, append the session to `history`."""
    seed = secrets.randbelow(10**6) if seed is None else seed
    questions = draw_questions(n, seed, topics)
    result = SessionResult(seed)
    write(f"Interview practice: {n} question(s), seed {seed} (`python -m autograder interview --seed {seed} "
          f"-n {n}` repeats them). Type s to skip, q to stop.")
    for i, q in enumerate(questions, 1):
        write(f"\nQuestion {i}/{n} ({q.topic}, lab {q.lab})\n{_wrap(q.text)}")
        start = clock()
        verdict, skipped = _ask_until_readable(q, read, write)
        if verdict is None:
            result.stopped = True
            break
        result.answered.append(Answered(q.topic, q.lab, verdict.correct, skipped, clock() - start))
        if not skipped:
            write(_wrap(("Right: " if verdict.correct else "Wrong: ") + verdict.message, indent="  "))
        write(_wrap(f"Worked solution: {q.solution}", indent="  "))
    write(f"\nScore: {result.score} / {len(result.answered)}" +
          (f" (stopped after {len(result.answered)} of {n})" if result.stopped else "") +
          f" in {result.seconds:.0f} s.")
    if history is not None and result.answered:
        append_history(history, result)
        write(history_summary(history))
    return result


def _wrap(text: str, indent: str = "", width: int = 100) -> str:
    """Each paragraph of `text` wrapped to `width` columns (a terminal's lines stay readable), lines indented."""
    more = indent + "  " if indent else ""           # an indented paragraph's own lines hang a little further in
    return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=more, break_on_hyphens=False)
                     if line.strip() else "" for line in text.splitlines())


def _ask_until_readable(q: Question, read: Callable[[str], str],
                        write: Callable[[str], None]) -> tuple[Verdict | None, bool]:
    """(verdict, skipped); (None, False) to stop. An answer that cannot be read is asked again, not counted."""
    while True:
        try:
            answer = read("> ").strip()
        except EOFError:
            return None, False
        if answer.lower() in ("q", "quit", "exit"):
            return None, False
        if answer.lower() in ("s", "skip", ""):
            return Verdict(False, "skipped"), True
        verdict = q.grade(answer)
        if verdict.message.startswith(("could not read", "answer with one letter")):
            write(f"  {verdict.message}")
            continue
        return verdict, False


def history_path() -> Path:
    """$COURSE_INTERVIEW_HISTORY, or .interview_history.jsonl in the course root (git-ignored)."""
    return Path(os.environ.get("COURSE_INTERVIEW_HISTORY", DEFAULT_HISTORY))


def append_history(path: Path, result: SessionResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(result.record()) + "\n")


def read_history(path: Path) -> list[dict]:
    """Past sessions, oldest first; unreadable lines are skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def history_summary(path: Path, last: int = 5) -> str:
    """The last sessions' scores and the share right per topic over all sessions."""
    sessions = read_history(path)
    if not sessions:
        return "No sessions recorded yet."
    recent = ", ".join(f"{s['score']}/{s['asked']}" for s in sessions[-last:])
    per_topic: dict[str, list[int]] = {}
    for s in sessions:
        for q in s.get("questions", []):
            right, asked = per_topic.setdefault(q["topic"], [0, 0])
            per_topic[q["topic"]] = [right + bool(q["correct"]), asked + 1]
    weakest = sorted(per_topic.items(), key=lambda kv: kv[1][0] / kv[1][1])
    topics = "; ".join(f"{t} {r}/{a}" for t, (r, a) in weakest)
    return f"History ({len(sessions)} session(s), {path}): last {recent}. By topic, weakest first: {topics}."


def ask(n: int = 5, seed: int | None = None, topics: tuple[str, ...] = TOPICS) -> SessionResult:
    """A session from a notebook cell (or any Python prompt), recorded in the usual history file."""
    return run_session(n, seed, tuple(topics), history=history_path())
