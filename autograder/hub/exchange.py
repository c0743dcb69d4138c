"""nbgrader's file-system exchange (0.9.6), with three holes between students closed; chosen in
config/hub/common/nbgrader_config.py through nbgrader's own `ExchangeFactory`.

What nbgrader leaves open on a shared machine, and what each class here changes:

* inbound (`<course>/inbound`, mode 2733: anyone may create, nobody but the instructor may list) has no sticky bit,
  so a student who learns the name of a classmate's submission can rename it, for example to their own name.
  `StickyReleaseAssignment` adds the sticky bit: only an entry's owner may rename or remove it.
* a submission (`<student>+<lab>+<time>+<random>`) is a 0777 directory of 0644 files: with its name, anyone may read
  it, delete its files or put their own in. `PrivateSubmit` makes it 0750/0640; inbound's set-group-id bit gave it the
  instructor's group, so the instructor reads it and classmates cannot.
* anyone may create a submission in a classmate's name; `nbgrader collect` only warns when the owner differs
  (`check_owner`) and collects it. `OwnerCheckedCollect` refuses it, with an error naming both people, and collects
  the student's own latest submission instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import stat
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_assignment import ExchangeReleaseAssignment
from nbgrader.exchange.default.submit import ExchangeSubmit


def owner_name(path: str | Path) -> str:
    """The login name of whoever owns `path` (its uid where no user has it)."""
    uid = os.lstat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def foreign_owners(submission: str | Path, student: str) -> set[str]:
    """Who, other than `student`, owns the submission directory or anything in it (empty: all the student's)."""
    paths = [Path(submission), *Path(submission).rglob("*")]
    return {name for name in map(owner_name, paths) if name != student}


class StickyReleaseAssignment(ExchangeReleaseAssignment):
    """nbgrader's release, with inbound's sticky bit set: a submission can be renamed or removed only by its owner."""

    def init_dest(self) -> None:
        super().init_dest()
        os.chmod(self.inbound_path, os.stat(self.inbound_path).st_mode | stat.S_ISVTX)


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, then the submission readable by its owner and inbound's group (the instructor's) only."""

    def do_copy(self, src: str, dest: str, log=None) -> None:
        """nbgrader's copy; into inbound, the copy's directory is then made afresh. copytree gives it the notebook
        folder's mode, which drops the set-group-id bit it took from inbound, so the files nbgrader writes next
        (timestamp, secret) would take the student's group; a directory made in inbound takes the bit again."""
        super().do_copy(src, dest, log)
        if os.path.dirname(dest) != self.inbound_path:
            return
        fresh = dest + ".part"
        os.mkdir(fresh)
        for name in os.listdir(dest):
            os.rename(os.path.join(dest, name), os.path.join(fresh, name))
        os.rmdir(dest)
        os.rename(fresh, dest)

    def copy_files(self) -> None:
        super().copy_files()
        submission = os.path.join(self.inbound_path, self.assignment_filename)
        if os.stat(submission).st_gid != os.stat(self.inbound_path).st_gid:
            return                       # inbound without a group of the instructor's: nbgrader's modes stay
        self.set_perms(submission, fileperms=0o640, dirperms=0o750)


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, taking for each student their latest submission (the latest before the due date with
    `before_duedate`) among those the student owns; one made by anyone else is refused with an error."""

    def init_src(self) -> None:
        super().init_src()               # nbgrader's checks (course, inbound readable) and the due date
        student = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student}+{self.coursedir.assignment_id}+*")
        by_student: dict[str, list[dict]] = {}
        for path in sorted(glob.glob(pattern)):
            record = self._path_to_record(path)
            others = foreign_owners(path, record["username"])
            if others:
                self.log.error("Not collected: %s claims to be %s's submission but belongs to %s",
                               record["filename"], record["username"], ", ".join(sorted(others)))
                continue
            by_student.setdefault(record["username"], []).append(record)
        self.src_records = [self._choose(records) for records in by_student.values()]

    def _choose(self, records: list[dict]) -> dict:
        newest_first = self._sort_by_timestamp(records)
        if self.before_duedate and self.duedate is not None:
            on_time = [r for r in newest_first if r["timestamp"] <= self.duedate]
            return (on_time or newest_first)[0]
        return newest_first[0]
