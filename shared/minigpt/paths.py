"""Where things live: the course's data (`data/` at the repository root, or $MINIGPT_DATA_DIR) and the installed
libraries (whose frames in a traceback are not the user's code)."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The data folder (corpus, tokenizer, checkpoints)."""
    return Path(os.environ.get("MINIGPT_DATA_DIR", REPO_ROOT / "data"))


def library_dirs() -> tuple[Path, ...]:
    """The folders of installed packages and of the standard library, resolved."""
    paths = sysconfig.get_paths()
    return tuple(Path(paths[key]).resolve() for key in ("purelib", "platlib", "stdlib"))
