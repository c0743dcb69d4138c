"""`make progress`: each lab's score in the learner's workspace, CPU-tier and GPU-tier points apart.

    rows = progress(course_root, workspace)      # grades what changed since it was last graded
    print(format_table(rows))

A notebook is graded as `make grade` grades it (`batch.grade_notebook`, nbgrader in a temporary course), and the
result is kept in `workspace/.progress.json` under the notebook's fingerprint (its cells, not their outputs), so a
lab is graded again only after it changed; `make grade` of a workspace notebook records its result there too. A
notebook whose learner cells are still the release's scores 0 without running. GPU-tier cells are the graded cells
that call `require_gpu(`: without a GPU they earn nothing, so a CPU-only learner's maximum is the CPU column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

from autograder.grading import batch, nbgrader_runs as grading
from autograder.learner.workspace import MANIFEST, fingerprint

CACHE = ".progress.json"


def learner_cells(notebook: Path) -> list[str]:
    """The sources of the cells a learner writes (nbgrader solution cells), in order: outputs, execution counts and
    the other cells do not say whether the learner has started."""
    return [cell.source for cell in nbformat.read(str(notebook), as_version=4).cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("solution")]


def _load_cache(ws: Path) -> dict:
    try:
        return json.loads((ws / CACHE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save_cache(ws: Path, cache: dict) -> None:
    (ws / CACHE).write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")


def _entry(digest: str, result: dict, status: str | None = None) -> dict:
    """A cache entry: the notebook's fingerprint, the grading's result and its status ("graded" when it ran)."""
    status = status or ("graded" if result.get("status") == "ok" else str(result.get("status")))
    return {"fingerprint": digest, "result": result, "status": status}


def record(notebook: Path, result: dict) -> None:
    """Keep a grading of `notebook` in its workspace's progress cache, as `make progress` would (`make grade` calls
    this), so the lab is not graded again until it changes. A notebook outside a workspace (no release manifest in
    a folder above it) is not remembered."""
    notebook = Path(notebook).resolve()
    ws = next((d for d in notebook.parents if (d / MANIFEST).exists()), None)
    if ws is None:
        return
    cache = _load_cache(ws)
    cache[notebook.relative_to(ws).as_posix()] = _entry(fingerprint(notebook), result)
    _save_cache(ws, cache)


def graded_points(notebook: Path) -> tuple[dict[str, float], dict[str, float]]:
    """({grade_id: points} of CPU-tier cells, {grade_id: points} of GPU-tier cells) of a released notebook."""
    cpu, gpu = {}, {}
    for cell in nbformat.read(str(notebook), as_version=4).cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            (gpu if "require_gpu(" in cell.source else cpu)[meta["grade_id"]] = float(meta.get("points", 0))
    return cpu, gpu


@dataclass
class LabProgress:
    lab: str
    notebook: str
    cpu_score: float | None        # None: not graded (missing or failed to grade)
    cpu_max: float
    gpu_score: float | None
    gpu_max: float
    status: str                    # "graded", "cached", "not started", "not in workspace", or the grading status/error


def _split(result: dict, cpu: dict[str, float], gpu: dict[str, float]) -> tuple[float, float]:
    scores = {c["grade_id"]: float(c["score"]) for c in result.get("cells", [])}
    return sum(scores.get(g, 0.0) for g in cpu), sum(scores.get(g, 0.0) for g in gpu)


def progress(course_root: Path, workspace: Path, *, labs: list[str] | None = None, regrade: bool = False,
             grade: Callable[[Path], grading.SubmissionResult] | None = None,
             on_start: Callable[[str], None] = lambda lab: None) -> list[LabProgress]:
    """One row per released notebook; grades each workspace notebook that changed since its last grading."""
    course_root, workspace = Path(course_root), Path(workspace)
    grade = grade or (lambda path: batch.grade_notebook(path, course_root=course_root))
    cache = _load_cache(workspace)
    rows = []
    for released in sorted((course_root / "labs").glob("*/*.ipynb")):
        lab = released.parent.name
        if labs and not any(lab.startswith(x) for x in labs):
            continue
        rel = released.relative_to(course_root / "labs").as_posix()
        cpu, gpu = graded_points(released)
        mine = workspace / rel
        if not mine.exists():
            rows.append(LabProgress(lab, rel, None, sum(cpu.values()), None, sum(gpu.values()), "not in workspace"))
            continue
        if not regrade and learner_cells(mine) == learner_cells(released):
            rows.append(LabProgress(lab, rel, 0.0, sum(cpu.values()), 0.0, sum(gpu.values()), "not started"))
            continue                                # an untouched release scores 0: nothing to run
        digest = fingerprint(mine)
        entry = cache.get(rel)
        status = "cached"
        if regrade or not entry or entry.get("fingerprint") != digest:
            on_start(lab)
            try:
                entry = _entry(digest, grade(mine).to_dict())
            except grading.GradingError as err:
                entry = _entry(digest, {"cells": [], "status": "error"}, f"error: {err}")
            cache[rel], status = entry, entry["status"]
            _save_cache(workspace, cache)
        cpu_score, gpu_score = _split(entry["result"], cpu, gpu)
        ok = not entry["status"].startswith("error")
        rows.append(LabProgress(lab, rel, cpu_score if ok else None, sum(cpu.values()),
                                gpu_score if ok else None, sum(gpu.values()), status))
    return rows


def format_table(rows: list[LabProgress]) -> str:
    """A plain-text table: lab, CPU points, GPU points, status; a total line."""
    def pts(score: float | None, top: float) -> str:
        return f"{'-' if score is None else f'{score:g}'} / {top:g}" if top else "none"
    lines = [f"{'lab':<28} {'CPU tier':>10} {'GPU tier':>10}  status", "-" * 62]
    for r in rows:
        lines.append(f"{r.lab:<28} {pts(r.cpu_score, r.cpu_max):>10} {pts(r.gpu_score, r.gpu_max):>10}  {r.status}")
    cpu = sum(r.cpu_score or 0 for r in rows), sum(r.cpu_max for r in rows)
    gpu = sum(r.gpu_score or 0 for r in rows), sum(r.gpu_max for r in rows)
    lines += ["-" * 62, f"{'total':<28} {pts(*cpu):>10} {pts(*gpu):>10}",
              "GPU-tier points need a CUDA GPU; without one the CPU column is the maximum."]
    return "\n".join(lines)
