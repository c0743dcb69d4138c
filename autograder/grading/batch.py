"""The instructor's batch: every submission graded in its own sandbox, grades recorded by the parent only.

One submission is one `GradingJob` (plain data: the neutralised submission, a template gradebook holding
only the assignment, the course's nbgrader config). `run_job` grades it in a scratch course folder with
`nbgrader autograde`, whose kernel runs in the bubblewrap sandbox (autograder/judging/sandbox.py), and returns
the executed notebooks. Jobs run concurrently on threads (`jobs=N`) or on Dask workers (`scheduler=`).

The parent then records each result into the instructor's gradebook, one at a time, with nbgrader's own
autograde converter with execution turned off (OverwriteCells puts the gradebook's test cells back,
SaveAutoGrades reads the scores from the executed outputs, AssignLatePenalties applies the course policy).
Around each record the `Guard` checks the gradebook (autograder/grading/gradebook_guard.py).

`grade_notebook(path)` (`make grade`) is a batch of one: a throwaway course folder and gradebook, the instructor's
files never touched. The nbgrader calls themselves live in autograder/grading/nbgrader_runs.py, below this module.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import nbformat
from tqdm import tqdm

from autograder.grading import gradebook_guard, intake, preprocessors
from autograder.judging import forked_judges, sandbox
from autograder.grading.nbgrader_runs import (CONFIG_NAME, DEFAULT_STUDENT, SUBMISSION_TIMEOUT_S, GradingError, Reading,
                                SubmissionResult, assignments, cell_times, db_url_for, find_assignment,
                                generate_assignment,
                                make_temp_course, nbgrader_env, precheck, read_executed, read_scores,
                                run_nbgrader, submissions)
from autograder.paths import REPO_ROOT

STATUSES = ("ok", "invalid-notebook", "kernel-died", "timeout", "tampered", "error")
# `nbgrader submit` writes it beside the notebook; the exchange's feedback file is named by a hash of it, so it travels
# from the submission to autograded/ (and from there to feedback/). Anything larger than this is not nbgrader's.
SUBMISSION_SECRET = "submission_secret.txt"
MAX_SECRET_BYTES = 1024


class SandboxRefused(GradingError):
    """No sandbox can start here and the instructor did not pass --unsafe."""


@dataclass
class GradingJob:
    """Everything a worker needs to grade one submission (picklable: it may travel to a Dask worker)."""

    assignment: str
    student: str
    files: dict[str, bytes]               # the neutralised submission: relative path -> content
    gradebook: bytes                      # template gradebook: the assignment, its cells, no student
    config: str                           # the course's nbgrader_config.py
    source_files: dict[str, bytes]        # non-notebook files of solutions/<assignment>/ (data the lab reads)
    timeout: float
    policy: dict                          # SandboxPolicy fields (enabled=False: --unsafe)
    env: dict[str, str] | None = None     # extra environment for nbgrader (e.g. COURSE_CELL_TIMEOUT)
    released: dict[str, bytes] = field(default_factory=dict)   # the released notebooks (which cells are the course's)


@dataclass
class JobOutcome:
    student: str
    assignment: str
    rc: int | None                        # nbgrader's exit code; None: stopped at the submission's time limit
    log_tail: str
    notebooks: dict[str, str] = field(default_factory=dict)   # executed notebooks: name -> JSON text
    seconds: float = 0.0
    cell_times: list[dict] = field(default_factory=list)      # nbgrader_runs.cell_times of its whole output


def run_job(job: GradingJob, on_progress: Callable[[str], None] | None = None) -> JobOutcome:
    """Grade one submission in a scratch course folder (on this machine or a Dask worker); on_progress gets each
    graded cell's line as it finishes (run_nbgrader)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grade-job-") as tmp:
        course = Path(tmp) / "course"
        course.mkdir()
        (course / CONFIG_NAME).write_text(job.config)
        (course / "gradebook.db").write_bytes(job.gradebook)
        for base, files in ((course / "solutions" / job.assignment, job.source_files),
                            (course / "released" / job.assignment, job.released),
                            (course / "submitted" / job.student / job.assignment, job.files)):
            base.mkdir(parents=True, exist_ok=True)
            for rel, data in files.items():
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / rel).write_bytes(data)
        env = nbgrader_env({**(job.env or {}), sandbox.ENV_VAR: sandbox.SandboxPolicy(**job.policy).to_env()})
        env = forked_judges.zygote_env(env)          # its judge forked from one that imported torch once
        rc, out = run_nbgrader(["autograde", job.assignment, f"--student={job.student}", "--force",
                                f"--db={db_url_for(course / 'gradebook.db')}",
                                f"--CourseDirectory.release_directory={course / 'released'}"],
                               course, timeout=job.timeout, env=env,
                               on_progress=on_progress)
        done = course / "autograded" / job.student / job.assignment
        notebooks = {p.name: p.read_text(encoding="utf-8") for p in sorted(done.glob("*.ipynb"))} if rc == 0 else {}
    return JobOutcome(job.student, job.assignment, rc, out[-4000:], notebooks, time.perf_counter() - start,
                      cell_times(out))


