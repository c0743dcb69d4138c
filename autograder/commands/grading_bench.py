"""grading-bench: how long grading takes on this machine (maintenance; `make bench` runs it).

Per lab, the solution notebook is submitted as one student to a throwaway course and graded by the instructor's batch
(`autograder.grading.batch.autograde`: sandboxed, the witness on, one job): the wall seconds of that whole call (the
release of the assignment, the sandboxed job, the gradebook's record), the job's own seconds, the score, and the load
average before and after. Then a class: `--class-size` copies of lab 05's solution as students s000..., graded with
`--jobs N`: total seconds, seconds per submission, submissions per minute.

The result goes to data/bench/grading.json (machine, versions, loads, rows, the goals of issue 60 and whether each is
met) and a Markdown table is printed; `--readme` puts that table into README.md between its grading-bench markers.
scripts/measure_autograde_throughput.py is a thin command line over `build_class` and `time_autograde`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HELP = "maintenance: seconds to grade each lab's solution (sandboxed, witness on) and a class of lab 05 with --jobs N"

BEGIN, END = "<!-- grading-bench:start -->", "<!-- grading-bench:end -->"
DEFAULT_OUT = Path("data") / "bench" / "grading.json"
# Issue 60's goals, on the 2-core machine, quiet.
GOAL_LAB_S = 20.0
GOAL_LAB00_S = 10.0
GOAL_CLASS_S = 300.0
GOAL_CLASS_SIZE, GOAL_CLASS_JOBS = 30, 2
CLASS_LAB = "05"
TIMEOUT_S = 900.0
_clock = time.perf_counter     # a test's fake clock replaces it
NOT_MEASURED = ("Grading has not been measured on this machine yet: `make bench` (or `python -m autograder "
                "grading-bench`) writes `data/bench/grading.json`, and `python -m autograder grading-bench --readme` "
                "puts its table here.\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labs", nargs="+", metavar="NN", help="labs to grade one submission of (default: every lab)")
    p.add_argument("--class-size", type=int, default=GOAL_CLASS_SIZE,
                   help=f"submissions of lab {CLASS_LAB} in the class (0: no class)")
    p.add_argument("--jobs", type=int, default=GOAL_CLASS_JOBS, help="the class's jobs at a time")
    p.add_argument("--quick", action="store_true", help="lab 00 only and a class of 4")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds allowed to one submission")
    p.add_argument("--out", type=Path, help=f"the JSON written (default: the course's {DEFAULT_OUT})")
    p.add_argument("--readme", action="store_true",
                   help="only rewrite README.md's table (between its grading-bench markers) from the JSON")


# ----------------------------------------------------------------------------- measuring

def loads() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages now."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine() -> dict[str, Any]:
    from importlib import metadata

    from autograder.machine import cpu_name

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"processor": cpu_name(), "cores": os.cpu_count(), "system": platform.system(),
            "python": platform.python_version(), "torch": version("torch"), "nbgrader": version("nbgrader")}


def lab_folders(course_root: Path, labs: list[str] | None) -> list[str]:
    """Assignment folders under solutions/ for lab numbers ("00", "5", "05_quantization"); all when labs is None."""
    found = sorted(p.name for p in (course_root / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())
    if labs is None:
        return found
    chosen = []
    for lab in labs:
        match = [a for a in found if a == lab or a[:2] == lab.zfill(2)[:2]]
        if not match:
            from autograder.grading.basics import GradingError
            raise GradingError(f"no lab {lab} under {course_root / 'solutions'} (there: {', '.join(found)})")
        chosen.append(match[0])
    return chosen


def build_class(course_root: Path, assignment: str, dest: Path, students: int, *, release: bool = False) -> Path:
    """A throwaway course in dest holding one assignment, its solution notebook (or, with release, the released
    stub) submitted as students s000, s001, ..."""
    from autograder.grading import nbgrader_runs

    course = nbgrader_runs.make_temp_course(course_root, assignment, dest)
    src = course / "solutions" / assignment / f"{assignment}.ipynb"
    if release:
        nbgrader_runs.release(course, [assignment])
        src = course / "labs" / assignment / f"{assignment}.ipynb"
    for i in range(students):
        d = course / "submitted" / f"s{i:03d}" / assignment
        d.mkdir(parents=True)
        shutil.copy(src, d / src.name)
    return course


def time_autograde(course: Path, jobs: int, *, timeout: float = TIMEOUT_S,
                   log: Callable[[str], None] = print) -> tuple[float, list]:
    """Grade every submission of the course with the instructor's batch (sandboxed, witness as configured):
    (wall seconds, results). Timed as a fresh `make autograde` would run: no judge zygote is left from an earlier
    call (autograder/judging/judge_zygote.py), so its start is inside the time."""
    from autograder.grading import batch
    from autograder.judging import forked_judges

    forked_judges.close_all()
    t0 = _clock()
    results = batch.autograde(course, timeout=timeout, jobs=jobs, progress=False, log=log)
    return _clock() - t0, results


GPU_NOTE = "AssertionError: needs a GPU"   # harness.require_gpu's message where there is no GPU


def _lab_goal(assignment: str) -> float:
    return GOAL_LAB00_S if assignment.startswith("00") else GOAL_LAB_S


def _lost(results: list) -> list[str]:
    """The cells that lost points, once each: "grade_id (score / max: note)"."""
    return sorted({f"{c.grade_id} ({c.score:g} / {c.max_score:g}{': ' + c.note[:120] if c.note else ''})"
                   for r in results for c in r.cells if c.score < c.max_score})


def _all_earned(results: list) -> bool:
    """Every point the machine can award: all of them, less the GPU tier's where this machine has no GPU (a GPU
    cell then fails with harness.require_gpu's "needs a GPU" and awards nothing, by design)."""
    def missed(r) -> float:
        return sum(c.max_score - c.score for c in r.cells if not c.note.startswith(GPU_NOTE))
    return bool(results) and all(r.status == "ok" and missed(r) == 0 for r in results)


