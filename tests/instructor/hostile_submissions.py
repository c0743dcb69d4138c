"""Hostile submissions for the fixture assignment: each one tries what a cheating or harmful learner would.

Every hostile notebook answers ex1 and ex2 honestly (3 points) and puts its attack in the q1 answer cell,
written so that the attack, had it worked, would also earn q1's point (or more, through the gradebook).
The attacker knows the instructor's course folder (COURSE): the strongest assumption.
"""

from __future__ import annotations

import os
from pathlib import Path

SURVIVOR_MARK = "i19-survivor-process"

_FIND_GRADEBOOKS = '''import os, sqlite3
def _gradebooks():
    """The instructor's gradebook, and any gradebook.db in the folders above the kernel's."""
    found, d = [], os.getcwd()
    for p in [{course!r} + "/gradebook.db"] + [os.path.join(d, *[".."] * k, "gradebook.db") for k in range(8)]:
        if os.path.exists(p) and os.path.realpath(p) not in found:
            found.append(os.path.realpath(p))
    return found
hit = False
for path in _gradebooks():
    try:
        con = sqlite3.connect(path)
{attack}
        con.commit()
        con.close()
        hit = True
    except Exception as exc:
        print("attack failed:", type(exc).__name__)
print("gradebooks seen:", _gradebooks())
answer = 4 if hit else 0
'''

_MINE = ("(SELECT n.id FROM submitted_notebook n JOIN submitted_assignment a ON n.assignment_id = a.id "
         "WHERE a.student_id = '{me}')")


def _gradebook_attack(course: Path, sql: list[str]) -> str:
    body = "\n".join(f"        con.execute({q!r})" for q in sql)
    return _FIND_GRADEBOOKS.format(course=str(course), attack=body)


def _delete_gradebook(course: Path) -> str:
    return _FIND_GRADEBOOKS.format(course=str(course), attack="        con.close(); os.remove(path)")


_SURVIVOR = '''import subprocess, sys
code = """
import os, sqlite3, time
for _ in range(240):
    time.sleep(0.5)
    for p in [{course!r} + '/gradebook.db']:
        try:
            con = sqlite3.connect(p)
            con.execute("UPDATE grade SET manual_score = 1")
            con.commit()
        except Exception:
            pass
"""
subprocess.Popen([sys.executable, "-c", code, "{mark}"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
answer = 0
'''

_NETWORK_LOCAL = '''import socket
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
        answer = int(s.recv(16))
except OSError as exc:
    print("no connection:", exc)
    answer = 0
'''

_NETWORK_DNS = '''import socket
try:
    socket.getaddrinfo("pypi.org", 443)
    answer = 4
except OSError as exc:
    print("no name resolution:", exc)
    answer = 0
'''

_DISK = '''chunk = b"x" * (64 << 20)
written = 0
try:
    with open("big.bin", "wb") as f:
        for _ in range(32):                 # 2 GiB
            f.write(chunk)
            written += len(chunk)
except OSError as exc:
    print("stopped after", written >> 20, "MiB:", exc)
answer = 4 if written >= 2 << 30 else 0
'''

_MEMORY = '''try:
    block = bytearray(3 << 30)              # 3 GiB, zero-filled: every page touched
    block[::4096] = b"x" * len(block[::4096])
    answer = 4
except MemoryError as exc:
    print("refused:", repr(exc))
    answer = 0
'''

_READ_SOLUTIONS = '''import glob, os
seen = []
roots = [{course!r}, os.getcwd()] + [os.path.join(os.getcwd(), *[".."] * k) for k in range(1, 8)]
for root in roots:
    for p in glob.glob(os.path.join(root, "solutions", "**", "*.ipynb"), recursive=True) + \\
            glob.glob(os.path.join(root, "*", "solutions", "**", "*.ipynb"), recursive=True):
        try:
            if "BEGIN SOLUTION" in open(p).read():
                seen.append(p)
        except OSError:
            pass
for p in ["answers.txt", "solution_copy.ipynb"]:      # planted beside the notebook (a link, a hard link)
    try:
        if "BEGIN SOLUTION" in open(p).read():
            seen.append(p)
    except OSError:
        pass
print("solutions seen:", seen)
answer = 4 if seen else 0
'''

