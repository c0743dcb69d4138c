"""nbgrader preprocessors of the course (named in nbgrader_config.py).

* `LimitOutputSize`  every output, attachment and the notebook's metadata bounded in size, whatever its type
  (autograder/grading/output_limits.py; here for the configs that name it `autograder.grading.preprocessors.LimitOutputSize`).
* `StoppingExecute`  nbgrader's Execute, except that a cell which ignores the interrupt after its time
  limit (or kills the kernel) ends the run *for the cells after it*: they are marked as not run, and the
  points of the cells before it stand. nbgrader's own Execute raises, which loses every point. Test cells
  are not run in the learner's kernel: the judge runs them (autograder/judging/judge.py) while the kernel serves
  it (autograder/judging/observe.py), and the cell's outputs are the judge's. COURSE_JUDGE=0 turns that off
  (test cells run in the kernel, as nbgrader does; for measuring what judging costs). A test cell whose checks
  refuse the reference is graded again in a witness whose package lacks it (autograder/judging/witness.py); COURSE_WITNESS=0
  turns that off (for measuring what it costs). Where the cell's witness plan is known
  (autograder/judging/witness_plans.py), the witness grades it alone, the kernel waiting (COURSE_WITNESS_PLANS=0: kernel
  first, always). A judged cell that runs
  past its limit is a timeout (CellTimeoutError, no points), whatever the judge saw of the interrupted kernel.
  Only the cells a grade depends on run: every cell the learner wrote or may have changed, every test cell, and
  the course's locked cells that bind a name one of those reads (autograder/judging/witness.py's `cells_to_run`);
  the course's measurements, plots and views are left out, each with a note saying so. COURSE_ALL_CELLS=1 runs
  every cell (Run All, as the course's own tests check it).
* `HideTestSources`  for feedback: a test cell shows its grade and failure message, not its source, its
  traceback (whose frames quote hidden test lines) or what learner code printed from inside it.
"""

from __future__ import annotations

import contextlib
import json
import re
import time

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Enum, Integer

from autograder.grading.output_limits import LimitOutputSize  # noqa: F401  (named by nbgrader_config.py)
from autograder.judging.witness_plans import PLAN_MARK, cell_key, plan_for

STUCK_ENAME = "CellTimeoutError"
STUCK_NOTE = "ran past its time limit and did not stop when interrupted (SIGINT ignored?)"
TIMED_OUT_NOTE = ("this check ran past its time limit of {limit:g} s and was stopped: it earns no points "
                  "(the points of the cells before it stand)")
DEAD_ENAME = "DeadKernelError"
NOT_RUN_ENAME = "CellNotRun"
LEFT_OUT_NOTE = "not run when grading: no graded cell depends on this cell (Run All runs it)\n"
WARM_UP_TIMEOUT_S = 300     # importing the judge's counterpart (and torch) in a fresh kernel, before the first test cell
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
PROGRESS_MARK = "course-progress:"   # nbgrader's log line of a graded cell done (`make grade` shows them as they come)
TIME_MARK = "course-cell-time:"      # nbgrader's log line of every code cell run: index, kind, seconds, grade id or - (profile)


def error_output(ename: str, evalue: str, lines: list[str] | None = None) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=lines or [f"{ename}: {evalue}"])


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def said_to_learner(out: NotebookNode) -> str:
    """The message an error output shows the learner: the first line of its traceback's last entry, which is the
    course's explanation where there is one ("Question 1 is not answered yet: ...", "Exercise 3 (check_x): ...";
    autograder/checking/learner_errors.py) and IPython's "Name: message" otherwise; "ename: evalue" (first line)
    when the output has no traceback."""
    entries = [_ANSI.sub("", entry).strip() for entry in out.get("traceback") or []]
    entries = [entry for entry in entries if entry]
    if entries:
        return entries[-1].splitlines()[0]
    first = (out.get("evalue") or "").strip().splitlines()
    return f"{out.ename}: {first[0]}" if first else out.ename