# ----------------------------------------------------------------------------- where jobs run

class _ThreadPool:
    def __init__(self, jobs: int):
        self._ex = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grade")

    def submit(self, fn, arg):
        return self._ex.submit(fn, arg)

    def as_completed(self, futures):
        return as_completed(futures)

    def close(self):
        self._ex.shutdown(wait=True, cancel_futures=True)


class _DaskPool:
    """Dask distributed: a scheduler address, or a LocalCluster of `jobs` single-threaded workers."""

    def __init__(self, jobs: int, scheduler: str):
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise GradingError("Dask is not installed: pip install '.[cluster]' (dask, distributed, "
                               "dask-jobqueue)") from exc
        self._cluster = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        if scheduler in ("local", "local-threads"):
            import dask

            self._scratch = tempfile.TemporaryDirectory(prefix="dask-")     # its work folders, removed at close
            self._config = dask.config.set({"temporary-directory": self._scratch.name})   # the scheduler's locks too
            self._cluster = LocalCluster(n_workers=1 if scheduler == "local-threads" else jobs,
                                         threads_per_worker=jobs if scheduler == "local-threads" else 1,
                                         processes=scheduler == "local", dashboard_address=None,
                                         local_directory=self._scratch.name)
            self._client = Client(self._cluster)
        else:
            self._client = Client(scheduler)

    def submit(self, fn, arg):
        return self._client.submit(fn, arg, pure=False)

    def as_completed(self, futures):
        from distributed import as_completed as dask_completed
        return dask_completed(futures)

    def close(self):
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        if self._scratch is not None:
            self._config.__exit__(None, None, None)
            self._scratch.cleanup()


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- recording in the parent

def _record_api(course_root: Path, db_url: str, staging: Path):
    """nbgrader's API on the course, configured to record executed notebooks (no execution)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, DeduplicateIds, OverwriteCells,
                                        OverwriteKernelspec, SaveAutoGrades)
    from traitlets.config.loader import PyFileConfigLoader

    config_dir = course_root if (course_root / CONFIG_NAME).exists() else REPO_ROOT
    cfg = PyFileConfigLoader(CONFIG_NAME, path=str(config_dir)).load_config()
    cfg.CourseDirectory.root = str(course_root)
    cfg.CourseDirectory.db_url = db_url
    cfg.CourseDirectory.submitted_directory = str(staging)
    cfg.Autograde.sanitize_preprocessors = [DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata]
    # the worker bounded the outputs already (LimitOutputSize); bounded here too, whatever its config said
    cfg.Autograde.autograde_preprocessors = [preprocessors.LimitOutputSize, SaveAutoGrades, AssignLatePenalties,
                                             CheckCellMetadata]
    return NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)


def _record_zero(db_url: str, assignment: str, student: str) -> None:
    """No notebook could be graded: the submission exists in the gradebook with zero auto scores."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        gb.update_or_create_student(student)
        sub = gb.update_or_create_submission(assignment, student)
        for nb in sub.notebooks:
            for grade in nb.grades:
                grade.auto_score = 0
                grade.needs_manual_grade = grade.manual_score is not None
        gb.db.commit()