_READ_HIDDEN = _FIND_GRADEBOOKS.replace(
    "        con.commit()\n        con.close()\n        hit = True",
    "        rows = con.execute(\"SELECT source FROM source_cells WHERE source LIKE '%HIDDEN%'\").fetchall()\n"
    "        hit = hit or bool(rows)")

_SIGINT = '''import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
'''


# The judge (autograder/judging/judge.py) runs the test cells; while it waits for the kernel to run `add(2, 3)`, learner code
# can write to the judge's socket itself. Each of these asks the judge for what would run code there (a course
# function by a path that reaches os.system, a dunder of a handle, the names of its namespace) and tries to read a
# canary file outside every sandbox and to write beside it. Had one worked, `answer` would be 4 (q1's point).
# The attacks import the wire (and torch with it) only when the check calls them: the cell itself must finish inside
# the class's 5-second cell limit however loaded the machine is.
_JUDGE_REACH = '''import gc
answer = 0
tried = []
def _ask(op, **payload):
    from autograder.checking import wire
    endpoint = next(o for o in gc.get_objects() if isinstance(o, wire.Endpoint) and o.names is not None)
    send = getattr(wire, "send_frame", None) or wire._send_frame       # (either name: the attack predates them)
    recv = getattr(wire, "recv_frame", None) or wire._recv_frame
    send(endpoint.sock, {{"op": op, **payload}}, {{}})
    header, _ = recv(endpoint.sock)
    return header
def _attack():
    global answer
    canary, out = {canary!r}, {written!r}
    asks = [("package", dict(path="autograder.judging.judge:linecache.getline", args={{"list": [canary, 1]}}, kwargs={{"dict": []}})),
            ("package", dict(path="autograder.judging.judge:os.system", args={{"list": ["echo pwned > " + out]}},
                             kwargs={{"dict": []}})),
            ("getname", dict(name="__builtins__")), ("type", dict(h=1)), ("vars", dict(h=1))]
    asks += [("getattr", dict(h=h, name=n)) for h in range(1, 6) for n in ("__globals__", "__class__", "_endpoint")]
    for op, payload in asks:
        reply = _ask(op, **payload)
        tried.append((op, sorted(reply)))
        if "raise" not in reply and {secret!r} in str(reply.get("value")):
            answer = 4
def add(a, b):
    _attack()
    return a + b
'''

# A reply the judge must refuse before it decodes it: a value of about 48 MB of JSON, or nested 200,000 deep.
_JUDGE_FLOOD = '''import gc, struct
def add(a, b):
    from autograder.checking import wire
    endpoint = next(o for o in gc.get_objects() if isinstance(o, wire.Endpoint) and o.names is not None)
    text = {payload}
    endpoint.sock.sendall(struct.pack("!II", len(text), 0) + text)
    return a + b
'''
FLOOD_WIDE = 'b\'{"value": {"list": [\' + b", ".join([b\'{"list": [1, 2, 3]}\'] * 2_500_000) + b"]}}"'
FLOOD_DEEP = 'b\'{"value": \' + b"[" * 200_000 + b"]" * 200_000 + b"}"'


def _edit_metadata(nb) -> None:
    """Name another kernel, tag the test cells to be skipped, invent a 100-point cell, duplicate one."""
    nb["metadata"]["kernelspec"] = {"name": "instructor-unsandboxed", "display_name": "x", "language": "python"}
    extra = []
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade"):
            cell["metadata"]["tags"] = ["skip-execution", "raises-exception"]
            meta["points"] = 100
        if meta.get("grade_id") == "ex2_check":
            dup = {**cell, "id": "dup-ex2", "source": "pass", "metadata": {"nbgrader": dict(meta)}}
            extra.append(dup)
    bonus = {"cell_type": "code", "id": "bonus", "execution_count": None, "outputs": [], "source": "pass",
             "metadata": {"nbgrader": {"grade": True, "grade_id": "bonus", "locked": True, "points": 100,
                                       "schema_version": 3, "solution": False}}}
    nb["cells"] = nb["cells"] + extra + [bonus]


