"""Put a sandbox's writable file systems back as they were, between two witnesses forked in it (witness.py).

Inside the sandbox, the writable places are the read-write mounts bubblewrap made (`/tmp`, `/dev/shm`, the tmpfs
holding `/dev` and the root's skeleton, as /proc/self/mountinfo lists them; /proc and /sys aside). A child can
write anywhere its uid may in them, and among them lie bubblewrap's own entries: the mount points it bound (the
course package, the judge's socket, device nodes) and the folders it made to hold them (the repository's path
under /tmp when it lives there), which must stay. So:

    baseline = snapshot()          after the witness process's imports, before any child: every entry of the
                                   read-write mounts, with its inode, type, mode, size and ctime (a child cannot
                                   set ctime back), not descending into other mounts
    restore(baseline, work)        after a child and everything it started are gone: an entry not in the
                                   baseline is removed (its folders made readable first); a folder whose mode
                                   changed gets it back, one that went missing is made again (empty: the home
                                   folder); an entry that changed or went missing under `work` is copied again
                                   from /submission; anything else changed or missing: Unrestorable (the
                                   witness process stops; the grading process starts a fresh one for the next
                                   test cell). Returns the next baseline.

Folders this uid can neither list nor write (bubblewrap's, made to hold a mount: /etc/ssl) are not entered: nothing
can be left there. One it can write but not list makes `snapshot` raise Unrestorable, and the witness process then
serves one child only, as a fresh process per test cell would.
"""

from __future__ import annotations

import os
import re
import shutil
import stat

__all__ = ["snapshot", "restore", "Unrestorable"]

Signature = tuple[int, int, int, int]       # inode, mode, size, ctime (folders: inode and mode only)
SKIPPED = ("/proc", "/sys")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> tuple[list[str], set[str]]:
    """(read-write mount points, every mount point) of this process's mount namespace."""
    writable, points = [], set()
    with open("/proc/self/mountinfo") as table:
        for row in table:
            fields = row.split()
            point = _unescape(fields[4])
            points.add(point)
            inside = any(point == s or point.startswith(s + "/") for s in SKIPPED)
            if "rw" in fields[5].split(",") and not inside:
                writable.append(point)
    return writable, points


def _signature(st: os.stat_result) -> Signature:
    if stat.S_ISDIR(st.st_mode):
        return (st.st_ino, st.st_mode, 0, 0)
    return (st.st_ino, st.st_mode, st.st_size, st.st_ctime_ns)


class Unrestorable(RuntimeError):
    """What a child may have written cannot be told or undone here: the witness process stops after this child."""


def _closed(path: str) -> bool:
    """A folder of another uid that this one can neither list nor change (bubblewrap's, holding a mount): nothing
    can be left in it. (One this uid owns, it could open with chmod.)"""
    return os.lstat(path).st_uid != os.getuid() and not os.access(path, os.R_OK) and not os.access(path, os.W_OK)


def snapshot() -> dict[str, Signature]:
    """Every entry of the read-write mounts (mount points below them recorded, not entered)."""
    writable, points = _mounts()
    seen: dict[str, Signature] = {}
    todo = list(writable)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        st = os.lstat(path)
        seen[path] = _signature(st)
        if stat.S_ISDIR(st.st_mode) and (path in writable or path not in points) and not _closed(path):
            try:
                todo += [entry.path for entry in os.scandir(path)]
            except PermissionError as exc:        # writable but not readable: what lands there cannot be seen
                raise Unrestorable(f"{path} can be written but not listed") from exc
    return seen


def _remove(path: str) -> None:
    """Remove a file or a whole folder, folders made unreadable or unwritable included (the caller's uid owns them)."""
    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        return
    os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o700)
    shutil.rmtree(path)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def restore(baseline: dict[str, Signature], work: str) -> dict[str, Signature]:
    """Undo what was written in the read-write mounts since `baseline`, copy /submission into `work` again; the
    snapshot of the result (the next baseline)."""
    writable, points = _mounts()
    todo = []
    for root in writable:
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or _closed(root):
            continue                                       # a device node bound alone, or a folder nobody writes
        if root in baseline and _signature(st) != baseline[root]:
            os.chmod(root, stat.S_IMODE(baseline[root][1]))
        todo.append(root)
    while todo:
        path = todo.pop()
        for entry in os.scandir(path):
            child = entry.path
            if child not in baseline:
                _remove(child)
                continue
            st = os.lstat(child)
            was = baseline[child]
            if _signature(st) == was:
                if stat.S_ISDIR(st.st_mode) and child not in points and not _closed(child):
                    todo.append(child)
                continue
            if stat.S_ISDIR(was[1]) and stat.S_ISDIR(st.st_mode) and st.st_ino == was[0]:
                os.chmod(child, stat.S_IMODE(was[1]))      # its mode changed: back, then look inside
                todo.append(child)
            elif _under(child, work):
                _remove(child)                             # copied again below
            else:
                raise Unrestorable(f"{child} changed in the witness's sandbox and cannot be put back")
    for path in sorted(p for p in baseline if not os.path.lexists(p) and not _under(p, work)):
        if not stat.S_ISDIR(baseline[path][1]):
            raise Unrestorable(f"{path} went missing in the witness's sandbox")
        os.mkdir(path, stat.S_IMODE(baseline[path][1]))    # an empty folder of the boot's (the home folder)
    if os.path.isdir("/submission"):
        shutil.copytree("/submission", work, symlinks=True, dirs_exist_ok=True)
    os.makedirs(work, exist_ok=True)
    return snapshot()
