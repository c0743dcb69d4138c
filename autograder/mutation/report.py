"""What a mutation run found, as a table: the run's own report, the record a full run leaves, and the table of
docs/instructors.md, made from the records (`python -m autograder mutation --write-docs`; a test keeps it current).

    summary(result) -> {"lab", "date", "machine", "seconds", "mutants", "not_run", "exercises": {...},
                        "interview": {...}, "survived": {id: diff}, "broken": {id: what}}
    markdown([result, ...])     the run's report: both rows of each lab, then survivors and broken runs
    docs_table(records)         one row per lab and kind of cell, from results/<lab>.json
    record_part(result, cells)  an `--exercise` run: results/parts/<lab>/<cells>.json, with the cells' fingerprints
    split(result)               a full run as one part per exercise cell
    assemble(lab)               the lab's parts, once they cover every exercise cell as it is today, as one record

A lab too slow for one sitting (lab 04: 2,351 mutants) is run in parts, one exercise or a few per run, on as many
cores as there are: a part counts only while its cells are unchanged, and the record it makes adds up their seconds.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from autograder.mutation.run import KINDS, LabResult, fingerprint, is_interview, notebook_cells
from autograder.paths import AUTOGRADER_DIR, REPO_ROOT

__all__ = ["RESULTS", "DOCS", "summary", "record", "records", "record_part", "split", "assemble", "markdown",
           "docs_table", "docs_block", "write_docs"]

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


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end"


def summary(r: LabResult) -> dict:
    return {"lab": r.assignment, "date": datetime.date.today().isoformat(),
            "machine": _machine(), "seconds": r.seconds, "mutants": r.mutants, "not_run": r.not_run,
            "exercises": _counts(r, False), "interview": _counts(r, True),
            "survived": r.survived, "broken": {i: what for i, (k, what) in r.outcome.items() if k == "broken"},
            "found_equivalent": {i: r.equivalent[i] for i in r.found_equivalent}}


def record(r: LabResult, folder: Path = RESULTS, about: dict | None = None) -> Path:
    """Write a full run's summary to results/<lab>.json (what docs/instructors.md's table is made from); `about`
    (date, machine) replaces today's for a result assembled from parts. A full run (no `about`) is also kept cell by
    cell as parts, so that a cell whose check changed is run again alone (`--exercise`) and the record remade."""
    if about is None:
        split(r, folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{r.assignment}.json"
    path.write_text(json.dumps(summary(r) | (about or {}), indent=1) + "\n")
    return path


def _today(assignment: str) -> dict[str, str]:
    """Every exercise cell of the lab (interview cells included) -> the fingerprint of its source today."""
    return {c.grade_id: fingerprint(c.source) for c in notebook_cells(assignment) if c.exercise}


def record_part(r: LabResult, cells: list[str], folder: Path = RESULTS) -> Path:
    """Write an `--exercise` run (the cells it mutated) to results/parts/<lab>/<cells>.json, everything a record
    needs kept mutant by mutant, with the cells' fingerprints (assemble uses a part only while they hold). These cells
    are cut out of earlier parts (a part left with no cell is removed; its seconds shrink with its mutants): no two
    parts ever hold one cell, so which is newer never matters (a clone's files all have one date)."""
    today = _today(r.assignment)
    unknown = sorted(set(cells) - set(today))
    if unknown:
        raise ValueError(f"{r.assignment} has no exercise cell {', '.join(unknown)}")
    path = folder / "parts" / r.assignment / ("+".join(sorted(cells)) + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    part = {"lab": r.assignment, "date": datetime.date.today().isoformat(), "machine": _machine(),
            "cells": {gid: today[gid] for gid in sorted(cells)}, "seconds": r.seconds, "mutants": r.mutants,
            "outcome": r.outcome, "equivalent": r.equivalent, "not_shown": r.not_shown, "not_run": r.not_run,
            "found_equivalent": r.found_equivalent}
    for older in path.parent.glob("*.json"):
        if older != path:
            _cut_out(older, set(cells))
    path.write_text(json.dumps(part, indent=1) + "\n")
    return path


def _cut_out(path: Path, cells: set[str]) -> None:
    """Part `path` without `cells` (run again since): rewritten under the name of the cells it keeps, or removed."""
    part = json.loads(path.read_text())
    keep = set(part["cells"]) - cells
    if keep == set(part["cells"]):
        return
    path.unlink()
    if not keep:
        return
    own = _of_cells(part["lab"], part, keep, 0.0)
    share = own.mutants / part["mutants"] if part["mutants"] else 0.0
    part.update(cells={gid: fp for gid, fp in part["cells"].items() if gid in keep},
                seconds=round(part["seconds"] * share, 1), mutants=own.mutants, outcome=own.outcome,
                equivalent=own.equivalent, not_shown=own.not_shown, not_run=own.not_run,
                found_equivalent=own.found_equivalent)
    (path.parent / ("+".join(sorted(keep)) + ".json")).write_text(json.dumps(part, indent=1) + "\n")


def _cell_of(key: str) -> str:
    """The exercise cell a mutant id ("ex3_code:12:ab12") or a not-run key ("ex3_code (mutants ...)") belongs to."""
    return key.split(":")[0].split(" ")[0]


def _of_cells(assignment: str, found: dict, cells: set[str], seconds: float) -> LabResult:
    """What `found` (a LabResult's fields, or a part read back) says of the mutants of `cells` only."""
    part = LabResult(assignment, seconds=seconds,
                     found_equivalent=[k for k in found["found_equivalent"] if _cell_of(k) in cells],
                     **{name: {k: tuple(v) if name == "outcome" else v for k, v in found[name].items()
                               if _cell_of(k) in cells}
                        for name in ("outcome", "equivalent", "not_shown", "not_run")})
    part.mutants = len(part.outcome) + len(part.equivalent) + sum(part.not_run.values())
    return part


def split(r: LabResult, folder: Path = RESULTS) -> list[Path]:
    """A full run as one part per exercise cell (results/parts/<lab>/<cell>.json): each cell's mutants and the
    seconds they took; the notebook's own run (the seconds no cell's mutants took) goes with the first cell."""
    cells = [c.grade_id for c in notebook_cells(r.assignment) if c.exercise]
    rest = max(0.0, r.seconds - sum(r.cell_seconds.values()))
    return [record_part(_of_cells(r.assignment, vars(r), {gid}, round(r.cell_seconds.get(gid, 0.0)
                                                                       + (rest if index == 0 else 0.0), 1)),
                        [gid], folder)
            for index, gid in enumerate(cells)]


def assemble(assignment: str, folder: Path = RESULTS) -> tuple[LabResult | None, list[str], dict]:
    """(the lab's result made from its parts, None while they leave cells out; the cells still missing; the date and
    machine a record of it gives). A part whose cells changed since it ran is left out; of two parts naming the same
    cell, the newer file counts."""
    today = _today(assignment)
    parts = sorted((folder / "parts" / assignment).glob("*.json"), key=lambda p: p.stat().st_mtime)
    merged, owner = LabResult(assignment), {}
    kept = []
    for path in parts:
        part = json.loads(path.read_text())
        if any(today.get(gid) != fp for gid, fp in part["cells"].items()):
            continue
        kept.append(part)
        for gid in part["cells"]:
            owner[gid] = len(kept) - 1
    missing = sorted(set(today) - set(owner))
    if missing:
        return None, missing, {}
    for index, part in enumerate(kept):
        mine = {gid for gid, i in owner.items() if i == index}
        if not mine:
            continue
        own = _of_cells(assignment, part, mine, part["seconds"])
        merged.outcome |= own.outcome
        merged.equivalent |= own.equivalent
        merged.not_shown |= own.not_shown
        merged.not_run |= own.not_run
        merged.found_equivalent += own.found_equivalent
        merged.seconds = round(merged.seconds + own.seconds, 1)
        merged.mutants += own.mutants
    used = [kept[i] for i in sorted(set(owner.values()))]
    machines = sorted({part["machine"].split(", load")[0] for part in used})
    about = {"date": max(part["date"] for part in used),
             "machine": f"{' / '.join(machines)}; in {len(used)} parts (results/parts/), their seconds added"}
    return merged, [], about


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
