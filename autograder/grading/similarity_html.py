"""The similarity report as one HTML page: a table of every match, then each match side by side.

For a match with the package's reference, the course's solution or a classmate, the student's cell and the other's
code are shown next to each other with the shared lines marked; for carried code, the cell with the lines that
carry it marked. Everything from a submission is escaped (a cell's text is never markup), and each side is cut at
MAX_LINES lines.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:                      # similarity imports this module to write its report
    from autograder.grading.similarity import Match

MAX_LINES = 400

_STYLE = """
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
td.n { text-align: right; }
.pair { display: flex; gap: 1em; } .pair > div { flex: 1; min-width: 0; }
pre { background: #f7f7f7; padding: 6px; overflow-x: auto; font-size: 12px; }
pre span.hit { background: #ffd27f; display: inline-block; width: 100%; }
tr.carried td { background: #fde8e8; }
"""


def _code(source: str, lines: frozenset[int]) -> str:
    rows = source.splitlines()
    out = []
    for n, line in enumerate(rows[:MAX_LINES], 1):
        text = f"{n:4d}  {html.escape(line)}"
        out.append(f'<span class="hit">{text}</span>' if n in lines else text)
    if len(rows) > MAX_LINES:
        out.append(f"      ... {len(rows) - MAX_LINES} more lines")
    return "<pre>" + "\n".join(out) + "</pre>"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def _row(n: int, m: Match) -> str:
    cells = [m.student, m.cell, m.other, m.detail]
    tail = [_share(m.similarity), _share(m.other_similarity), str(m.overlap_tokens or "")]
    klass = ' class="carried"' if m.similarity is None else ""
    return (f"<tr{klass}><td><a href='#m{n}'>{n}</a></td>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            + "".join(f"<td class='n'>{c}</td>" for c in tail) + "</tr>")


def _detail(n: int, m: Match) -> str:
    title = html.escape(f"{n}. {m.student}, {m.cell}: {m.other}, {m.detail}")
    if m.evidence is None:
        return f"<h3 id='m{n}'>{title}</h3>"
    if m.similarity is None:
        return f"<h3 id='m{n}'>{title}</h3>" + _code(m.evidence.source, m.evidence.lines)
    shares = f"{_share(m.similarity)} of the cell, {_share(m.other_similarity)} of the other, {m.overlap_tokens} tokens"
    return (f"<h3 id='m{n}'>{title}</h3><p>{shares}</p><div class='pair'>"
            f"<div><b>{html.escape(m.student)}: {html.escape(m.cell)}</b>"
            f"{_code(m.evidence.source, m.evidence.lines)}</div>"
            f"<div><b>{html.escape(m.other)}: {html.escape(m.detail)}</b>"
            f"{_code(m.evidence.other_source, m.evidence.other_lines)}</div></div>")


def write(path: Path, matches: list[Match], notes: list[str], *, assignment: str, threshold: float) -> None:
    head = ("<tr><th>#</th><th>student</th><th>cell</th><th>shares with</th><th>what</th><th>share of the cell</th>"
            "<th>share of the other</th><th>tokens</th></tr>")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>similarity: {html.escape(assignment)}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>Similarity: {html.escape(assignment)}</h1>",
             f"<p>{len(matches)} matches at a share of {threshold:.0%} or more, and cells that carry code. "
             "A lead to read, not a verdict.</p>"]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if matches:
        parts.append("<table>" + head + "".join(_row(n, m) for n, m in enumerate(matches, 1)) + "</table>")
        parts += [_detail(n, m) for n, m in enumerate(matches, 1)]
    parts.append("</body></html>")
    Path(path).write_text("\n".join(parts), encoding="utf-8")
