"""A submission is untrusted data: copy what it may bring, neutralised, before nbgrader sees it.

`stage_submission(src, dest, released)` copies submitted/<student>/<assignment>/ into a fresh folder:

* only regular files and folders are copied, read through O_NOFOLLOW descriptors: symbolic links, hard
  links (a second name for, say, the gradebook), devices, sockets and fifos are left out, with a note;
* a few limits: 200 files, 8 levels, 50 MB per file, 200 MB in all; hidden names (.ipynb_checkpoints,
  .git) are skipped;
* a notebook of the assignment is rewritten: its metadata is the released notebook's (so it cannot name
  another kernel), cell metadata is reduced to the nbgrader block of the released cell with the same
  grade_id (no tags such as `skip-execution` or `raises-exception`, no invented or duplicated grade ids,
  no changed points), cell ids are fresh, outputs are cleared;
* timestamp.txt is kept only if nbgrader can parse it.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import nbformat

MAX_FILES = 200
MAX_DEPTH = 8
MAX_FILE_BYTES = 50 << 20
MAX_TOTAL_BYTES = 200 << 20


def _read_regular(path: Path, notes: list[str], rel: str) -> bytes | None:
    """Content of a regular, singly linked file, or None (with a note) for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        notes.append(f"left out {rel} (not a plain file: {exc.strerror})")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            notes.append(f"left out {rel} (not a plain file)")
            return None
        if st.st_nlink > 1:
            notes.append(f"left out {rel} (a hard link to another file)")
            return None
        if st.st_size > MAX_FILE_BYTES:
            notes.append(f"left out {rel} (larger than {MAX_FILE_BYTES >> 20} MB)")
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES]
    finally:
        os.close(fd)


def _released_cells(released_nb) -> dict[str, dict]:
    return {c.metadata["nbgrader"]["grade_id"]: dict(c.metadata["nbgrader"])
            for c in released_nb.cells if "grade_id" in c.get("metadata", {}).get("nbgrader", {})}


def neutralise_notebook(text: str, released_nb, notes: list[str] | None = None) -> str:
    """The submitted notebook with everything but the learner's cell sources taken from the release.

    What was dropped is appended to notes (tags the release does not have, another kernelspec, unknown or duplicated
    grade ids).
    """
    notes = [] if notes is None else notes
    nb = nbformat.reads(text, as_version=4)
    allowed = _released_cells(released_nb)
    seen: set[str] = set()
    tags, unknown, dupes = 0, [], []
    released_tags = {str(t) for c in released_nb.cells for t in c.get("metadata", {}).get("tags", [])}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        own = cell.get("metadata", {}).get("tags") or []
        tags += bool({str(t) for t in own} - released_tags) if isinstance(own, list) else 1     # the release's own: no news
        cell.metadata = nbformat.NotebookNode()
        if isinstance(gid, str) and gid in allowed and gid not in seen:
            cell.metadata["nbgrader"] = nbformat.from_dict(allowed[gid])
            seen.add(gid)
        elif gid is not None:
            (dupes if gid in seen else unknown).append(str(gid)[:40])
        cell["id"] = uuid.uuid4().hex[:12]
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.pop("attachments", None) if cell.cell_type != "markdown" else None
    asked = nb.metadata.get("kernelspec", {}).get("name") if isinstance(nb.metadata.get("kernelspec"), dict) else None
    wanted = released_nb.metadata.get("kernelspec", {}).get("name")
    if asked != wanted:
        notes.append(f"kernelspec {str(asked)[:40]!r} ignored (graded with the course's sandboxed kernel)")
    if tags:
        notes.append(f"cell tags dropped from {tags} cell(s)")
    if unknown:
        notes.append("grade cells not in the assignment ignored: " + ", ".join(unknown))
    if dupes:
        notes.append("duplicated grade cells ignored: " + ", ".join(dupes))
    nb.metadata = nbformat.from_dict(json.loads(json.dumps(released_nb.metadata)))
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nbformat.writes(nb)


def stage_submission(src: Path, dest: Path, released: dict[str, object]) -> list[str]:
    """Copy submission folder src into dest (created), neutralised. released: notebook name -> released nb.

    Returns notes for the instructor (what was left out or rewritten). A notebook that does not parse is
    copied as it is (precheck reports it; nbgrader then fails on it as on any invalid notebook).
    """
    from nbgrader.utils import parse_utc

    notes: list[str] = []
    dest.mkdir(parents=True, exist_ok=True)
    total, count = 0, 0
    todo = [(Path(src), Path(dest), 0)]
    while todo:
        here, there, depth = todo.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"could not read {here.name}: {exc.strerror}")
            continue
        for entry in entries:
            rel = os.path.relpath(entry.path, src)
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                notes.append(f"left out {rel} (a symbolic link)")
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 >= MAX_DEPTH:
                    notes.append(f"left out {rel} (folders nested too deep)")
                    continue
                (there / entry.name).mkdir(mode=0o755)
                todo.append((Path(entry.path), there / entry.name, depth + 1))
                continue
            count += 1
            if count > MAX_FILES:
                notes.append(f"left out {rel} (more than {MAX_FILES} files)")
                continue
            data = _read_regular(Path(entry.path), notes, rel)
            if data is None:
                continue
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                notes.append(f"left out {rel} (submission larger than {MAX_TOTAL_BYTES >> 20} MB)")
                continue
            if depth == 0 and entry.name in released:
                try:
                    data = neutralise_notebook(data.decode("utf-8"), released[entry.name], notes).encode("utf-8")
                except Exception:
                    pass                  # invalid: left as submitted, reported by precheck
            if depth == 0 and entry.name == "timestamp.txt":
                try:
                    parse_utc(data.decode("utf-8").strip())
                except Exception:
                    notes.append("ignored timestamp.txt (not a timestamp)")
                    continue
            target = there / entry.name
            target.write_bytes(data)
            target.chmod(0o644)
    Path(dest).chmod(0o755)
    return notes
