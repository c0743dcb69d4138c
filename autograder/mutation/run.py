"""Grade every mutant of a lab's solution cells with the lab's own check cells (`make mutation LAB=NN`).

The solution notebook runs once, top to bottom, in an IPython shell in this process. Before each exercise cell
(an nbgrader solution cell), one child process is forked per mutant of that cell: it runs the mutant instead of the
cell, then every cell up to the last check cell before the next exercise cell, and reports how each graded check
cell that failed failed (outcome.py). A mutant is

* killed by a check:  a check's AssertionError (the check told it apart and said so, naming the exercise);
* killed by a crash:  its own code raised, or it outran its time limit (a hang; nbgrader's cell timeout scores 0);
* broken:             a check cell failed for another reason (the check or the harness broke): not a kill;
* survived:           every check passed.

The unmutated notebook must pass every graded cell, or the run says so and scores nothing.

The check cells run here, in one process, as `tests/labs` runs the checks, not through the judge and the sandbox:
what is measured is whether the checks can tell a wrong implementation, not whether grading is safe (which
`tests/autograder/test_judge*.py` and `test_witness.py` cover).

Known mutants are listed per lab in autograder/mutation/known/<lab>.json: "equivalent" (the same behaviour as the
solution, each with its reason), "survivors" (wrong, and not yet caught: the next check to write) and "gpu_only"
(an exercise whose checks run on a GPU only, or one mutant only a GPU tells apart): those are not run without a GPU
and are reported apart. An "equivalent" entry counts only when it is shown: a differential test on drawn valid
inputs (equivalence.py, the exercise's contract in contracts/) finds no difference, in a child of its own; one
without a contract, or one the test splits, is graded by the checks like any mutant and reported as "not shown".
A survivor known/ does not list gets the same differential test: shown equivalent, it counts as equivalent and the
report lists it for known/ (with the reason a reader needs); split, it stays a survivor.
Scores, exercise cells and interview-answer cells apart: (killed by a check + by a crash) / (mutants run - shown
equivalent).
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import io
import json
import linecache
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from autograder.mutation import outcome
from autograder.mutation.contracts import contract_for
from autograder.mutation.equivalence import answers, differential
from autograder.mutation.mutants import Mutant, mutants_of
from autograder.paths import MUTATION_KNOWN, REPO_ROOT

__all__ = ["Cell", "LabResult", "KINDS", "is_interview", "notebook_cells", "run_lab", "load_known", "stale_entries",
           "changed_cells", "record_cells"]

SOLUTIONS = REPO_ROOT / "solutions"
KINDS = ("check", "crash", "hang", "broken", "survived")


@dataclass(frozen=True)
class Cell:
    index: int
    grade_id: str | None
    source: str
    exercise: bool       # an nbgrader solution cell with a grade id: what a learner writes
    graded: bool         # an nbgrader grade cell (a check)


def is_interview(cell_id: str) -> bool:
    """An interview answer cell (q1_code), scored apart from the exercises (ex1_code, warmup1_code)."""
    return cell_id.startswith("q")


@dataclass
class LabResult:
    assignment: str
    baseline_failures: list[str] = field(default_factory=list)
    outcome: dict[str, tuple[str, str]] = field(default_factory=dict)   # id -> (one of KINDS, what: check cell, diff)
    equivalent: dict[str, str] = field(default_factory=dict)    # id -> reason: shown by its differential test
    not_shown: dict[str, str] = field(default_factory=dict)     # id -> why a listed-equivalent mutant is not shown
    not_run: dict[str, int] = field(default_factory=dict)       # GPU-only exercise or mutant -> mutants not run here
    found_equivalent: list[str] = field(default_factory=list)   # survivors a differential test showed equivalent
    mutants: int = 0
    seconds: float = 0.0
    cell_seconds: dict[str, float] = field(default_factory=dict)   # exercise cell -> seconds its mutants took

    def ids(self, kind: str, interview: bool | None = None) -> list[str]:
        return [mid for mid, (k, _) in self.outcome.items()
                if k == kind and (interview is None or is_interview(mid) == interview)]

    @property
    def killed(self) -> dict[str, str]:
        """Killed by a check or by a crash or hang: {id: what}."""
        return {mid: what for mid, (k, what) in self.outcome.items() if k in ("check", "crash", "hang")}

    @property
    def survived(self) -> dict[str, str]:
        return {mid: what for mid, (k, what) in self.outcome.items() if k == "survived"}

    def score(self, interview: bool | None = None) -> float:
        """(killed by a check + by a crash or hang) / mutants run (shown-equivalent ones are not run)."""
        run = [k for mid, (k, _) in self.outcome.items() if interview is None or is_interview(mid) == interview]
        return sum(k in ("check", "crash", "hang") for k in run) / len(run) if run else float("nan")


def notebook_cells(assignment: str) -> list[Cell]:
    nb = json.loads((SOLUTIONS / assignment / f"{assignment}.ipynb").read_text())
    cells = []
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code":
            continue
        meta = c.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id")
        cells.append(Cell(i, gid, "".join(c["source"]), bool(meta.get("solution") and gid),
                          bool(meta.get("grade") and not meta.get("solution"))))
    return cells


def load_known(assignment: str, folder: Path = MUTATION_KNOWN) -> dict[str, dict[str, str]]:
    """known/<assignment>.json's "equivalent", "survivors" and "gpu_only" ({} each when absent)."""
    path = folder / f"{assignment}.json"
    entry = json.loads(path.read_text()) if path.exists() else {}
    return {key: dict(entry.get(key, {})) for key in ("equivalent", "survivors", "gpu_only")}


