"""mutation --lab NN: mutation testing of a lab's checks (autograder/mutation/)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "mutants of a lab's solution cells graded by its checks: score and survivors"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lab", action="append", default=[], help="lab number or folder (repeatable): 00, 02_paged_kv_cache; all: every lab")
    p.add_argument("--sample", type=int, help="only N mutants, seeded, drawn from those not known as equivalent or "
                   "surviving (each must be killed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exercise", action="append", help="only this exercise cell's mutants (grade id, repeatable): a "
                   "part of a full run, recorded in results/parts/; once parts cover every cell as it is today, "
                   "they are recorded as the lab's run")
    p.add_argument("--timeout", type=float, default=120, help="seconds per mutant (nbgrader's cell limit scores a "
                   "mutant that outruns it as killed)")
    p.add_argument("--equivalence-only", action="store_true", help="only the differential tests of the mutants "
                   "known/ lists as equivalent: which are shown, which are split (autograder/mutation/equivalence.py)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--check-known", action="store_true", help="only check known/<lab>.json's entries against "
                   "today's cells and, when none is stale, record the cells' fingerprints (make test compares them)")
    p.add_argument("--write-docs", action="store_true", help="only remake docs/instructors.md's table from the full "
                   "runs recorded in autograder/mutation/results/ (a full run records itself there)")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.mutation.report import assemble, markdown, record, record_part, summary, write_docs
    from autograder.mutation.run import run_lab

    if args.write_docs:
        write_docs()
        return 0
    if not args.lab:
        print("mutation: --lab NN (repeatable), or --write-docs")
        return 2
    full = args.sample is None and not args.exercise and not args.equivalence_only
    if args.check_known:
        from autograder.mutation.run import record_cells

        labs = [p.name for p in sorted((course / "solutions").iterdir()) if p.is_dir()
                and (args.lab == ["all"] or any(p.name.startswith(lab.zfill(2)[:2]) for lab in args.lab))]
        stale = {lab: record_cells(lab) for lab in labs}
        for lab, found in stale.items():
            print(f"{lab}: " + ("recorded" if not found else "stale entries, nothing recorded: " + ", ".join(found)))
        return 1 if any(stale.values()) else 0
    results = []
    labs = ([p.name[:2] for p in sorted((course / "solutions").iterdir()) if p.is_dir()] if args.lab == ["all"]
            else args.lab)
    for lab in labs:
        matches = sorted(p.name for p in (course / "solutions").iterdir() if p.name.startswith(lab.zfill(2)[:2]))
        if len(matches) != 1:
            print(f"mutation: no single lab matches {lab!r} (solutions/: {matches})")
            return 2
        results.append(run_lab(matches[0], sample=args.sample, seed=args.seed, timeout_s=args.timeout,
                               exercises=args.exercise, equivalence_only=args.equivalence_only))
    print(markdown(results))
    for r in results:
        if full and not r.baseline_failures:
            print(f"recorded in {record(r)} (python -m autograder mutation --write-docs puts it in docs/instructors.md)")
        elif args.exercise and args.sample is None and not args.equivalence_only and not r.baseline_failures:
            print(f"part recorded in {record_part(r, args.exercise)}")
            whole, missing, about = assemble(r.assignment)
            if whole is None:
                print(f"{r.assignment}: parts still missing for {', '.join(missing)}")
            else:
                print(f"every cell has its part: recorded in {record(whole, about=about)} ({whole.seconds:.0f} s "
                      "in all; python -m autograder mutation --write-docs puts it in docs/instructors.md)")
    if args.json:
        args.json.write_text(json.dumps([summary(r) for r in results], indent=1) + "\n")
    failed = any(r.baseline_failures for r in results) or (
        args.sample is not None and any(r.ids("survived") or r.ids("broken") for r in results))
    return 1 if failed else 0