class StoppingExecute(Execute):
    """nbgrader's Execute; a stuck cell or a dead kernel stops the run instead of failing it."""

    _stopped: str = ""

    def __init__(self, *args, **kwargs):
        import os

        if os.environ.get("COURSE_SANDBOX"):
            from autograder.judging.sandbox import SandboxedKernelManager

            kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    judge_test_cells = Bool(True, help="run test cells in the judge, not in the learner's kernel").tag(config=True)
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate", help="the kernel is killed once "
                           "the last cell ran (nbclient's default waits for it to stop on request: seconds of a "
                           "grading job with nothing left to grade)").tag(config=True)
    witness = Bool(True, help="grade a test cell whose checks refuse the reference again, in a process whose "
                   "course package lacks it (autograder/judging/witness.py)").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        import os

        self._stopped = ""
        self._judge = None
        self._witnesses = None          # the notebook's witness process, once a test cell asked (_witness_starter)
        self._own_socket_dir = None     # made here when the kernel has no socket folder (no sandbox); removed after
        self._kernel_socket_dir = None  # the sandboxed kernel's (its manager removes it; again here, in case not)
        self._kernel_ready = False
        self._passing = True            # whether the last witnessed test cell passed (see _judged_cell)
        self._judging = self.judge_test_cells and os.environ.get("COURSE_JUDGE", "1") != "0"
        self._witnessing = self.witness and os.environ.get("COURSE_WITNESS", "1") != "0"
        self._cwd = ((resources or {}).get("metadata") or {}).get("path") or None
        self._left_out = set() if os.environ.get("COURSE_ALL_CELLS") == "1" else left_out(nb, self._course_cells(resources))
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self._witnesses is not None:
                self._witnesses.kill()
                self._witnesses = None
            if self._judge is not None:
                self._judge.close()
                self._judge = None
            import shutil

            for folder in (self._own_socket_dir, self._kernel_socket_dir):
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)

    def _course_cells(self, resources) -> set[str]:
        """The sources of the course's own code cells (neither solution nor test) in this notebook as released,
        under the course's release folder (labs/); none where it cannot be read (then every cell runs)."""
        import nbformat
        from nbgrader.coursedir import CourseDirectory

        meta = (resources or {}).get("nbgrader") or {}
        try:
            coursedir = CourseDirectory(config=self.config)
            folder = coursedir.format_path(coursedir.release_directory, ".", meta["assignment"])
            released = nbformat.read(f"{folder}/{meta['notebook']}.ipynb", as_version=4)
        except (KeyError, OSError, ValueError) as exc:
            self.log.info("every cell runs (the released notebook could not be read: %s)", exc)
            return set()
        return {c.source for c in released.cells if c.cell_type == "code" and not _is_test_cell(c)
                and not c.metadata.get("nbgrader", {}).get("solution")}

    def preprocess_cell(self, cell, resources, index):
        if self._stopped:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs = [error_output(NOT_RUN_ENAME, f"not run: {self._stopped}")]
            return cell, resources
        if index in self._left_out:
            from nbformat.v4 import new_output

            cell.outputs = [new_output("stream", name="stdout", text=LEFT_OUT_NOTE)]
            return cell, resources
        judged = self._judging and cell.cell_type == "code" and _is_test_cell(cell) and cell.source.strip()
        if self._judging and self._judge is None and not judged and cell.cell_type == "code":
            with contextlib.suppress(RuntimeError, OSError):     # it gets ready while the learner's first cells
                self._start_judge()                               # run; one that cannot start: the test cell says
        started = time.monotonic()
        try:
            if judged:
                return self._judged_cell(cell, resources, index)
            return super().preprocess_cell(cell, resources, index)
        except CellTimeoutError:
            self._stopped = f"cell {index + 1} {STUCK_NOTE}"
            cell.outputs.append(error_output(STUCK_ENAME, STUCK_NOTE))
            self._kill_kernel()
        except DeadKernelError:
            self._stopped = f"the kernel died in cell {index + 1}"
            cell.outputs.append(error_output(DEAD_ENAME, "the kernel died while running this cell "
                                             "(os._exit, a crash, or a resource limit)"))
        finally:
            self._report_progress(cell, time.monotonic() - started)
            if cell.cell_type == "code" and cell.source.strip():
                self.log.info("%s %d %s %.2f %s", TIME_MARK, index, _kind(cell), time.monotonic() - started,
                              cell.metadata.get("nbgrader", {}).get("grade_id") or "-")
        return cell, resources

    def _report_progress(self, cell, seconds: float) -> None:
        """One log line per graded cell as it finishes: its grade id, what it said, how long it took."""
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("grade") or not grade_id:
            return
        errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
        said = said_to_learner(errors[0])[:200] if errors else "passed"
        self.log.info("%s %s: %s (%.1f s)", PROGRESS_MARK, grade_id, said, seconds)

    def _judged_cell(self, cell, resources, index):
        """Run a test cell in the judge while the kernel serves it; the cell's outputs are the judge's."""
        import secrets

        from nbformat.v4 import new_code_cell, new_output

        if self._judge is not None and self._judge.proc.poll() is not None:     # died between cells: a fresh one
            self._judge.kill()
            self._judge = None
        try:
            if self._judge is None:
                self._start_judge()
        except (RuntimeError, OSError) as exc:
            return self._judge_failed(cell, resources, exc)
        if not self._kernel_ready:     # the kernel's side imports torch (while the judge does): not on the first
            saved, self.timeout = self.timeout, max(self.timeout or 0, WARM_UP_TIMEOUT_S)   # test cell's time limit
            try:
                super().preprocess_cell(new_code_cell("import autograder.judging.observe"), resources, index)
            finally:
                self.timeout = saved
                self.nb.cells[index] = cell
            self._kernel_ready = True
        try:
            self._judge.ready()
        except (RuntimeError, OSError) as exc:
            return self._judge_failed(cell, resources, exc)
        from autograder.judging.submission_processes import SubmissionHold

        hold = SubmissionHold(self._submission_roots)
        self._judge.on_isolation = hold.handle
        token = secrets.token_hex(8)
        # A plan is used while this notebook's checks pass: a failing cell fails as fast against the kernel, where
        # no witness need start (a notebook of stubs starts none after its first failure)
        plan = plan_for(cell.source) if self._witnessing and self._passing else None
        if plan is not None:           # its witness starts while the kernel serves the cell, and the kernel waits for it
            self._judge.start_witness_early = self._witness_starter(index)
        self._judge.run(cell.source, token, timeout=float(self.timeout or 300), witness=self._witnessing, plan=plan)
        serving = new_code_cell(f"import autograder.judging.observe\nautograder.judging.observe.serve({self._judge.path!r}, {token!r})")
        saved = self.timeout
        if plan is not None and self.timeout:
            self.timeout = 2 * self.timeout          # the witness's start and its run of the cell, both within the limit
        try:
            super().preprocess_cell(serving, resources, index)
        except BaseException:          # stuck or dead kernel: the judge's cell is void, the run stops here
            hold.release()
            self._judge.kill()
            self._judge = None
            cell.outputs = []
            raise
        finally:
            self.timeout = saved
            self.nb.cells[index] = cell    # nbclient stored the serving cell in the test cell's place
        timed_out = self._timed_out(serving)
        try:
            result = self._judge.result(wait=float(self.timeout or 300), start_witness=self._witness_starter(index))
        finally:
            hold.release()
        if plan is not None or result.get("witness_plan"):
            self._passing = not result["error"]
        if result.get("witness_plan"):
            self.log.info("%s %s", PLAN_MARK, json.dumps({"grade_id": cell.metadata.get("nbgrader", {}).get("grade_id"),
                                                          "cell": cell_key(cell.source), **result["witness_plan"]}))
        if result["error"] and result["error"]["ename"] in ("JudgeTimeout", "JudgeFailed"):   # a fresh judge next cell
            self._judge.kill()
            self._judge = None
        cell.execution_count = serving.get("execution_count")
        cell.outputs = []
        for name in ("stdout", "stderr"):
            if result.get(name):
                cell.outputs.append(new_output("stream", name=name, text=result[name]))
        error = result.get("error")
        if timed_out:     # the judge saw the kernel go away (BrokenPipeError, KernelStopped): the cause is the limit
            error = {"ename": STUCK_ENAME, "evalue": TIMED_OUT_NOTE.format(limit=float(self.timeout or 0))}
        if error:
            cell.outputs.append(error_output(error["ename"], error["evalue"], error.get("lines")))
        return cell, resources

    def _judge_failed(self, cell, resources, exc: Exception):
        """This cell earns nothing; the next test cell tries a fresh judge."""
        self._judge = None
        cell.outputs = [error_output("JudgeFailed", f"the grader's judge could not start ({exc}): this check earns "
                                     "no points")]
        return cell, resources

    def _start_judge(self) -> None:
        """A judge for this run, its socket in the kernel's socket folder (or one of our own without a sandbox),
        started, not waited for: it imports torch while the kernel works (JudgeProcess.ready waits)."""
        from autograder.judging.judge import JudgeProcess
        from autograder.judging.socket_folder import socket_folder

        socket_dir = self._kernel_socket_dir = getattr(self.km, "_socket_dir", None)
        if socket_dir is None:
            self._own_socket_dir = self._own_socket_dir or socket_folder("judge-")
            socket_dir = self._own_socket_dir
        self._judge = JudgeProcess(socket_dir, cwd=self._cwd, wait=False)

    def _submission_roots(self) -> dict:
        """The root processes of the submission's sandboxes (autograder/judging/submission_processes.py): the
        kernel's (bubblewrap's, or the kernel itself unsandboxed) and the witness process's while a witness runs,
        with that witness's own process, which serves the judge."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        witness = self._judge.witness if self._judge is not None else None
        if witness is None:
            return {"kernel": getattr(process, "pid", None), "witness": None}
        return {"kernel": getattr(process, "pid", None), "witness": witness.proc.pid,
                "serving": {"witness": witness.serving_pid()}}

    def _witness_starter(self, index: int):
        """How a witness for the test cell at `index` starts (autograder/judging/witness.py): the learner's cells before
        it (test cells are the judge's), the submission's folder, the judge's socket. The notebook's witness process
        starts with its first witness and forks the later ones."""
        from autograder.judging.witness import Witness, WitnessProcess

        def start(request: dict) -> Witness:
            cells = [c.source for i, c in enumerate(self.nb.cells[:index])
                     if c.cell_type == "code" and not _is_test_cell(c) and i not in self._left_out]
            process = self._witnesses
            if process is None or process.judge_socket != judge_socket or not process.running():
                if process is not None:
                    process.kill()
                process = self._witnesses = WitnessProcess(judge_socket, self._cwd)
            try:
                return process.start(request, cells)
            except BaseException:
                process.kill()                 # its folder and process go with it; the judge says the witness failed
                self._witnesses = None
                raise
        judge_socket = self._judge.path
        return start

    def _timed_out(self, serving: NotebookNode) -> bool:
        """Whether the kernel's serving cell ran past its time limit and was interrupted: nbgrader's Execute then
        adds its `error_on_timeout` output. (A notebook that fakes that output only fails its own check.)"""
        ename = (self.error_on_timeout or {}).get("ename", STUCK_ENAME)
        return any(out.output_type == "error" and out.get("ename") == ename for out in serving.get("outputs", []))

    def _kill_kernel(self) -> None:
        from jupyter_core.utils import run_sync

        try:
            run_sync(self.km.shutdown_kernel)(now=True)
        except Exception as exc:   # already gone
            self.log.warning("could not stop the kernel: %s", exc)


def left_out(nb: NotebookNode, course_cells: set[str]) -> set[int]:
    """Indices of the code cells grading leaves out: the course's own cells (a source in `course_cells`, neither
    solution nor test) that bind no name a cell which runs after them reads. Every other cell runs: the learner's
    (solution cells, a course cell changed, a cell added), the test cells, and what they need, found on the source
    IPython would run."""
    from IPython.core.inputtransformer2 import TransformerManager

    from autograder.judging.witness import cells_to_run

    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    transform = TransformerManager().transform_cell
    sources = []
    for i in code:
        try:
            sources.append(transform(nb.cells[i].source))
        except Exception:        # a source IPython cannot transform: read as it is (a syntax error runs anyway)
            sources.append(nb.cells[i].source)
    kept = [n for n, i in enumerate(code) if not _course_cell(nb.cells[i], course_cells)]
    running = {code[n] for n in cells_to_run(sources, kept)}
    return {i for i in code if i not in running and nb.cells[i].source.strip()}


def _course_cell(cell: NotebookNode, course_cells: set[str]) -> bool:
    """A cell of the course's, as the course wrote it: not a solution cell, not a test cell."""
    meta = cell.metadata.get("nbgrader", {})
    return cell.source in course_cells and not meta.get("solution") and not meta.get("grade")