def fingerprint(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()[:12]


def changed_cells(assignment: str, folder: Path = MUTATION_KNOWN) -> list[str]:
    """The cells named by known/'s entries whose source is not the one the entries were last checked against
    (known/<lab>.json's "cells" fingerprints, written by `--check-known`): fast, no mutant made."""
    path = folder / f"{assignment}.json"
    recorded = json.loads(path.read_text()).get("cells", {}) if path.exists() else {}
    cells = {c.grade_id: c for c in notebook_cells(assignment) if c.exercise}
    known = load_known(assignment, folder)
    named = {key.split(":")[0] for group in known.values() for key in group}
    return sorted(gid for gid in named if gid not in cells or recorded.get(gid) != fingerprint(cells[gid].source))


def record_cells(assignment: str, folder: Path = MUTATION_KNOWN) -> list[str]:
    """Check every entry of known/<lab>.json against today's cells (stale_entries) and, when none is stale, record
    the cells' fingerprints there; returns the stale entries (nothing recorded then)."""
    stale = stale_entries(assignment, folder)
    if not stale:
        path = folder / f"{assignment}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        cells = {c.grade_id: c for c in notebook_cells(assignment) if c.exercise}
        named = {key.split(":")[0] for key in data.get("equivalent", {}) | data.get("survivors", {})
                 | data.get("gpu_only", {})}
        data["cells"] = {gid: fingerprint(cells[gid].source) for gid in sorted(named) if gid in cells}
        path.write_text(json.dumps(data, indent=1) + "\n")
    return stale


def stale_entries(assignment: str, folder: Path = MUTATION_KNOWN, only: list[str] | None = None) -> list[str]:
    """known/'s entries for this lab (of the cells in `only`, if given) that name no mutant of its solution cells (the
    cell changed): each must be looked at again, or removed."""
    cells = {c.grade_id: c for c in notebook_cells(assignment) if c.exercise}
    known = load_known(assignment, folder)
    known = {group: {k: v for k, v in entries.items() if only is None or k.split(":")[0] in only}
             for group, entries in known.items()}
    named = [key for group in known.values() for key in group if key.count(":") == 2]
    lines: dict[str, set[int]] = {}
    for key in named:                                  # only the lines named: a whole lab's mutants take minutes
        cell, line, _ = key.split(":")
        lines.setdefault(cell, set()).add(int(line))
    ids = {mu.id for gid, wanted in lines.items() if gid in cells
           for mu in mutants_of(cells[gid].source, gid, only_lines=wanted)}
    stale = [f"equivalent {mid}" for mid in known["equivalent"] if mid not in ids]
    stale += [f"survivors {mid}" for mid in known["survivors"] if mid not in ids]
    stale += [f"gpu_only {key}" for key in known["gpu_only"] if key not in cells and key not in ids]
    return stale


def _run_cells(shell: Any, cells: list[Cell], mutant_files: set[str] = frozenset()) -> list[tuple[str, str, str]]:
    """Run the cells in order; (grade id, outcome kind, first line of the error) of each graded cell that raised."""
    failed = []
    for cell in cells:
        result = shell.run_cell(cell.source, store_history=False, silent=False)
        if cell.graded and not result.success:
            err = result.error_in_exec or result.error_before_exec
            first = str(err).splitlines()[0][:160] if str(err) else ""
            failed.append((cell.grade_id, outcome.classify(err, set(mutant_files)),
                           f"{cell.grade_id}: {type(err).__name__}: {first}"))
    return failed


def _checks_after(cells: list[Cell], pos: int) -> list[Cell]:
    """The cells after cells[pos] up to the last check cell before the next exercise: what a mutant of cells[pos]
    must run (what runs after that last check decides nothing)."""
    following = []
    for nxt in cells[pos + 1:]:
        if nxt.exercise:
            break
        following.append(nxt)
    while following and not following[-1].graded:
        following.pop()
    return following


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread for the whole run, whatever a cell or a check asks (torch.set_num_threads does nothing
    inside): OpenMP's worker threads do not survive fork(), so a child that asks for two threads after the parent
    ran on two waits for ever. Lab 01's timed checks did, and their mutants, equivalent ones included, were
    "killed" by the time limit. Timed checks then compare their contenders on the same one thread."""
    import torch

    set_threads, before = torch.set_num_threads, torch.get_num_threads()
    set_threads(1)
    torch.set_num_threads = lambda n: None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(before)


def _in_child(work: Callable[[], Any], timeout_s: float) -> tuple[bool, Any, str]:
    """Fork; the child runs work() quietly and writes its JSON result to a pipe. (finished, result, where it stuck)."""
    read, write = os.pipe()
    stacks = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:                                          # the child: quiet, bounded, never returns
        try:
            os.close(read)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            faulthandler.dump_traceback_later(timeout_s, exit=True, file=stacks)   # where it stuck, then out
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                result = work()
            os.write(write, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout_s + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    if data:
        return True, json.loads(data), ""
    stacks.seek(0)
    where = [line.strip() for line in stacks.read().decode(errors="replace").splitlines() if "File" in line][:3]
    return False, None, " | ".join(where)


def _grade(shell: Any, mutant: Mutant, following: list[Cell], timeout_s: float) -> tuple[str, str]:
    """(kind, what) of one mutant graded by the check cells after it (KINDS; see the module docstring)."""
    def work() -> dict:
        before = set(linecache.cache)
        first = shell.run_cell(mutant.source, store_history=False, silent=False)
        files = set(linecache.cache) - before
        raised = None if first.success else (first.error_in_exec or first.error_before_exec)
        failed = _run_cells(shell, following, files)
        return {"raised": None if raised is None else f"{type(raised).__name__}: {str(raised)[:120]}",
                "failed": failed}

    finished, result, where = _in_child(work, timeout_s)
    if not finished:
        return "hang", f"no verdict within {timeout_s:.0f} s{': ' if where else ''}{where}"
    failed = result["failed"]
    if result["raised"] and failed:                   # its own cell raised: what fails after it follows from that
        return "crash", f"its own cell raised {result['raised']}"
    for kind in ("check", "crash", "broken"):         # a check's verdict first, then a crash
        found = [what for _, k, what in failed if k == kind]
        if found:
            return kind, found[0]
    return "survived", ""


def _shown_equivalent(shell: Any, cell: Cell, mutant: Mutant, assignment: str, timeout_s: float) -> str | None:
    """None when a differential test shows the mutant equivalent; else why not (no contract, or the input that
    splits it)."""
    contract = contract_for(assignment, cell.grade_id)
    if contract is None and not is_interview(cell.grade_id):
        return f"no contract for {cell.grade_id} (autograder/mutation/contracts/)"

    def work() -> dict:
        if contract is None:
            return {"differs": answers(shell.user_ns, cell.source, mutant.source)}
        return {"differs": differential(contract, shell.user_ns, cell.source, mutant.source)}

    finished, result, where = _in_child(work, timeout_s)
    if not finished:
        return f"the differential test did not finish within {timeout_s:.0f} s{': ' if where else ''}{where}"
    return None if result["differs"] is None else f"split: {result['differs']}"


def run_lab(assignment: str, *, sample: int | None = None, seed: int = 0, timeout_s: float = 120,
            exercises: list[str] | None = None, known_path: Path = MUTATION_KNOWN, equivalence_only: bool = False,
            gpu_only: bool = False, log: Any = print) -> LabResult:
    """Mutation-test one lab (see the module docstring). `sample`: only that many mutants, drawn with `seed` from
    those known/ lists neither as equivalent nor as a survivor (so every one must be killed). `equivalence_only`:
    only the differential tests of the listed-equivalent mutants (what shows them, or splits them). `gpu_only`:
    only the mutants known/ lists as GPU-only, exercise or mutant (`make gpu-check` runs them where a GPU is)."""
    from IPython.core.interactiveshell import InteractiveShell

    backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    started = time.perf_counter()
    cells = notebook_cells(assignment)
    known = load_known(assignment, known_path)
    result = LabResult(assignment)
    chosen: dict[int, list[Mutant]] = {}
    import torch

    gpu = torch.cuda.is_available()
    for pos, cell in enumerate(cells):
        if cell.exercise and (exercises is None or cell.grade_id in exercises):
            every = mutants_of(cell.source, cell.grade_id)
            if gpu_only and cell.grade_id not in known["gpu_only"]:
                every = [mu for mu in every if mu.id in known["gpu_only"]]
            if cell.grade_id in known["gpu_only"] and not gpu:
                result.not_run[cell.grade_id] = len(every)
                continue
            waiting = [mu for mu in every if mu.id in known["gpu_only"] and not gpu]
            if waiting:
                result.not_run[f"{cell.grade_id} (mutants only a GPU tells apart)"] = len(waiting)
            chosen[pos] = [mu for mu in every if mu not in waiting]
    result.mutants = sum(len(ms) for ms in chosen.values()) + sum(result.not_run.values())
    if sample is not None:
        pool = [mu for ms in chosen.values() for mu in ms
                if mu.id not in known["equivalent"] and mu.id not in known["survivors"]]
        keep = {mu.id for mu in random.Random(seed).sample(pool, min(sample, len(pool)))}
        chosen = {pos: [mu for mu in ms if mu.id in keep] for pos, ms in chosen.items()}
    if equivalence_only:
        chosen = {pos: [mu for mu in ms if mu.id in known["equivalent"]] for pos, ms in chosen.items()}
    partial = sample is not None or equivalence_only or gpu_only
    chosen = {pos: ms for pos, ms in chosen.items() if ms}
    last = max(chosen, default=-1)
    shell = InteractiveShell.instance()
    cwd = os.getcwd()
    os.chdir(SOLUTIONS / assignment)
    try:
        with _one_thread():
            for pos, cell in enumerate(cells[: last + 1 if partial else len(cells)]):
                following = _checks_after(cells, pos) if chosen.get(pos) else []
                cell_started = time.perf_counter()
                for mu in chosen.get(pos, []):
                    if mu.id in known["equivalent"]:
                        why_not = _shown_equivalent(shell, cell, mu, assignment, timeout_s)
                        if why_not is None:
                            result.equivalent[mu.id] = known["equivalent"][mu.id]
                            continue
                        result.not_shown[mu.id] = why_not
                        log(f"  not shown equivalent {mu.id}: {why_not}")
                        if equivalence_only:
                            continue
                    kind, what = _grade(shell, mu, following, timeout_s)
                    if kind == "survived" and mu.id not in known["equivalent"] | known["survivors"] and \
                            _shown_equivalent(shell, cell, mu, assignment, timeout_s) is None:
                        result.equivalent[mu.id] = f"[{mu.kind}] {mu.diff_line(cell.source)}"
                        result.found_equivalent.append(mu.id)     # shown here: known/ can list it with a reason
                        continue
                    result.outcome[mu.id] = (kind, what if kind != "survived" else
                                             f"[{mu.kind}] {mu.diff_line(cell.source)}")
                    if kind in ("survived", "broken"):
                        log(f"  {kind} {mu.id}: {result.outcome[mu.id][1]}")
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    result.baseline_failures += [what for _, _, what in _run_cells(shell, [cell])]
                if cell.exercise and chosen.get(pos):
                    result.cell_seconds[cell.grade_id] = round(time.perf_counter() - cell_started, 1)
                    ms = [mu.id for mu in chosen[pos]]
                    log(f"{assignment} {cell.grade_id}: {len(ms)} mutants, "
                        f"{sum(1 for m in ms if m in result.killed)} killed, "
                        f"{sum(1 for m in ms if m in result.equivalent)} shown equivalent")
    finally:
        os.chdir(cwd)
        InteractiveShell.clear_instance()
        if backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = backend
    result.seconds = round(time.perf_counter() - started, 1)
    return result
