"""Where the course's data lives: `data/` at the repository root, or $MINIGPT_DATA_DIR."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The data folder (corpus, tokenizer, checkpoints)."""
    return Path(os.environ.get("MINIGPT_DATA_DIR", REPO_ROOT / "data"))
