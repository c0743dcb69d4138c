"""The learner's workspace: a git-ignored copy of labs/ that course updates never overwrite.

    report = sync(course_root, course_root / "workspace")   # `make lab` runs this first
    print(report.summary())

labs/ is the course's release (regenerated from solutions/, tracked in git); learners work in workspace/.
A manifest (`workspace/.course-release.json`) records, for each file, the fingerprint of the release copied there
(for a notebook its cells' sources: outputs that Run All and autosave write are not an edit):

* a released file missing from the workspace is copied in (and docs/START_HERE.md, the learner's first page, to
  the workspace's top);
* a file still equal to the release it was copied from is replaced by a newer release;
* a file the learner changed is never touched: a newer release is put beside it, under
  `workspace/.new-releases/<lab>/`, and the report names it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = ".course-release.json"
NEW_RELEASES = ".new-releases"
SKIP_PARTS = {".ipynb_checkpoints", "__pycache__"}
START_HERE = "START_HERE.md"                # the learner's first page, from docs/


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fingerprint(path: Path) -> str:
    """What says whether a file changed as a learner changes it: for a notebook the sha256 of its cells' types,
    sources, nbgrader metadata and tags (Run All and autosave rewrite outputs, execution counts and the rest of the
    metadata, which are not the learner's work); for any other file, or a notebook that does not parse, the sha256
    of its bytes."""
    path = Path(path)
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(path.read_text())["cells"]
            text = json.dumps([[c.get("cell_type"), "".join(c.get("source", "")), c.get("metadata", {}).get("nbgrader"),
                                c.get("metadata", {}).get("tags")] for c in cells], sort_keys=True)
            return "cells:" + hashlib.sha256(text.encode()).hexdigest()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return sha256(path)


@dataclass
class SyncReport:
    """What one sync did, as paths relative to the workspace."""

    workspace: Path
    copied: list[str] = field(default_factory=list)        # new in the workspace
    updated: list[str] = field(default_factory=list)       # unedited, replaced by a newer release
    kept: list[str] = field(default_factory=list)          # edited by the learner; newer release put beside it
    created: bool = False

    def summary(self) -> str:
        lines = []
        if self.created:
            lines.append(f"workspace {self.workspace} created from labs/ ({len(self.copied)} files); "
                         f"your work there is never overwritten by course updates. Open {START_HERE} first.")
        elif self.copied:
            lines.append("new in your workspace: " + ", ".join(self.copied))
        if self.updated:
            lines.append("updated to the newest release (you had not changed them): " + ", ".join(self.updated))
        for rel in self.kept:
            lines.append(f"{rel} has a newer release; your copy is kept as it is. The new release is at "
                         f"{self.workspace / NEW_RELEASES / rel}")
        return "\n".join(lines) or f"{self.workspace} is up to date with labs/"


def released_files(labs: Path) -> list[Path]:
    """Files under labs/ (relative paths), checkpoints and caches excluded."""
    return sorted(p.relative_to(labs) for p in labs.rglob("*")
                  if p.is_file() and not SKIP_PARTS & set(p.relative_to(labs).parts))


def _load_manifest(workspace: Path) -> dict[str, str]:
    try:
        return json.loads((workspace / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def course_files(course_root: Path) -> list[tuple[str, Path]]:
    """(workspace path, source) of every file the workspace holds: labs/'s files, and docs/START_HERE.md at its top."""
    labs = Path(course_root) / "labs"
    files = [(rel.as_posix(), labs / rel) for rel in released_files(labs)]
    start = Path(course_root) / "docs" / START_HERE
    return files + ([(START_HERE, start)] if start.is_file() else [])


def sync(course_root: Path, workspace: Path) -> SyncReport:
    """Create or update `workspace` from course_root/labs (and docs/START_HERE.md) without ever overwriting a
    learner's change."""
    labs = Path(course_root) / "labs"
    if not labs.is_dir():
        raise FileNotFoundError(f"no labs/ folder in {course_root}")
    workspace = Path(workspace)
    report = SyncReport(workspace, created=not workspace.exists())
    workspace.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(workspace)
    for key, src in course_files(course_root):
        dst = workspace / key
        release = fingerprint(src)
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            manifest[key] = release
            report.copied.append(key)
            continue
        if manifest.get(key) == release:
            continue
        current = fingerprint(dst)
        if current == release:                      # the learner's file already equals the release
            manifest[key] = release
        elif manifest.get(key) in (current, sha256(dst)):    # unedited since copied (an older manifest holds
            shutil.copyfile(src, dst)                          # the bytes' sha256): take the newer release
            manifest[key] = release
            report.updated.append(key)
        else:                                        # edited (or of unknown origin): keep it
            beside = workspace / NEW_RELEASES / key
            beside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, beside)
            report.kept.append(key)
    (workspace / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return report