# ----------------------------------------------------------------------------- the batch

def _source_files(course_root: Path, assignment: str) -> dict[str, bytes]:
    src = course_root / "solutions" / assignment
    skip = {".ipynb_checkpoints", "__pycache__"}
    return {str(p.relative_to(src)): p.read_bytes() for p in sorted(src.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.suffix != ".ipynb" and p.suffix != ".pyc"
            and not skip & set(p.relative_to(src).parts)}


def _template_gradebook(db: Path, dest: Path) -> Path:
    """A copy of the gradebook with no students (assignments and their cells only) for the workers."""
    import sqlite3

    from nbgrader.api import Gradebook

    gradebook_guard.backup(db, dest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(db_url_for(dest)) as gb:
            for student in list(gb.students):
                gb.remove_student(student.id)
    con = sqlite3.connect(dest)
    con.execute("VACUUM")                 # no deleted pages with other students' rows travel either
    con.close()
    return dest


def _files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def check_sandbox(policy: sandbox.SandboxPolicy, unsafe: bool, log: Callable[[str], None]) -> sandbox.SandboxPolicy:
    """The policy the batch runs with; refuses (SandboxRefused) when no sandbox starts and not unsafe."""
    if unsafe:
        log("WARNING: --unsafe: submissions run WITHOUT a sandbox, with your rights (files, network, "
            "gradebook), one at a time; the gradebook is still checked and restored after each.")
        return sandbox.SandboxPolicy(**{**asdict(policy), "enabled": False})
    why = sandbox.probe(policy)
    if why:
        fix = "pass --unsafe to grade anyway (only code you trust)"
        if not sandbox.limits_shortfall(policy):
            fix = "install bubblewrap (`make sandbox-deps`) or enable user namespaces; or " + fix
        raise SandboxRefused(f"no sandbox can start here: {why}. Grading refused: learners' code would run with "
                             f"your rights. To go on: {fix}.")
    log(f"sandbox: bubblewrap, per submission: memory {policy.memory_bytes >> 20} MiB, disk "
        f"{policy.tmp_bytes >> 20} MiB, {policy.nproc} processes, {policy.cpu_seconds} CPU s, no network")
    return policy


def autograde(course_root: Path = REPO_ROOT, assignment_ids: list[str] | None = None,
              students: list[str] | None = None, *, db: Path | str | None = None,
              timeout: float = SUBMISSION_TIMEOUT_S, env: dict[str, str] | None = None,
              log: Callable[[str], None] = tqdm.write, progress: bool = True, jobs: int | None = None,
              unsafe: bool = False, scheduler: str | None = None, policy: sandbox.SandboxPolicy | None = None,
              backup: bool = True, cell_log: Callable[[str, str], None] | None = None) -> list[SubmissionResult]:
    """Grade every submission under submitted/ (or the chosen ones); one status line each, in the order
    they finish; returns the results sorted by assignment and student. cell_log, where the jobs run on this
    machine (not on Dask), gets (student, line) per graded cell as it finishes (line: "ex1_check: passed (3.2 s)")."""
    course_root = Path(course_root).resolve()
    bindir = str(Path(sys.executable).parent)        # nbgrader's Gradebook, used here too, runs `alembic`
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    db_path = _sqlite_path(db, course_root)
    db_url = db_url_for(db_path)
    policy = policy or sandbox.SandboxPolicy(cpu_seconds=int(timeout) + 5)
    policy = check_sandbox(policy, unsafe, log)
    jobs = 1 if unsafe else max(1, jobs or default_jobs())
    plan = [(a, students or submissions(course_root, a)) for a in assignment_ids or assignments(course_root)]
    plan = [(a, who) for a, who in plan if who]
    if not plan:
        return []
    if backup:
        saved = gradebook_guard.backup(db_path)
        if saved:
            log(f"gradebook backed up to {saved}")
    config_dir = course_root if (course_root / CONFIG_NAME).exists() else REPO_ROOT
    config = (config_dir / CONFIG_NAME).read_text()
    pool = _DaskPool(jobs, scheduler) if scheduler else _ThreadPool(jobs)
    results: list[SubmissionResult] = []
    try:
        with tqdm(total=sum(len(w) for _, w in plan), desc="autograde", unit="submission",
                  disable=not progress) as bar, tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
            for a, who in plan:
                work = Path(tmp) / a
                released = generate_assignment(course_root, a, db=db_path, release_dir=work / "release", env=env)
                template = _template_gradebook(db_path, work / "template.db")
                released_nbs = {p.name: nbformat.read(str(p), as_version=4) for p in released.glob("*.ipynb")}
                base = dict(assignment=a, gradebook=template.read_bytes(), config=config,
                            source_files=_source_files(course_root, a), timeout=timeout,
                            policy=asdict(policy), env=_job_env(env),
                            released={p.name: p.read_bytes() for p in sorted(released.glob("*.ipynb"))})
                guard = gradebook_guard.Guard(db_path)
                api = _record_api(course_root, db_url, work / "record")
                pending, early, meta = [], [], {}   # pending: (job, student)
                for s in who:
                    status, notes, staged = _prepare(course_root, a, s, released, work / "staged" / s, released_nbs)
                    meta[s] = (status, notes)
                    if staged is None:
                        early.append(JobOutcome(s, a, 0, "", {}))
                    else:
                        pending.append((GradingJob(student=s, files=_files_of(staged), **base), s))
                def grade(job: GradingJob) -> JobOutcome:
                    said = None if cell_log is None else functools.partial(cell_log, job.student)
                    return run_job(job, said)

                task = run_job if scheduler or cell_log is None else grade
                if unsafe:      # strictly one after the other: a change to the gradebook names its submission
                    finished = (_safe_result(pool.submit(task, job), a, s) for job, s in pending)
                else:
                    futures = {pool.submit(task, job): s for job, s in pending}
                    finished = (_safe_result(f, a, futures[f]) for f in pool.as_completed(list(futures)))
                for outcome in itertools.chain(early, finished):     # recorded as each one finishes
                    results.append(_finish_or_error(outcome, api, guard, db_url, work, meta, log, bar))
                guard.close()
    finally:
        pool.close()
    return sorted(results, key=lambda r: (r.assignment, r.student))


def _sqlite_path(db: Path | str | None, course_root: Path) -> Path:
    """The gradebook file: a path, a sqlite:/// URL, or course_root/gradebook.db. Other databases: refused
    (the guard compares sqlite files)."""
    if db is None:
        return (course_root / "gradebook.db").resolve()
    if isinstance(db, str) and "://" in db:
        if not db.startswith("sqlite:///"):
            raise GradingError(f"autograde guards a sqlite gradebook; {db.split('://')[0]} is not supported")
        return Path(db[len("sqlite:///"):]).resolve()
    return Path(db).resolve()


def _job_env(env: dict[str, str] | None) -> dict[str, str] | None:
    """The variables of `env` that grading reads (the rest of the parent's environment stays here)."""
    if env is None:
        return None
    keep = ("COURSE_CELL_TIMEOUT", "COURSE_NBGRADER_DB", "COURSE_JUDGE", "COURSE_WITNESS", "MINIGPT_DATA_DIR",
            "OMP_NUM_THREADS", "PYTHONPATH")
    return {k: v for k, v in env.items() if k in keep}


def _safe_result(fut, assignment: str, student: str) -> JobOutcome:
    try:
        return fut.result()
    except Exception as exc:          # the worker itself failed: a status line, not a stopped batch
        return JobOutcome(student, assignment, -1, f"grading job failed: {type(exc).__name__}: {exc}")


def _prepare(course_root: Path, a: str, s: str, released: Path, staged: Path,
             released_nbs: dict) -> tuple[str, list[str], Path | None]:
    """Precheck and neutralise one submission. staged is None when nothing in it can be graded."""
    sub_dir = course_root / "submitted" / s / a
    status, notes, gradable = "ok", [], 0
    for nb_path in sorted(released.glob("*.ipynb")):
        sub_nb = sub_dir / nb_path.name
        if sub_nb.is_symlink() or not sub_nb.is_file():
            notes.append(f"{nb_path.name} not submitted" + (" (a link, not a file)" if sub_nb.is_symlink() else ""))
            continue
        st, n = precheck(sub_nb, nb_path, course_root / "solutions" / a / nb_path.name)
        notes += n
        if st != "ok":
            status = st
        else:
            gradable += 1
    notes += intake.stage_submission(sub_dir, staged, released_nbs)
    for name in released_nbs:          # an invalid notebook is not handed to nbgrader at all
        if status != "ok" and (staged / name).exists():
            (staged / name).unlink()
    return status, notes, staged if gradable else None


def _finish_or_error(outcome: JobOutcome, api, guard: gradebook_guard.Guard, db_url: str, work: Path,
                     meta: dict, log: Callable[[str], None], bar) -> SubmissionResult:
    """_finish, and if recording itself fails, an `error` line: the batch goes on."""
    try:
        return _finish(outcome, api, guard, db_url, work, meta, log, bar)
    except Exception as exc:
        if not guard.intact():
            guard.restore()
        result = SubmissionResult(outcome.student, outcome.assignment, 0.0, 0.0, "error",
                                  [f"recording failed: {type(exc).__name__}: {str(exc)[:200]}"])
        log(result.line())
        bar.update()
        return result


def _finish(outcome: JobOutcome, api, guard: gradebook_guard.Guard, db_url: str, work: Path,
            meta: dict, log: Callable[[str], None], bar) -> SubmissionResult:
    """Record one finished job in the instructor's gradebook (guarded) and report its status line."""
    a, s = outcome.assignment, outcome.student
    started = time.perf_counter()
    status, notes = meta.get(s, ("ok", []))
    notes = list(notes)
    tampered = False
    if not guard.intact():
        guard.restore()
        tampered = True
        notes.append("the gradebook was changed from outside the grader while this submission ran; "
                     "restored to the copy taken before")
    before_manual = gradebook_guard.manual_scores(guard.db, s)
    reading = Reading()
    if outcome.notebooks:
        staging = work / "record" / s / a
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        stamp = work / "staged" / s / "timestamp.txt"
        if stamp.exists():
            shutil.copy(stamp, staging / "timestamp.txt")
        secret = work / "staged" / s / SUBMISSION_SECRET          # `nbgrader release_feedback` names the feedback by it
        if secret.is_file() and secret.stat().st_size <= MAX_SECRET_BYTES:
            shutil.copy(secret, staging / SUBMISSION_SECRET)
        for name, text in outcome.notebooks.items():
            (staging / name).write_text(text, encoding="utf-8")
            r = read_executed(text)
            reading.notes += r.notes
            reading.errors.update(r.errors)
            if reading.status == "ok":
                reading.status = r.status
        left = re.search(re.escape(sandbox.LEFTOVER_MARK) + r" (\d+)", outcome.log_tail)
        if left:
            reading.notes.append(f"{left.group(1)} process(es) it started were still running when grading "
                                 "ended; killed with the sandbox")
        with warnings.catch_warnings():     # nbgrader's SQLAlchemy session warnings, harmless here
            warnings.simplefilter("ignore")
            res = api.autograde(a, s, force=True, create=True)
        if not res.get("success"):
            reading.status = "error"
            reading.notes.append("recording failed: " + (res.get("error") or "").strip().splitlines()[-1:][0]
                                 if res.get("error") else "recording failed")
    else:
        _record_zero(db_url, a, s)
        if outcome.rc is None:
            reading.status = "timeout"
            reading.notes.append("grading stopped at the submission's time limit")
        elif outcome.rc != 0:
            died = "DeadKernelError" in outcome.log_tail or "Kernel died" in outcome.log_tail
            reading.status = "kernel-died" if died else "error"
            last = [l for l in outcome.log_tail.splitlines() if l.strip() and "Warning" not in l]
            reading.notes.append("nbgrader failed: " + (last[-1].strip()[:200] if last else f"exit {outcome.rc}"))
    problems = guard.check_record(s, before_manual)
    if problems:
        guard.restore()
        tampered = True
        notes += problems + ["gradebook restored"]
    if tampered:               # no points until the instructor has looked at it
        _record_zero(db_url, a, s)
        notes.append("recorded with zero points: review this submission")
    guard.accept()
    total, max_total, cells = read_scores(db_url, a, s)
    for c in cells:
        if c.grade_id in reading.errors and not c.note:
            c.note = reading.errors[c.grade_id]
        if c.score < c.max_score and not c.note:
            c.note = "failed" if outcome.notebooks else "not graded"
    final = "tampered" if tampered else (status if status != "ok" else reading.status)
    result = SubmissionResult(s, a, total, max_total, final, notes + reading.notes, cells, outcome.seconds,
                              time.perf_counter() - started, cell_times=outcome.cell_times)
    log(result.line())
    bar.update()
    return result


# ----------------------------------------------------------------------------- one notebook

def grade_notebook(path: Path, *, assignment: str | None = None, course_root: Path = REPO_ROOT,
                   student: str = DEFAULT_STUDENT, timeout: float = SUBMISSION_TIMEOUT_S,
                   env: dict[str, str] | None = None, keep: Path | None = None, sandboxed: bool | None = None,
                   log=None, cell_log: Callable[[str], None] | None = None) -> SubmissionResult:
    """Grade one notebook as `nbgrader autograde` would, in a temporary course folder (its own gradebook).

    sandboxed: True requires the bubblewrap sandbox, False runs the kernel without it, None (default) uses it
    where it can start (a learner grading their own notebook on a laptop without one still gets a grade).
    keep: if given, the temporary course folder is copied there (autograded notebook, gradebook).
    cell_log: gets a line per graded cell as it finishes ("ex1_check: passed (3.2 s)").
    """
    path = Path(path).resolve()
    if not path.exists():
        raise GradingError(f"no such notebook: {path}")
    course_root = Path(course_root).resolve()
    assignment = assignment or find_assignment(path, course_root)
    policy = sandbox.SandboxPolicy(cpu_seconds=int(timeout) + 5)     # autograde's: probed once, here
    if sandboxed is None:
        sandboxed = sandbox.probe(policy) is None
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        course = make_temp_course(course_root, assignment, Path(tmp) / "course")
        sub_dir = course / "submitted" / student / assignment
        sub_dir.mkdir(parents=True)
        names = sorted(p.name for p in (course / "solutions" / assignment).glob("*.ipynb"))
        name = path.name if path.name in names or len(names) != 1 else names[0]
        shutil.copy(path, sub_dir / name)
        results = autograde(course, [assignment], [student], db=Path(tmp) / "gradebook.db", timeout=timeout,
                            env=env, log=log or (lambda line: None), progress=False, jobs=1,
                            unsafe=not sandboxed, backup=False, policy=policy,
                            cell_log=None if cell_log is None else (lambda _student, line: cell_log(line)))
        if keep is not None:
            shutil.copytree(tmp, keep, dirs_exist_ok=True)
    return results[0]