def _kind(cell: NotebookNode) -> str:
    """'test', 'solution' or 'course' (a code cell the learner does not write), for the grading profile."""
    meta = cell.metadata.get("nbgrader", {})
    return "solution" if meta.get("solution") else "test" if meta.get("grade") else "course"


def _is_test_cell(cell: NotebookNode) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def hidden_test_lines(source: str) -> list[str]:
    """The lines between BEGIN/END HIDDEN TESTS markers (stripped, non-trivial)."""
    out, inside = [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            inside = True
        elif HIDDEN_END in line:
            inside = False
        elif inside and len(line.strip()) >= 6:
            out.append(line.strip())
    return out


class HideTestSources(NbGraderPreprocessor):
    """Feedback: replace a test cell's source and outputs by its failure message (if any)."""

    max_message = Integer(300, help="characters of a failure message shown").tag(config=True)

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            return cell, resources
        hidden = hidden_test_lines(cell.source)
        cell.source = f"# test cell {meta.get('grade_id', '')}: its code is not part of the feedback"
        shown = []
        for out in cell.get("outputs", []):
            if out.output_type != "error":
                continue
            message = said_to_learner(out)[: self.max_message]
            if any(h in message for h in hidden):
                message = f"{out.ename}: (message withheld: it quotes a hidden test)"
            shown.append(error_output(out.ename, out.get("evalue") or "", [message]))
        cell.outputs = shown
        return cell, resources
