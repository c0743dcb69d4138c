"""A class on JupyterHub with real system users: an instructor and five students, the hub on loopback, nbgrader's
exchange. The whole cycle (release, fetch, edit, submit, resubmit after the due date, collect, sandboxed autograde,
a score changed by hand, feedback generated, released and fetched, export) driven in headless Chromium through the
Assignments tab and the formgrader, with two students through the tab's server handlers; isolation between people;
a hostile student in the exchange; the spawner's limits. Needs root (it creates users), the hub's proxy
(`make hub-deps`) and Chromium; removes every user, process and file it made.
"""

from __future__ import annotations

import csv
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from autograder.paths import REPO_ROOT

PROXY = REPO_ROOT / ".venv" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
LAB = "00_token_factory"
STARTED = ".class-started"          # made first in the class's folder
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the class's users are system users: only root can create them"),
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is not installed (`make hub-deps`)"),
    pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="autograding needs bubblewrap (`make sandbox-deps`)"),
]

requests = pytest.importorskip("requests")
classroom = pytest.importorskip("autograder.hub.classroom")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user: str, command: str, roster, *, check: bool = True,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """classroom.run_as, failing the test with the command's output unless `check` is off."""
    done = classroom.run_as(roster, user, command, timeout=timeout)
    if check and done.returncode:
        raise AssertionError(f"{user}: {command} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def release(roster) -> None:
    """The instructor releases the lab (once: the tests share the class, in any order)."""
    if not (Path(roster.exchange) / classroom.COURSE_ID / "outbound" / LAB).exists():
        as_user(roster.instructor, f"cd ~/course && nbgrader release_assignment {LAB}", roster)


class Hub:
    """JupyterHub on a free loopback port, as `make hub` starts it; a logged-in session per user."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proxy_api_port = _free_port()
        env = dict(os.environ, LLM_COURSE_HUB_ROOT=str(root), LLM_COURSE_HUB_PORT=str(self.port),
                   LLM_COURSE_HUB_INTERNAL_PORT=str(_free_port()), LLM_COURSE_HUB_PROXY_API_PORT=str(self.proxy_api_port))
        self.log_path = root / "hub.log"                 # every port its own: another hub may run beside this one
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(REPO_ROOT / ".venv" / "bin" / "jupyterhub"), "-f",
                                      str(REPO_ROOT / "config" / "hub" / "jupyterhub_config.py")],
                                     cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait(lambda: requests.get(self.base + "/hub/api", timeout=5).status_code == 200, 60, "the hub")

    def _wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                tail = "\n".join(self.log_path.read_text().splitlines()[-30:])
                raise AssertionError(f"the hub exited ({self.proc.returncode}); the end of its log:\n{tail}")
            try:
                if ready():
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{what} did not come up in {seconds:g} s")

    def login(self, user: str, password: str) -> requests.Session:
        """Log in through the hub's PAM login page, wait for the user's JupyterLab (spawned by the hub)."""
        s = requests.Session()
        s.get(self.base + "/hub/login", timeout=30)
        r = s.post(self.base + "/hub/login", data={"username": user, "password": password,
                                                   "_xsrf": s.cookies.get("_xsrf")}, timeout=120)
        assert r.status_code == 200, f"login of {user}: {r.status_code}"
        lab = f"{self.base}/user/{user}/lab"

        def lab_served() -> bool:                # not the hub's "your server is starting" page: JupyterLab itself
            r = s.get(lab, timeout=30)
            return r.status_code == 200 and r.url.startswith(lab) and "jupyter-config-data" in r.text
        self._wait(lab_served, 180, f"{user}'s JupyterLab")
        return s

    def api(self, s: requests.Session, user: str, method: str, path: str, **kw) -> requests.Response:
        xsrf = next((c.value for c in s.cookies if c.name == "_xsrf" and c.path.startswith(f"/user/{user}")), "")
        return s.request(method, f"{self.base}/user/{user}/{path}", headers={"X-XSRFToken": xsrf}, timeout=300, **kw)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def klass():
    root = Path(tempfile.mkdtemp(prefix="llm-course-hub-"))
    root.chmod(0o755)
    (root / STARTED).touch()          # the shared folders are searched for what changed after it
    prefix = "lt" + secrets.token_hex(2)
    try:
        roster = classroom.create_class(root, 5, prefix=prefix, repo=REPO_ROOT)    # 3 in the cycle, 2 hostile
        hub = Hub(root)
        try:
            yield roster, hub, root
        finally:
            hub.stop()
            proxies = subprocess.run(["pgrep", "-f", f"configurable-http-proxy.*--api-port {hub.proxy_api_port}"],
                                     capture_output=True, text=True).stdout.split()
            assert not proxies, f"the hub left its proxy running: {proxies}"
    finally:
        made = (root / classroom.STATE).exists()                  # saved before the first user is made
        users = classroom.load_roster(root).users if made else []
        uids = [pwd.getpwnam(u).pw_uid for u in users if classroom._user_exists(u)]
        if made:
            classroom.remove_class(root)
        shutil.rmtree(root, ignore_errors=True)
        left = [f"user {u}" for u in users if classroom._user_exists(u)]
        left += [f"process {pid}" for uid in uids
                 for pid in subprocess.run(["pgrep", "-U", str(uid)], capture_output=True, text=True).stdout.split()]
        left += [str(p) for p in (root, Path("/tmp/llm-course-hub-limit-test")) if p.exists()]
        left += [str(p) for folder in classroom.TEMPORARY for p in folder.iterdir() if _owner(p) in uids]
        assert not left, f"the class left behind: {left}"


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def _wait_for(ready, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        time.sleep(0.5)


def _browser_login(browser, hub: Hub, user: str, password: str):
    """The hub's login page, then the user's JupyterLab (spawned by the hub); the page."""
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.goto(hub.base + "/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_selector(".jp-LabShell", timeout=180_000)
    return page


def _open_nbgrader(page, item: str) -> None:
    """JupyterLab's Nbgrader menu, then `item` (Assignment List, Formgrader)."""
    page.locator("#jp-MainMenu").get_by_text("Nbgrader", exact=True).click()
    page.locator("#jp-mainmenu-nbgrader").get_by_text(item, exact=True).click()


def _press_in_assignment_list(page, section: str, button: str) -> None:
    """Press `button` on the lab's row in one section of the Assignments tab (released, fetched, submitted)."""
    row = page.locator(f"#{section}_assignments_list .list_item", has_text=LAB).first
    row.get_by_role("button", name=button, exact=True).click()


def test_the_whole_cycle_on_the_hub(klass, tmp_path):
    """Every command README and docs/hub.md give the instructor, typed into the instructor's own terminal on the hub
    (their server's shell, their account and limits: no root, no `su`): release, collect, a due date, `make
    autograde`, `make feedback`, release of the feedback, `make export`; a score changed by hand in the formgrader
    in a browser. One student fetches, edits, submits and fetches feedback in the Assignments tab of a browser, two
    through the same tab's server handlers (one submits twice, across the due date). Screenshots go to
    $HUB_SCREENSHOTS; the terminal's transcript, with each step's time, to the test's report."""
    from tests.browser.browser_support import CHROMIUM, CHROMIUM_ARGS, require_chromium
    from tests.hub.hub_terminal import Terminal
    require_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    roster, hub, root = klass
    instructor, (s1, s2, s3) = roster.instructor, roster.students[:3]
    shots = Path(os.environ.get("HUB_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    course = {"course_id": classroom.COURSE_ID, "assignment_id": LAB}
    solved = REPO_ROOT / "solutions" / LAB / f"{LAB}.ipynb"
    marker = f"# edited in the browser by {s1}"
    timings: dict[str, float] = {}

    def hand_in(s: str) -> None:                   # the student's answers, as if written in their notebook
        target = Path(f"/home/{s}/{LAB}/{LAB}.ipynb")
        shutil.copy(solved, target)
        shutil.chown(target, s, s)

    def typed(step: str, command: str, timeout: float = 300) -> str:
        started = time.monotonic()
        output = term.must(command, timeout)
        timings[step] = time.monotonic() - started
        return output

    term = Terminal(hub, hub.login(instructor, roster.passwords[instructor]), instructor)
    try:
        where = typed("which", "cd ~/course && command -v nbgrader python make")
        assert where.count(roster.venv) >= 2, f"the class's environment is not on the terminal's PATH:\n{where}"
        typed("release", f"nbgrader release_assignment {LAB}")
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                student = _browser_login(browser, hub, s1, roster.passwords[s1])
                _open_nbgrader(student, "Assignment List")
                _press_in_assignment_list(student, "released", "Fetch")
                student.locator("#fetched_assignments_list .list_item", has_text=LAB).first.wait_for(timeout=60_000)
                hand_in(s1)
                student.goto(f"{hub.base}/user/{s1}/lab/tree/{LAB}/{LAB}.ipynb")
                student.locator(".jp-Notebook .jp-Cell").first.click()
                student.keyboard.press("Escape")
                student.keyboard.press("b")                       # a new cell below the first, then the edit
                student.keyboard.press("Enter")
                student.keyboard.type(marker)
                student.keyboard.press("Escape")
                student.keyboard.press("Control+s")
                _wait_for(lambda: marker in Path(f"/home/{s1}/{LAB}/{LAB}.ipynb").read_text(), 60, "the edit saved")
                _open_nbgrader(student, "Assignment List")
                _press_in_assignment_list(student, "fetched", "Submit")
                student.locator("#submitted_assignments_list .list_item", has_text=LAB).first.wait_for(timeout=60_000)

                sessions = {s: hub.login(s, roster.passwords[s]) for s in (s2, s3)}
                for s, session in sessions.items():
                    assert hub.api(session, s, "POST", "assignments/fetch", data=course).status_code == 200
                assert hub.api(sessions[s3], s3, "POST", "assignments/submit", data=course).status_code == 200
                time.sleep(1.1)                          # s3 submits the stub, then the answers: nbgrader's timestamps
                hand_in(s3)
                for s in (s2, s3):
                    r = hub.api(sessions[s], s, "POST", "assignments/submit", data=course)
                    assert r.status_code == 200 and '"success": false' not in r.text, r.text[:300]

                typed("collect", f"nbgrader collect {LAB}")
                stamps = {s: datetime.fromisoformat((Path(roster.course_dir) / "submitted" / s / LAB / "timestamp.txt")
                                                    .read_text().strip().replace(" UTC", "+00:00")) for s in (s1, s2, s3)}
                due = stamps[s2] + (stamps[s3] - stamps[s2]) / 2          # s3's resubmission comes after the due date
                typed("due date", f"nbgrader db assignment add {LAB} --duedate='{due.isoformat()}'")
                graded = typed("make autograde", "make autograde JOBS=2", timeout=900)
                assert "pip" not in graded and all(s in graded for s in (s1, s2, s3)), graded[-3000:]

                from nbgrader.api import Gradebook
                gradebook = f"sqlite:///{Path(roster.course_dir) / 'gradebook.db'}"
                with Gradebook(gradebook) as gb:
                    notebook_id = gb.find_submission_notebook(LAB, LAB, s2).id
                teacher = _browser_login(browser, hub, instructor, roster.passwords[instructor])
                review = teacher.context.new_page()                        # the formgrader's page for s2's notebook
                review.goto(f"{hub.base}/user/{instructor}/formgrader/submissions/{notebook_id}")
                score = review.locator("input.score#ex1_check")
                _wait_for(lambda: score.get_attribute("placeholder") not in (None, ""), 60,
                          "the formgrader's grades loaded (the autograder's score as the field's placeholder)")
                score.fill("1")
                review.keyboard.press("Tab")

                def reviewed() -> bool:
                    with Gradebook(gradebook) as gb:
                        return gb.find_grade("ex1_check", LAB, LAB, s2).manual_score == 1
                _wait_for(reviewed, 60, "the formgrader's manual score in the gradebook")
                review.screenshot(path=str(shots / "instructor-manual-grade.png"))
                review.close()

                typed("make feedback", "make feedback")
                typed("release feedback", f"nbgrader release_feedback {LAB}")
                _open_nbgrader(teacher, "Formgrader")
                teacher.frame_locator("#formgrader-iframe iframe").locator("tr", has_text=LAB).wait_for()
                teacher.screenshot(path=str(shots / "instructor-formgrader.png"))

                _open_nbgrader(student, "Assignment List")
                _press_in_assignment_list(student, "submitted", "Fetch Feedback")
                _wait_for(lambda: any(Path(f"/home/{s1}/{LAB}/feedback").rglob(f"{LAB}.html")), 60,
                          f"{s1}'s feedback")
                student.screenshot(path=str(shots / "student-assignments.png"))
            finally:
                browser.close()
        for s in (s2, s3):
            assert hub.api(sessions[s], s, "POST", "assignments/fetch_feedback", data=course).status_code == 200
            assert list(Path(f"/home/{s}/{LAB}/feedback").rglob(f"{LAB}.html")), f"{s} has no feedback"
        assert marker in (Path(roster.course_dir) / "submitted" / s1 / LAB / f"{LAB}.ipynb").read_text()

        typed("make export", "make export")
    finally:
        print("the instructor's steps, in their terminal (s): "
              + ", ".join(f"{step} {seconds:.1f}" for step, seconds in timings.items()))
        print("the instructor's terminal:\n" + term.transcript[-6000:])
        term.close()
    grades = {row["student_id"]: row for row in csv.DictReader(open(Path(roster.course_dir) / "grades.csv"))}
    full = float(grades[s1]["max_score"])
    assert full > 0 and float(grades[s1]["score"]) == full
    assert float(grades[s2]["score"]) == 1, "the score given by hand in the formgrader"
    assert float(grades[s3]["score"]) == full, "the resubmission is the one graded"
    with Gradebook(gradebook) as gb:
        late = {s: gb.find_submission(LAB, s).total_seconds_late for s in (s1, s2, s3)}
    assert late[s1] == late[s2] == 0 < late[s3], f"nbgrader's lateness, from the submissions' timestamps: {late}"
    owners = {p.lstat().st_uid for p in Path(roster.course_dir).rglob("*")}
    assert owners == {pwd.getpwnam(instructor).pw_uid}, "every file of the course is the instructor's (nothing ran as root)"


def test_a_student_cannot_reach_another_or_the_instructor(klass):
    roster, _, _ = klass
    s1, s2 = roster.students[:2]
    exchange = Path(roster.exchange) / classroom.COURSE_ID
    course = Path(roster.course_dir)
    tries = {"list the exchange's inbound": f"ls {exchange / 'inbound'}",
             "list the released feedback": f"ls {exchange / 'feedback'}",
             "read a classmate's home": f"ls /home/{s1}",
             "read the instructor's solutions": f"cat {course / 'solutions' / LAB / (LAB + '.ipynb')}",
             "read the gradebook": f"cat {course / 'gradebook.db'}",
             "read the installation's hidden tests": f"ls {REPO_ROOT / 'solutions'}",
             "write into the released assignment": f"touch {exchange / 'outbound' / LAB / 'x.ipynb'}"}
    tries["read the installation's git history"] = f"cat {REPO_ROOT / '.git' / 'HEAD'}"
    for what, command in tries.items():
        done = as_user(s2, command, roster, check=False)
        assert done.returncode != 0 and "ermission denied" in done.stderr, f"a student could {what}: {done.stdout}"


def _answer_lines(repo: Path) -> list[str]:
    """Lines of the model answers (between BEGIN and END SOLUTION in solutions/) that no other file of the
    installation a student is meant to read holds: what a leak of the solutions would show."""
    import json as json_

    lines = set()
    for nb in sorted((repo / "solutions").glob("*/*.ipynb")):
        for cell in json_.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            inside = source.split("### BEGIN SOLUTION")[1:]
            for part in inside:
                lines |= {line.strip() for line in part.split("### END SOLUTION")[0].splitlines()
                          if len(line.strip()) >= 40}
    elsewhere = subprocess.run(["grep", "-rhoF", "--exclude-dir=.git", "--exclude-dir=solutions", "--exclude-dir=.venv",
                                "-f", "-", str(repo)], input="\n".join(sorted(lines)), capture_output=True,
                               text=True).stdout
    return sorted(lines - set(elsewhere.splitlines()))


def test_closed_means_closed_no_file_a_student_can_read_holds_a_model_answer(klass):
    """A student looks for the model answers everywhere they can read: the installation (its git history, a
    workspace, gradebook backups, caches, build folders) and the class's folder in full; in the folders every user
    shares (the temporary folders, the homes), each file the class could have written (changed since it started:
    another checkout the machine's owner left in /tmp is not the class's doing); and asks git for a solution by
    name. Nothing yields one."""
    import base64

    roster, _, root = klass
    student = roster.students[1]
    answers = _answer_lines(REPO_ROOT)
    assert len(answers) > 20, "too few distinctive answer lines to look for"
    patterns = base64.b64encode("\n".join(answers).encode()).decode()
    shared = " ".join(("/tmp", "/var/tmp", "/dev/shm", "/home", "/srv"))
    search = (f"echo {patterns} | base64 -d > ~/.answers; "
              f"{{ grep -rlF --exclude-dir=lib -f ~/.answers {REPO_ROOT} {root}; "
              f"find {shared} -path '*/lib' -prune -o -type f -readable -cnewer {root / STARTED} ! -path ~/.answers -print0 "
              f"| xargs -0 -r grep -lF -f ~/.answers; }}; rm -f ~/.answers")
    done = as_user(student, search, roster, check=False, timeout=600)
    assert done.stdout.strip() == "", f"a student can read model answers in:\n{done.stdout}"
    asked = as_user(student, f"git -c safe.directory='*' -C {REPO_ROOT} show HEAD:solutions/{LAB}/{LAB}.ipynb",
                    roster, check=False)
    assert asked.returncode != 0 and not any(a in asked.stdout for a in answers), asked.stdout[:500]


def test_a_hostile_student_in_the_exchange(klass):
    """A student who knows a classmate's submission's name (leaked, since inbound cannot be listed) tries to read,
    change, remove or rename it, makes a submission in the classmate's name, and submits claiming to be them; the
    instructor's collect takes the classmate's own work (autograder/hub/exchange.py closes what nbgrader leaves open)."""
    roster, _, _ = klass
    instructor, victim, attacker = roster.instructor, roster.students[3], roster.students[4]
    exchange = Path(roster.exchange) / classroom.COURSE_ID
    inbound = exchange / "inbound"
    release(roster)
    for s in (victim, attacker):
        as_user(s, f"cd ~ && nbgrader fetch_assignment {LAB}", roster)
    solved = REPO_ROOT / "solutions" / LAB / f"{LAB}.ipynb"
    target = Path(f"/home/{victim}/{LAB}/{LAB}.ipynb")
    shutil.copy(solved, target)
    shutil.chown(target, victim, victim)
    as_user(victim, f"cd ~ && nbgrader submit {LAB}", roster)
    as_user(attacker, f"cd ~ && nbgrader submit {LAB}", roster)
    [leaked] = [p.name for p in inbound.glob(f"{victim}+{LAB}+*")]

    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    forged = f"{victim}+{LAB}+{later}+forged"
    attacks = {"list inbound": (f"ls {inbound}", False),
               "read the leaked submission": (f"cat '{inbound / leaked / LAB}.ipynb'", False),
               "remove its notebook": (f"rm -f '{inbound / leaked / LAB}.ipynb'", False),
               "put a notebook into it": (f"cp ~/{LAB}/{LAB}.ipynb '{inbound / leaked}/'", False),
               "rename it to the attacker's name": (f"mv '{inbound / leaked}' '{inbound / leaked.replace(victim, attacker)}'",
                                                    False),
               "list the released feedback": (f"ls {exchange / 'feedback'}", False),
               "make a submission in the victim's name": (f"mkdir '{inbound / forged}' && cp ~/{LAB}/{LAB}.ipynb "
                                                          f"'{inbound / forged}/' && echo '{later}' > "
                                                          f"'{inbound / forged}/timestamp.txt'", True),
               "submit claiming to be the victim": (f"cd ~ && JUPYTERHUB_USER={victim} USER={victim} "
                                                    f"nbgrader submit {LAB}", True)}
    wrong = []
    for what, (command, allowed) in attacks.items():
        done = as_user(attacker, command, roster, check=False)
        if (done.returncode == 0) != allowed:
            wrong.append(f"{what}: {'done' if allowed is False else 'refused'} ({done.stderr.strip()[-200:]})")
    victims = sorted(p.name for p in inbound.glob(f"{victim}+{LAB}+*") if p.stat().st_uid == pwd.getpwnam(victim).pw_uid)
    if victims != [leaked]:
        wrong.append(f"the victim's submissions in inbound are now {victims}")

    collected = as_user(instructor, f"cd ~/course && nbgrader collect {LAB}", roster)
    if f"Not collected: {forged} claims to be {victim}'s submission but belongs to {attacker}" not in collected.stderr:
        wrong.append("the forged submission was not refused by name")
    got = Path(roster.course_dir) / "submitted" / victim / LAB / f"{LAB}.ipynb"
    if got.read_bytes() != solved.read_bytes():
        wrong.append("the notebook collected as the victim's is not the victim's")
    assert not wrong, "a hostile student got through:\n" + "\n".join(wrong)


def test_the_spawner_limits_hold_for_the_server_and_its_children(klass):
    roster, hub, _ = klass
    for user in (roster.students[0], roster.instructor):           # their servers run (started here if need be)
        hub.login(user, roster.passwords[user])
    from jupyterhub.spawner import set_user_setuid

    from autograder.hub.spawner import limits_preexec
    s = roster.students[1]
    python = str(Path(roster.venv) / "bin" / "python")
    preexec = limits_preexec(1 * 2**30, 40, 2**20, then=set_user_setuid(s))
    runs = {"memory": "bytearray(2 * 2**30)",
            "processes": "import subprocess\nfor _ in range(80): subprocess.Popen(['sleep', '5'])",
            "file size": "open('/tmp/llm-course-hub-limit-test', 'wb').write(bytes(2 * 2**20))"}
    outcomes = {}
    for what, code in runs.items():
        done = subprocess.run([python, "-c", code], preexec_fn=preexec, capture_output=True, text=True, timeout=60)
        outcomes[what] = (done.returncode, done.stderr.strip().splitlines()[-1:] or [""])
    subprocess.run(["pkill", "-u", s, "sleep"], capture_output=True)
    Path("/tmp/llm-course-hub-limit-test").unlink(missing_ok=True)
    assert outcomes["memory"][0] != 0 and "MemoryError" in outcomes["memory"][1][0], outcomes
    assert outcomes["processes"][0] != 0 and "Resource temporarily unavailable" in outcomes["processes"][1][0], outcomes
    assert outcomes["file size"][0] != 0, outcomes                       # SIGXFSZ, or EFBIG where ignored
    servers = subprocess.run(["pgrep", "-u", roster.students[0], "-f", "jupyterhub-singleuser"],
                             capture_output=True, text=True).stdout.split()
    assert servers, "the student's server is not running"
    limits = Path(f"/proc/{servers[0]}/limits").read_text()
    assert "Max processes             256" in limits and "Max address space         4294967296" in limits, limits
    teachers = subprocess.run(["pgrep", "-u", roster.instructor, "-f", "jupyterhub-singleuser"],
                              capture_output=True, text=True).stdout.split()
    assert teachers, "the instructor's server is not running"
    limits = Path(f"/proc/{teachers[0]}/limits").read_text()      # grading runs there: the sandbox sets its own
    hard = re.search(r"Max processes +\S+ +(\S+)", limits).group(1)          # the machine's, not the students' 256
    assert hard == "unlimited" or int(hard) > 4096, limits
    assert re.search(r"Max address space +unlimited +unlimited", limits), limits