def profile(cell_times: list[dict], job_seconds: float | None, slowest: int = 3) -> dict[str, Any]:
    """Where one submission's job went: seconds in the learner's cells ('solution'), the course's cells the grading
    slice kept ('course'), the test cells (checks, judge and witness), the rest of the job (sandbox, nbgrader, kernel
    start and shutdown, the notebook written back), and the slowest cells by grade id (or 'cell N')."""
    by_kind = {kind: round(sum(c["seconds"] for c in cell_times if c["kind"] == kind), 2)
               for kind in ("course", "solution", "test")}
    in_cells = sum(by_kind.values())
    top = sorted(cell_times, key=lambda c: -c["seconds"])[:slowest]
    return {"cells_run": len(cell_times), **{f"{k}_s": v for k, v in by_kind.items()},
            "outside_cells_s": round(job_seconds - in_cells, 2) if job_seconds is not None else None,
            "slowest": [[c["grade_id"] or f"cell {c['index'] + 1}", round(c["seconds"], 2)] for c in top]}


def measure_lab(course_root: Path, assignment: str, *, timeout: float, log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        course = build_class(course_root, assignment, Path(tmp) / "course", 1)
        before = loads()
        seconds, results = time_autograde(course, 1, timeout=timeout, log=log)
        after = loads()
    r = results[0] if results else None
    goal = _lab_goal(assignment)
    return {"lab": assignment[:2], "assignment": assignment, "seconds": round(seconds, 2),
            "job_seconds": round(r.seconds, 2) if r else None,
            "record_seconds": round(r.record_seconds, 2) if r else None,
            "score": r.score if r else None, "max_score": r.max_score if r else None,
            "status": r.status if r else "not graded", "lost": _lost(results), "load_before": before,
            "load_after": after, "goal_s": goal, "met": bool(_all_earned(results) and seconds <= goal),
            "profile": profile(r.cell_times, r.seconds) if r else None}


def measure_class(course_root: Path, assignment: str, size: int, jobs: int, *, timeout: float,
                  log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="grading-bench-class-") as tmp:
        course = build_class(course_root, assignment, Path(tmp) / "course", size)
        before = loads()
        seconds, results = time_autograde(course, jobs, timeout=timeout, log=log)
        after = loads()
    judged = size == GOAL_CLASS_SIZE and jobs == GOAL_CLASS_JOBS
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    n = len(results)
    return {"lab": assignment[:2], "assignment": assignment, "submissions": n, "jobs": jobs,
            "seconds": round(seconds, 2), "seconds_per_submission": round(seconds / n, 2) if n else None,
            "per_minute": round(60 * n / seconds, 2) if n and seconds else None,
            "job_seconds": sorted(round(r.seconds, 1) for r in results),
            "record_seconds": sorted(round(r.record_seconds, 2) for r in results),
            "statuses": statuses, "scores": sorted({r.score for r in results}),
            "max_score": results[0].max_score if results else None, "lost": _lost(results),
            "all_earned": _all_earned(results) and n == size,
            "load_before": before, "load_after": after, "goal_s": GOAL_CLASS_S, "goal_class_size": GOAL_CLASS_SIZE,
            "goal_jobs": GOAL_CLASS_JOBS,
            "met": bool(_all_earned(results) and n == size and seconds <= GOAL_CLASS_S) if judged else None}


def goals(labs: list[dict[str, Any]], klass: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each goal of issue 60 with its measure and verdict (met None: not judged by this run)."""
    out = [{"goal": f"lab {row['lab']}: one submission graded in <= {row['goal_s']:g} s (all points earned)",
            "measured_s": row["seconds"], "met": row["met"]} for row in labs]
    if klass is not None:
        out.append({"goal": f"a class of {GOAL_CLASS_SIZE} lab {CLASS_LAB} submissions with --jobs {GOAL_CLASS_JOBS} "
                            f"in <= {GOAL_CLASS_S:g} s",
                    "measured_s": klass["seconds"], "met": klass["met"],
                    **({} if klass["met"] is not None else
                       {"why_not_judged": f"a class of {klass['submissions']} with --jobs {klass['jobs']}"})})
    return out


def measure(course_root: Path, labs: list[str], class_size: int, jobs: int, *, timeout: float, command: str,
            log: Callable[[str], None]) -> dict[str, Any]:
    load_before = loads()
    rows = []
    for a in labs:
        rows.append(measure_lab(course_root, a, timeout=timeout, log=log))
        log(f"grading-bench: {a}: {rows[-1]['seconds']:.1f} s, {rows[-1]['score']} / {rows[-1]['max_score']} "
            f"({rows[-1]['status']}), load {rows[-1]['load_before']} -> {rows[-1]['load_after']}")
    klass = None
    if class_size > 0:
        (class_lab,) = lab_folders(course_root, [CLASS_LAB])
        klass = measure_class(course_root, class_lab, class_size, jobs, timeout=timeout, log=log)
        log(f"grading-bench: class of {klass['submissions']} x {class_lab}, --jobs {jobs}: {klass['seconds']:.1f} s")
    return {"command": command, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "settings": {"sandboxed": True, "witness": os.environ.get("COURSE_WITNESS", "1") != "0",
                         "timeout_s": timeout, "jobs_per_lab": 1},
            "load_before": load_before, "load_after": loads(), "labs": rows, "class": klass,
            "goals": goals(rows, klass)}


# ----------------------------------------------------------------------------- the table

def _verdict(met: bool | None) -> str:
    return "not judged" if met is None else ("met" if met else "**not met**")


def _load(row: dict[str, Any]) -> str:
    b, a = row.get("load_before"), row.get("load_after")
    return f"{b[0]:g} -> {a[0]:g}" if b and a else "? -> ?"


def _score(score: Any, max_score: Any) -> str:
    return "" if score is None else f"{score:g} / {max_score:g}"


def render_table(data: dict[str, Any]) -> str:
    m, s = data["machine"], data["settings"]
    lines = [f"Measured by `make bench` (`{data['command']}`) on {data['date']}: {m['processor']}, {m['cores']} cores, "
             f"torch {m['torch']}, nbgrader {m['nbgrader']}; {'sandboxed' if s['sandboxed'] else 'unsandboxed'}, "
             f"witness {'on' if s['witness'] else 'off'}; 1-minute load {_load(data).replace(' -> ', ' before and ')} "
             f"after. Raw figures in `data/bench/grading.json`.", "",
             "| grading | seconds | per submission | score | load before -> after | goal |",
             "|---|---|---|---|---|---|"]
    for row in data["labs"]:
        job = f" (job {row['job_seconds']:.1f} s)" if row.get("job_seconds") is not None else ""
        lines.append(f"| {row['assignment']}, one submission | {row['seconds']:.1f} s{job} | {row['seconds']:.1f} s | "
                     f"{_score(row['score'], row['max_score'])} {row['status']} | {_load(row)} | "
                     f"<= {row['goal_s']:g} s {_verdict(row['met'])} |")
    k = data.get("class")
    if k:
        goal = (f"<= {k['goal_s']:g} s {_verdict(k['met'])}" if k["met"] is not None else
                f"<= {k['goal_s']:g} s for {k['goal_class_size']} with --jobs {k['goal_jobs']}: not judged")
        scores = ", ".join(f"{x:g}" for x in k["scores"])
        statuses = ", ".join(f"{n} {st}" for st, n in sorted(k["statuses"].items()))
        lines.append(f"| a class: {k['submissions']} x {k['assignment']}, --jobs {k['jobs']} | {k['seconds']:.1f} s | "
                     f"{k['seconds_per_submission'] or 0:.1f} s ({k['per_minute'] or 0:.2f} a minute) | "
                     f"{scores} / {k['max_score'] or 0:g} ({statuses}) | {_load(k)} | {goal} |")
    profiled = [row for row in data["labs"] if row.get("profile")]
    if profiled:
        lines += ["", "Where one submission's time went (seconds of its job: the course cells the grading slice runs, "
                      "the learner's cells, the test cells with their judge and witness, and the rest: sandbox, "
                      "nbgrader, kernel start; then its slowest cells; outside the job, once per assignment however "
                      "many submit: the release nbgrader makes to grade against, the gradebook's template and "
                      "record):", "",
                  "| lab | course cells | learner cells | test cells | rest of the job | slowest cells | "
                  "outside the job |",
                  "|---|---|---|---|---|---|---|"]
        for row in profiled:
            p = row["profile"]
            slow = ", ".join(f"{name} {s:.1f}" for name, s in p["slowest"])
            rest = f"{p['outside_cells_s']:.1f}" if p["outside_cells_s"] is not None else "?"
            outside = (f"{row['seconds'] - row['job_seconds']:.1f}" if row.get("job_seconds") is not None else "?")
            lines.append(f"| {row['assignment']} ({p['cells_run']} cells run) | {p['course_s']:.1f} | "
                         f"{p['solution_s']:.1f} | {p['test_s']:.1f} | {rest} | {slow} | {outside} |")
    missed = [row for row in profiled if row["met"] is False]
    if missed:
        lines += ["", "Where the missed goals' seconds are (the largest part of each submission's time):"]
        lines += [f"- {row['assignment']}: {_largest_part(row)}" for row in missed]
    lost = [(row["assignment"], row.get("lost")) for row in [*data["labs"], *([k] if k else [])] if row.get("lost")]
    if lost:
        lines += ["", "Points not earned (cell: score / max, and why):"]
        lines += [f"- {a}: {'; '.join(cells)}" for a, cells in lost]
    return "\n".join(lines) + "\n"


def _largest_part(row: dict[str, Any]) -> str:
    """One sentence: a lab's seconds against its goal and the largest of its parts (test cells, course cells, the
    rest of the job, outside the job), with the slowest cells where the test cells are the largest."""
    p = row["profile"]
    outside = row["seconds"] - row["job_seconds"] if row.get("job_seconds") is not None else 0.0
    parts = {"its test cells (judge and witness inside)": p["test_s"], "the course cells the slice runs": p["course_s"],
             "the rest of the job (sandbox, nbgrader, kernel)": p["outside_cells_s"] or 0.0,
             "outside the job (the release and gradebook, once per assignment)": outside}
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    slow = ", ".join(f"{cell} {s:.1f} s" for cell, s in p["slowest"])
    return (f"{row['seconds']:.1f} s against {row['goal_s']:g} s; the largest part, {seconds:.1f} s, is {name}"
            + (f" (slowest: {slow})" if name.startswith("its test") else f"; its job {row['job_seconds']:.1f} s"))


def sync_readme(readme: Path, table: str) -> bool:
    """Put `table` between README's grading-bench markers (minigpt.bench's writer); True if the file changed."""
    from minigpt.bench.ledger import sync_readme as put_between

    return put_between(readme, table, BEGIN, END, what="grading-bench")


def readme_table(out: Path) -> str:
    return render_table(json.loads(out.read_text())) if out.exists() else NOT_MEASURED


# ----------------------------------------------------------------------------- the command

def run(args: argparse.Namespace, course: Path) -> int:
    out = args.out if args.out is not None else course / DEFAULT_OUT
    if args.readme:
        readme = course / "README.md"
        changed = sync_readme(readme, readme_table(out))
        print(f"{readme}: grading table {'updated' if changed else 'already up to date'}"
              f"{'' if out.exists() else f' ({out} not measured yet)'}")
        return 0
    labs = ["00"] if args.quick and not args.labs else args.labs
    size = 4 if args.quick else args.class_size
    chosen = lab_folders(course, labs)
    command = (f"python -m autograder grading-bench --labs {' '.join(a[:2] for a in chosen)} --class-size {size} "
               f"--jobs {args.jobs}")
    data = measure(course, chosen, size, args.jobs, timeout=args.timeout, command=command,
                   log=lambda line: print(line, file=sys.stderr, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(render_table(data))
    print(f"written: {out}")
    return 0
