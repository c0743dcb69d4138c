"""What a mutation run found, as a table: the run's own report, the record a full run leaves, and the table of
docs/instructors.md, made from the records (`python -m autograder mutation --write-docs`; a test keeps it current).

    summary(result) -> {"lab", "date", "machine", "seconds", "mutants", "not_run", "exercises": {...},
                        "interview": {...}, "survived": {id: diff}, "broken": {id: what}}
    markdown([result, ...])     the run's report: both rows of each lab, then survivors and broken runs
    docs_table(records)         one row per lab and kind of cell, from results/<lab>.json
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from autograder.mutation.run import KINDS, LabResult, is_interview
from autograder.paths import AUTOGRADER_DIR, REPO_ROOT

__all__ = ["RESULTS", "DOCS", "summary", "record", "records", "markdown", "docs_table", "docs_block", "write_docs"]

RESULTS = AUTOGRADER_DIR / "mutation" / "results"
DOCS = REPO_ROOT / "docs" / "instructors.md"
BEGIN, END = "<!-- mutation table: begin (python -m autograder mutation --write-docs) -->", "<!-- mutation table: end -->"
HEADER = ("| lab | cells | mutants run | shown equivalent | listed, not shown | killed by a check | by a crash | "
          "by a hang | broken | survived | score |")


def _counts(r: LabResult, interview: bool) -> dict:
    counts = {kind: len(r.ids(kind, interview)) for kind in KINDS}
    score = r.score(interview)
    return {"run": sum(counts.values()), "shown_equivalent": sum(is_interview(i) == interview for i in r.equivalent),
            "listed_not_shown": sum(is_interview(i) == interview for i in r.not_shown), **counts,
            "score": None if score != score else round(score, 4)}


def summary(r: LabResult) -> dict:
    return {"lab": r.assignment, "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
            "seconds": r.seconds, "mutants": r.mutants, "not_run": r.not_run,
            "exercises": _counts(r, False), "interview": _counts(r, True),
            "survived": r.survived, "broken": {i: what for i, (k, what) in r.outcome.items() if k == "broken"},
            "found_equivalent": {i: r.equivalent[i] for i in r.found_equivalent}}


def record(r: LabResult, folder: Path = RESULTS) -> Path:
    """Write a full run's summary to results/<lab>.json (what docs/instructors.md's table is made from)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{r.assignment}.json"
    path.write_text(json.dumps(summary(r), indent=1) + "\n")
    return path


def records(folder: Path = RESULTS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _separator(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def _row(lab: str, cells: str, c: dict) -> str:
    score = "-" if c["score"] is None else f"{c['score']:.1%}"
    return (f"| {lab} | {cells} | {c['run']} | {c['shown_equivalent']} | {c['listed_not_shown']} | {c['check']} | "
            f"{c['crash']} | {c['hang']} | {c['broken']} | {c['survived']} | {score} |")


def markdown(results: list[LabResult]) -> str:
    rows = [HEADER, _separator(HEADER)]
    for r in results:
        rows += [_row(r.assignment, "exercises", _counts(r, False)), _row(r.assignment, "interview", _counts(r, True))]
    for r in results:
        rows.append(f"\n{r.assignment}: {r.mutants} mutants, {r.seconds:.0f} s")
        if r.not_run:
            rows.append(f"{r.assignment}: not run without a GPU (only a GPU tells them apart): "
                        + ", ".join(f"{ex} ({n} mutants)" for ex, n in r.not_run.items()))
        if r.baseline_failures:
            rows.append(f"{r.assignment}: the solution itself failed {r.baseline_failures}: no score")
        if r.found_equivalent:
            rows.append(f"{r.assignment}: survivors a differential test showed equivalent (list them in known/ with "
                        "why):")
            rows += [f"- `{mid}` {r.equivalent[mid]}" for mid in r.found_equivalent]
        for kind, title in (("survived", "survivors (wrong implementations its checks pass)"),
                            ("broken", "broken runs (a check or the harness failed on its own)")):
            found = r.ids(kind)
            if found:
                rows.append(f"{r.assignment} {title}:")
                rows += [f"- `{mid}` {r.outcome[mid][1]}" + (f" (listed equivalent: {r.not_shown[mid]})"
                                                             if mid in r.not_shown else "") for mid in found]
    return "\n".join(rows)


def docs_table(found: list[dict]) -> str:
    if not found:
        return "No full run is recorded yet with today's operators and scoring (`make mutation LAB=NN`)."
    header = HEADER.replace("| score |", "| score | time | date |")
    rows = [header, _separator(header)]
    for rec in found:
        tail = f" {rec['seconds']:.0f} s | {rec['date']} |"
        rows += [_row(rec["lab"], cells, rec[cells]) + tail for cells in ("exercises", "interview")]
    gpu = [f"{rec['lab']}: " + ", ".join(f"{k} ({n})" for k, n in rec["not_run"].items())
           for rec in found if rec["not_run"]]
    return "\n".join(rows + ([""] + ["Not run without a GPU: " + "; ".join(gpu) + "."] if gpu else []))


def docs_block(found: list[dict]) -> str:
    return f"{BEGIN}\n{docs_table(found)}\n{END}"


def write_docs(folder: Path = RESULTS, docs: Path = DOCS) -> None:
    text = docs.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    docs.write_text(text[:start] + docs_block(records(folder)) + text[end:])
