"""Grade every mutant of a lab's solution cells with the lab's own check cells (`make mutation LAB=NN`).

The solution notebook runs once, top to bottom, in an IPython shell in this process. Before each exercise cell
(an nbgrader solution cell), one child process is forked per mutant of that cell: it runs the mutant instead of the
cell, then every cell up to the last check cell before the next exercise cell, and reports which graded check
cells failed. A mutant is killed
when one of them fails (or the child outruns its time limit, as nbgrader's cell timeout would score it); it survives
when all pass. The unmutated notebook must pass every graded cell, or the run says so and scores nothing.

The check cells run here, in one process, as `tests/labs` runs the checks, not through the judge and the sandbox:
what is measured is whether the checks can tell a wrong implementation, not whether grading is safe (which
`tests/autograder/test_judge*.py` and `test_witness.py` cover).

Known mutants are listed in autograder/mutation/known.json: "equivalent" (the same behaviour as the solution, each
with its reason) and "survivors" (wrong, and not yet caught: the next check to write); "gpu_only" names exercises
whose checks run on a GPU only: without one their mutants are not run and are reported apart. The score is
killed / (mutants run - equivalent).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from autograder.mutation.mutants import Mutant, mutants_of
from autograder.paths import MUTATION_KNOWN, REPO_ROOT

__all__ = ["Cell", "LabResult", "notebook_cells", "run_lab", "load_known", "markdown"]

SOLUTIONS = REPO_ROOT / "solutions"


@dataclass(frozen=True)
class Cell:
    index: int
    grade_id: str | None
    source: str
    exercise: bool       # an nbgrader solution cell with a grade id: what a learner writes
    graded: bool         # an nbgrader grade cell (a check)


@dataclass
class LabResult:
    assignment: str
    baseline_failures: list[str] = field(default_factory=list)
    killed: dict[str, str] = field(default_factory=dict)         # id -> the first check cell that failed, or timeout
    survived: dict[str, str] = field(default_factory=dict)       # id -> diff line
    equivalent: dict[str, str] = field(default_factory=dict)     # id -> reason (from known.json)
    not_run: dict[str, int] = field(default_factory=dict)        # GPU-only exercise -> its mutants (no GPU here)
    mutants: int = 0
    seconds: float = 0.0

    @property
    def score(self) -> float:
        judged = len(self.killed) + len(self.survived)
        return len(self.killed) / judged if judged else float("nan")


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


def load_known(assignment: str, path: Path = MUTATION_KNOWN) -> dict[str, dict[str, str]]:
    data = json.loads(path.read_text()) if path.exists() else {}
    entry = data.get(assignment, {})
    return {key: dict(entry.get(key, {})) for key in ("equivalent", "survivors", "gpu_only")}


def _run_cells(shell: Any, cells: list[Cell]) -> list[str]:
    """Run the cells in order; the grade ids of graded cells that raised, with the first line of their error."""
    failed = []
    for cell in cells:
        result = shell.run_cell(cell.source, store_history=False, silent=False)
        if cell.graded and not result.success:
            err = result.error_in_exec or result.error_before_exec
            failed.append(f"{cell.grade_id}: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
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


def _in_child(shell: Any, mutant: Mutant, following: list[Cell], timeout_s: float) -> tuple[str, str]:
    """Fork; the child runs the mutant and the following cells and writes its failures to a pipe."""
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
                mutated = Cell(-1, mutant.cell, mutant.source, True, False)
                failed = _run_cells(shell, [mutated] + following)
            os.write(write, json.dumps(failed).encode())
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
    if not data:
        stacks.seek(0)
        where = [line.strip() for line in stacks.read().decode(errors="replace").splitlines() if "File" in line][:3]
        return "killed", f"timeout or crash (no verdict within {timeout_s:.0f} s){': ' if where else ''}{' | '.join(where)}"
    failed = json.loads(data)
    return ("killed", failed[0]) if failed else ("survived", "")


def run_lab(assignment: str, *, sample: int | None = None, seed: int = 0, timeout_s: float = 120,
            exercises: list[str] | None = None, known_path: Path = MUTATION_KNOWN,
            log: Any = print) -> LabResult:
    """Mutation-test one lab (see the module docstring). `sample`: only that many mutants, drawn with `seed` from
    those known.json lists neither as equivalent nor as a survivor (so every one must be killed)."""
    from IPython.core.interactiveshell import InteractiveShell

    backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    started = time.perf_counter()
    cells = notebook_cells(assignment)
    known = load_known(assignment, known_path)
    result = LabResult(assignment)
    chosen: dict[int, list[Mutant]] = {}
    import torch

    for pos, cell in enumerate(cells):
        if cell.exercise and (exercises is None or cell.grade_id in exercises):
            if cell.grade_id in known["gpu_only"] and not torch.cuda.is_available():
                result.not_run[cell.grade_id] = len(mutants_of(cell.source, cell.grade_id))
                continue
            chosen[pos] = mutants_of(cell.source, cell.grade_id)
    every = [mu for ms in chosen.values() for mu in ms]
    result.mutants = len(every)
    result.equivalent = {mu.id: known["equivalent"][mu.id] for mu in every if mu.id in known["equivalent"]}
    if sample is not None:
        pool = [mu for mu in every if mu.id not in known["equivalent"] and mu.id not in known["survivors"]]
        keep = {mu.id for mu in random.Random(seed).sample(pool, min(sample, len(pool)))}
        chosen = {pos: [mu for mu in ms if mu.id in keep] for pos, ms in chosen.items()}
        chosen = {pos: ms for pos, ms in chosen.items() if ms}
    last = max(chosen, default=-1)
    shell = InteractiveShell.instance()
    cwd = os.getcwd()
    os.chdir(SOLUTIONS / assignment)
    try:
        with _one_thread():
            for pos, cell in enumerate(cells[: last + 1 if sample is not None else len(cells)]):
                following = _checks_after(cells, pos) if chosen.get(pos) else []
                for mu in chosen.get(pos, []):
                    if mu.id in result.equivalent:
                        continue
                    verdict, why = _in_child(shell, mu, following, timeout_s)
                    if verdict == "killed":
                        result.killed[mu.id] = why
                    else:
                        result.survived[mu.id] = f"[{mu.kind}] {mu.diff_line(cell.source)}"
                        log(f"  survived {mu.id}: {result.survived[mu.id]}")
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    result.baseline_failures += _run_cells(shell, [cell])
                if cell.exercise and chosen.get(pos):
                    log(f"{assignment} {cell.grade_id}: {len(chosen[pos])} mutants, "
                        f"{sum(1 for mu in chosen[pos] if mu.id in result.killed)} killed")
    finally:
        os.chdir(cwd)
        InteractiveShell.clear_instance()
        if backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = backend
    result.seconds = round(time.perf_counter() - started, 1)
    return result


def markdown(results: list[LabResult]) -> str:
    rows = ["| lab | mutants | equivalent | killed | survived | score | seconds |", "|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.assignment} | {r.mutants} | {len(r.equivalent)} | {len(r.killed)} | {len(r.survived)} | "
                    f"{r.score:.0%} | {r.seconds:.0f} |")
    for r in results:
        if r.not_run:
            rows.append(f"\n{r.assignment}: not run without a GPU (their checks run on a GPU only): "
                        + ", ".join(f"{ex} ({n} mutants)" for ex, n in r.not_run.items()))
        if r.baseline_failures:
            rows.append(f"\n{r.assignment}: the solution itself failed {r.baseline_failures}: no score")
        if r.survived:
            rows.append(f"\n{r.assignment} survivors (wrong implementations its checks pass):")
            rows += [f"- `{mid}` {diff}" for mid, diff in r.survived.items()]
    return "\n".join(rows)