def _symlink_to(target: Path):
    return lambda dest: os.symlink(target, dest)


def _hardlink_to(target: Path):
    return lambda dest: os.link(target, dest)


CANARY_SECRET = "canary-7f3a9c"


def hostile_class(course: Path, port: int, good: dict[str, str],
                  canary: Path) -> dict[str, tuple[dict, float, str]]:
    """student -> (spec for make_submission, expected score, expected status). `canary` is a file outside every
    sandbox holding CANARY_SECRET: no submission may read it or write beside it."""
    me = lambda s: _MINE.format(me=s)   # noqa: E731
    solution = course / "solutions" / "ex_fixture" / "ex_fixture.ipynb"
    q1 = lambda code: {**good, "q1_answer": code}   # noqa: E731
    return {
        "gb_own_manual": (q1(_gradebook_attack(course, [
            f"UPDATE grade SET manual_score = (SELECT max_score FROM grade_cells WHERE grade_cells.id = grade.cell_id)"
            f" WHERE notebook_id IN {me('gb_own_manual')}"])), 3, "ok"),
        "gb_others": (q1(_gradebook_attack(course, [
            f"UPDATE grade SET auto_score = 0, manual_score = 0 WHERE notebook_id NOT IN {me('gb_others')}"])),
            3, "ok"),
        "gb_max": (q1(_gradebook_attack(course, ["UPDATE grade_cells SET max_score = 15"])), 3, "ok"),
        "gb_delete_rows": (q1(_gradebook_attack(course, [
            f"DELETE FROM grade WHERE notebook_id NOT IN {me('gb_delete_rows')}",
            "DELETE FROM submitted_assignment WHERE student_id != 'gb_delete_rows'"])), 3, "ok"),
        "gb_delete_file": (q1(_delete_gradebook(course)), 3, "ok"),
        "survivor": (q1(_SURVIVOR.format(course=str(course), mark=SURVIVOR_MARK)), 3, "ok"),
        "net_loopback": (q1(_NETWORK_LOCAL.format(port=port)), 3, "ok"),
        "net_dns": (q1(_NETWORK_DNS), 3, "ok"),
        "disk_2gib": (q1(_DISK), 3, "ok"),
        "memory_3gib": (q1(_MEMORY), 3, "ok"),
        "read_solutions": ({**q1(_READ_SOLUTIONS), "#files": {"answers.txt": _symlink_to(solution),
                                                               "solution_copy.ipynb": _hardlink_to(solution)}},
                           3, "ok"),
        "read_hidden": (q1(_READ_HIDDEN.format(course=str(course), attack="")), 3, "ok"),
        "sigint_loop": ({**good, "ex2_code": _SIGINT}, 1, "timeout"),
        "metadata": ({**good, "ex1_code": "def add(a, b):\n    return a - b", "#edit": _edit_metadata}, 3, "ok"),
        "judge_reach": ({**good, "q1_answer": "answer = answer", "ex1_code": _JUDGE_REACH.format(
            canary=str(canary), written=str(canary.with_name("written-by-the-judge")), secret=CANARY_SECRET)},
            3, "ok"),
        "judge_flood_wide": ({**good, "ex1_code": _JUDGE_FLOOD.format(payload=FLOOD_WIDE)}, 3, "ok"),
        "judge_flood_deep": ({**good, "ex1_code": _JUDGE_FLOOD.format(payload=FLOOD_DEEP)}, 3, "ok"),
        "judge_timeout": ({**good, "ex1_code": "import time\ndef add(a, b):\n    time.sleep(60)\n    return a + b"},
                          3, "ok"),
    }
