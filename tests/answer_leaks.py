"""Finds interview answers a notebook prints before it asks the question.

An executed solution notebook prints each answer in the cell that computes it (`print(answer_q2)`), the cell before
the one that checks it (`check_q2_...(answer_q2)`). `leaks(nb)` takes the numbers that cell prints as the keys and
looks for them in the outputs of the cells above the question's text (the last markdown cell before the answer cell): a number printed there with at least as many significant digits as it
shows, equal to the key rounded to that many, is a leak. Keys a coincidence could print (option numbers, small
integers, fewer than 3 significant digits) are not searched, nor are the outputs of cells tagged "measured": they
print timings and what is computed from them, numbers that change from run to run (a speedup that came out at 2.35
once matched a key of 2.349 by chance) and so can neither show a key reliably nor be checked for one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import nbformat

CHECK = re.compile(r"\bcheck_q\d+\w*\(\s*(\w+)")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?")
MIN_DIGITS = 3
MEASURED = "measured"         # the tag of a cell whose outputs are timings and what follows from them


@dataclass(frozen=True)
class Leak:
    answer: str          # answer_q2
    key: float
    cell: int            # index of the cell whose output shows it
    text: str            # the number as printed

    def __str__(self) -> str:
        return f"{self.answer} = {self.key:g} is printed as {self.text!r} by cell {self.cell + 1}, before its question"


def _outputs_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def _significant_digits(text: str) -> int:
    mantissa = re.split(r"[eE]", text.replace(",", "").lstrip("-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in mantissa else len(digits)


def _round_sig(x: float, digits: int) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def searchable(key: float) -> bool:
    """Whether a coincidence is unlikely: at least MIN_DIGITS significant digits, and not an option number."""
    if not math.isfinite(key) or abs(key) < 10 and float(key).is_integer():
        return False
    return _significant_digits(repr(key) if not float(key).is_integer() else str(int(key))) >= MIN_DIGITS


def _printed_keys(cell: nbformat.NotebookNode) -> list[float]:
    """The numbers an answer cell prints, when it prints numbers only (an option, a value, two values)."""
    text = _outputs_text(cell)
    if not text.strip() or NUMBER.sub("", text).strip(" \n,()[]"):
        return []
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def _assigns(cell: nbformat.NotebookNode, name: str) -> bool:
    return cell.cell_type == "code" and re.search(rf"^\s*(\w+\s*,\s*)*{re.escape(name)}\b[^=\n]*=", cell.source,
                                                  re.M) is not None


def leaks(nb: nbformat.NotebookNode, also: tuple[nbformat.NotebookNode, ...] = ()) -> list[Leak]:
    """Every (answer, earlier output) pair where an answer's key is printed before its question. `also`: other runs
    of the same notebook (the same cells), whose outputs above the question are searched too (grading leaves out
    cells no grade depends on; the released notebook's full run prints them, its demos running the reference)."""
    assert all(len(other.cells) == len(nb.cells) for other in also), "the other runs must hold the same cells"
    runs = [nb, *also]
    found = []
    for i, cell in enumerate(nb.cells):
        match = CHECK.search(cell.source) if cell.cell_type == "code" and "def " not in cell.source else None
        if not match:
            continue
        answer = max((j for j in range(i) if _assigns(nb.cells[j], match.group(1))), default=None)
        if answer is None:
            continue
        question = max((j for j in range(answer) if nb.cells[j].cell_type == "markdown"), default=0)
        for key in filter(searchable, _printed_keys(nb.cells[answer])):
            for j in range(question):
                if nb.cells[j].cell_type != "code" or MEASURED in nb.cells[j].metadata.get("tags", []):
                    continue
                for text in (t for run in runs for t in NUMBER.findall(_outputs_text(run.cells[j]))):
                    value, digits = float(text.replace(",", "")), _significant_digits(text)
                    if digits >= MIN_DIGITS and math.isclose(value, _round_sig(key, digits), rel_tol=1e-9, abs_tol=0):
                        found.append(Leak(match.group(1), key, j, text))
    return found
