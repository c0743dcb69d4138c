"""`python -m autograder COMMAND`: the course's grading and maintenance commands.

    grade PATH [--assignment A]      grade one notebook as nbgrader autograde would (last line: score: X / Y);
                                     in the bubblewrap sandbox where one can start
    autograde [--assignment A ...]   instructor: grade every submission under submitted/<student>/<assignment>/,
              [--jobs N]             each in its own sandbox, N at a time (default: the machine's cores),
              [--scheduler ADDR]     or on Dask workers (ADDR: tcp://host:8786, or "local" for a LocalCluster);
              [--unsafe]             refuses where no sandbox can start, unless --unsafe
    feedback [--assignment A]        instructor: nbgrader generate_feedback (HTML under feedback/)
    export [--csv grades.csv]        instructor: gradebook to CSV
    similarity --assignment A        instructor: answers sharing code with a classmate's, the package's reference
               [--threshold T]       or the course's solution, per exercise (copydetect), most similar first;
               [--csv F] [--html F]  a lead to read, not a verdict
    release [--assignment A ...]     regenerate labs/ from solutions/ (nbgrader generate_assignment) and normalize
    normalize [--check] [PATHS]      strip outputs / execution counts from notebooks (or only check)
    doctor                           what this machine can run
    calibrate [--lab NN] [--runs N] [--check NAME]
                                     measure every speed check of this device class (reference vs plausible slow
                                     implementations) and write its threshold to autograder/calibration/
    gpu-check [--calibrate] [--fresh] [--only LAB ...]
                                     the GPU tier: every GPU check and benchmark, a JSON + Markdown report, resumable
    workspace [--dir D]              learner: create/update the workspace copy of labs/ (never overwrites your edits)
    progress [--dir D] [--lab NN]    learner: each lab's score in the workspace (CPU and GPU points apart)
    runall [--fix] [--assignment A]  maintenance: does Run All reach the last cell of each released notebook?
    exercise-map [--check]           maintenance: which check and learner function belong to which exercise
    interview [-n N] [--seed S] [--topic T ...]   interview practice with fresh numbers, graded and diagnosed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autograder.grading import nbgrader_runs as grading, notebooks


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--course", type=Path, default=grading.REPO_ROOT,
                   help="course root holding nbgrader_config.py and solutions/ (default: this repository)")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade one notebook")
    g.add_argument("path", type=Path)
    g.add_argument("--assignment", help="assignment id (default: found from the notebook's name)")
    g.add_argument("--timeout", type=float, default=grading.SUBMISSION_TIMEOUT_S,
                   help="wall-clock seconds for the whole notebook")
    g.add_argument("--json", type=Path, help="also write the result as JSON here")
    g.add_argument("--keep", type=Path, help="keep the temporary course folder (autograded notebook) here")
    g.add_argument("--require-full", action="store_true",
                   help="exit 1 unless the notebook scores full marks (nbgrader validate always exits 0)")
    g.add_argument("--unsafe", action="store_true", help="run the kernel without the sandbox")

    a = sub.add_parser("autograde", help="grade every submission (instructor)")
    a.add_argument("--assignment", action="append", help="only this assignment (repeatable)")
    a.add_argument("--student", action="append", help="only this student (repeatable)")
    a.add_argument("--timeout", type=float, default=grading.SUBMISSION_TIMEOUT_S,
                   help="wall-clock seconds per submission")
    a.add_argument("--json", type=Path, help="also write all results as JSON here")
    a.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once, each with one torch thread (default: the machine's cores)")
    a.add_argument("--scheduler", help="grade on Dask: a scheduler address (tcp://host:8786), or 'local' "
                                       "for a LocalCluster of --jobs workers (pip install '.[cluster]')")
    a.add_argument("--unsafe", action="store_true",
                   help="grade even where no sandbox can start: learners' code then runs with your rights")
    a.add_argument("--memory", type=float, default=3.0, help="GiB of address space per kernel (RLIMIT_AS)")
    a.add_argument("--disk", type=float, default=0.5, help="GiB of writable tmpfs per kernel")

    f = sub.add_parser("feedback", help="nbgrader generate_feedback (instructor)")
    f.add_argument("--assignment")

    e = sub.add_parser("export", help="gradebook to CSV (instructor)")
    e.add_argument("--csv", type=Path)

    sm = sub.add_parser("similarity", help="answers sharing code with others or with the reference (instructor)")
    sm.add_argument("--assignment", required=True)
    sm.add_argument("--threshold", type=float, default=0.5,
                    help="report an answer when at least this share of its fingerprints is found in another's")
    sm.add_argument("--csv", type=Path, help="also write the matches as CSV here")
    sm.add_argument("--html", type=Path, help="also write copydetect's side-by-side HTML report here")

    r = sub.add_parser("release", help="regenerate labs/ from solutions/")
    r.add_argument("--assignment", action="append")

    n = sub.add_parser("normalize", help="strip outputs from notebooks")
    n.add_argument("--check", action="store_true", help="only report; exit 1 if a notebook is not normalized")
    n.add_argument("paths", nargs="*", type=Path)

    sub.add_parser("doctor", help="what this machine can run")
    c = sub.add_parser("calibrate", help="set the speed thresholds of this device class from measurements")
    c.add_argument("--lab", help="only this lab's checks (e.g. 04)")
    c.add_argument("--runs", type=int, default=5, help="runs per implementation (default 5)")
    c.add_argument("--check", help="only this check (e.g. lab04_flash_speed)")
    c.add_argument("--device", choices=("cpu", "cuda"), help="tier to calibrate (default: cuda when present, else cpu)")
    c.add_argument("--out", type=Path, help="write the files here instead of autograder/calibration/")
    c.add_argument("--small", action="store_true", help="small shapes: tests the machinery, calibrates nothing")
    c.add_argument("--note", default="", help="recorded in each file (e.g. 'machine shared with other jobs')")

    gc = sub.add_parser("gpu-check", help="run the GPU tier and report what it measured (needs a CUDA GPU)")
    gc.add_argument("--calibrate", action="store_true", help="run `calibrate` first (thresholds for this GPU)")
    gc.add_argument("--fresh", action="store_true", help="start over instead of resuming the labs already done")
    gc.add_argument("--only", action="append", help="only this part (repeatable): lab01, lab03, lab04, lab05, lab08, "
                    "machine, tests")
    gc.add_argument("--out", type=Path, help="report folder (default autograder/calibration/)")

    w = sub.add_parser("workspace", help="create or update the learner's workspace from labs/")
    w.add_argument("--dir", type=Path, help="the workspace (default: workspace/ in the course root)")

    pr = sub.add_parser("progress", help="each lab's score in the workspace")
    pr.add_argument("--dir", type=Path, help="the workspace (default: workspace/ in the course root)")
    pr.add_argument("--lab", action="append", help="only labs starting with this (e.g. 02; repeatable)")
    pr.add_argument("--regrade", action="store_true", help="grade again even notebooks that did not change")

    ra = sub.add_parser("runall", help="run released notebooks as Run All would; list (or tag) raising cells")
    ra.add_argument("--assignment", action="append")
    ra.add_argument("--fix", action="store_true", help="tag raising cells raises-exception in solutions/, re-release")

    em = sub.add_parser("exercise-map", help="regenerate autograder/exercise_map.json from solutions/")
    em.add_argument("--check", action="store_true", help="only report; exit 1 if it is out of date")

    from autograder.interview.session import TOPICS
    i = sub.add_parser("interview", help="interview practice: questions with fresh numbers, graded and explained")
    i.add_argument("-n", type=int, default=10, help="number of questions (default 10)")
    i.add_argument("--seed", type=int, help="repeat a session (default: a new seed, printed)")
    i.add_argument("--topic", action="append", choices=TOPICS, help="only this topic (repeatable)")
    i.add_argument("--history", type=Path, help="score history file (default: .interview_history.jsonl "
                                                 "in the course root, or $COURSE_INTERVIEW_HISTORY)")
    i.add_argument("--no-history", action="store_true", help="do not record this session")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    course = args.course.resolve()
    try:
        if args.command == "grade":
            from autograder.grading import batch
            from autograder.judging import sandbox
            sandboxed = not args.unsafe
            if sandboxed and (why := sandbox.probe()):
                print(f"note: no sandbox here ({why}); grading your notebook without one", file=sys.stderr)
                sandboxed = False
            res = batch.grade_notebook(args.path, assignment=args.assignment, course_root=course,
                                       timeout=args.timeout, keep=args.keep, sandboxed=sandboxed)
            print(f"{args.path}: assignment {res.assignment}, status {res.status}")
            for note in res.notes:
                print(f"  note: {note}")
            for c in res.cells:
                extra = f"  ({c.note})" if c.note else ""
                print(f"  {c.grade_id:<28} {c.score:g} / {c.max_score:g}{extra}")
            if args.json:
                args.json.write_text(json.dumps(res.to_dict(), indent=1))
            print(f"score: {res.score:g} / {res.max_score:g}")
            return 1 if args.require_full and res.score < res.max_score else 0
        if args.command == "autograde":
            from autograder.grading import batch
            from autograder.judging import sandbox
            policy = sandbox.SandboxPolicy(memory_bytes=int(args.memory * sandbox.GiB),
                                           tmp_bytes=int(args.disk * sandbox.GiB), cpu_seconds=int(args.timeout) + 5)
            results = batch.autograde(course, args.assignment, args.student, timeout=args.timeout, jobs=args.jobs,
                                      scheduler=args.scheduler, unsafe=args.unsafe, policy=policy)
            if not results:
                print(f"no submissions under {course / 'submitted'}/<student>/<assignment>/")
            else:
                bad = [r for r in results if r.status != "ok"]
                print(f"graded {len(results)} submission(s); {len(bad)} with problems (see status column)")
            if args.json:
                args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
            return 0
        if args.command == "feedback":
            out = grading.generate_feedback(course, args.assignment)
            print(f"feedback written under {out}")
            return 0
        if args.command == "export":
            out = grading.export_grades(course, args.csv)
            print(f"grades exported to {out}")
            return 0
        if args.command == "similarity":
            from autograder.grading import similarity
            matches, notes = similarity.compare(course, args.assignment, threshold=args.threshold, html=args.html)
            for note in notes:
                print(f"note: {note}")
            print(similarity.format_table(matches))
            if args.csv:
                similarity.write_csv(matches, args.csv)
            return 0
        if args.command == "release":
            for folder in grading.release(course, args.assignment):
                print(f"released {folder.relative_to(course)}")
            return 0
        if args.command == "normalize":
            paths = args.paths or notebooks.find_notebooks(course)
            changed = [p for p in paths if not notebooks.is_normalized(p)]
            if args.check:
                for p in changed:
                    print(f"not normalized: {p} (run `python -m autograder normalize`)")
                return 1 if changed else 0
            for p in changed:
                notebooks.normalize_file(p)
                print(f"normalized {p}")
            return 0
        if args.command == "doctor":
            from autograder import doctor
            return doctor.main()
        if args.command == "workspace":
            from autograder.learner import workspace
            print(workspace.sync(course, args.dir or course / "workspace").summary())
            return 0
        if args.command == "progress":
            from autograder.learner import progress
            rows = progress.progress(course, args.dir or course / "workspace", labs=args.lab, regrade=args.regrade,
                                     on_start=lambda lab: print(f"grading {lab} (it changed since it was last graded)",
                                                                flush=True))
            print(progress.format_table(rows))
            return 0
        if args.command == "runall":
            from autograder.grading import runall
            stuck = 0
            for a in args.assignment or grading.assignments(course):
                for nb_path in sorted((course / "labs" / a).glob("*.ipynb")):
                    executed = runall.run_released(nb_path)
                    missing = runall.untagged(executed)
                    stuck += bool(missing)
                    for c in missing:
                        print(f"{nb_path.relative_to(course)}: cell {c.index + 1} ({c.grade_id or c.cell_id}) raises "
                              f"{c.ename} without the {runall.TAG} tag")
                    if args.fix:
                        added = runall.tag_cells(course / "solutions" / a / nb_path.name, {c.cell_id for c in missing})
                        print(f"solutions/{a}/{nb_path.name}: {added} cell(s) tagged")
                if args.fix:
                    grading.release(course, [a])
            return 1 if stuck and not args.fix else 0
        if args.command == "exercise-map":
            from autograder.checking import learner_errors
            if args.check:
                stale = learner_errors.build_map() != learner_errors.exercise_map()
                print("exercise_map.json is out of date: run `python -m autograder exercise-map`" if stale
                      else "exercise_map.json is current")
                return 1 if stale else 0
            changed = learner_errors.write_map()
            print(f"{'wrote' if changed else 'unchanged:'} {learner_errors.EXERCISE_MAP}")
            return 0
        if args.command == "interview":
            from autograder.interview import session
            history = None if args.no_history else (args.history or session.history_path())
            session.run_session(args.n, args.seed, tuple(args.topic or session.TOPICS), history=history)
            return 0
        if args.command == "calibrate":
            from autograder.gpu_tier import calibrate
            return calibrate.main(lab=args.lab, runs=args.runs, check=args.check, small=args.small, out_dir=args.out,
                                  device=args.device, note=args.note)
        if args.command == "gpu-check":
            from autograder.gpu_tier import gpu_check
            return gpu_check.main(course, out_dir=args.out, calibrate=args.calibrate, fresh=args.fresh, only=args.only)
    except grading.GradingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
