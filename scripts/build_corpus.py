"""Build the course corpus: CPython 3.11.7 top-level standard-library modules (Lib/*.py).

Usage: python scripts/build_corpus.py /path/to/cpython-3.11.7/Lib

Writes data/corpus/{train.txt,val.txt,manifest.json,LICENSE.txt}. Documents are joined with the
end-of-text marker. The split is by file: a file goes to validation when the first 8 hex digits of
sha256(file name) are divisible by 10 (about 10% of files), so the split never depends on order.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

EOT = "<|endoftext|>"
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "data" / "corpus"


def is_validation(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 10 == 0


def main(lib_dir: str) -> None:
    lib = Path(lib_dir)
    files = sorted(p for p in lib.glob("*.py") if p.is_file())
    if not files:
        raise SystemExit(f"no *.py files under {lib}: pass CPython's Lib/ folder")
    OUT.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[str]] = {"train": [], "val": []}
    manifest = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if EOT in text:
            raise SystemExit(f"{path} contains the end-of-text marker; cannot use it")
        split = "val" if is_validation(path.name) else "train"
        splits[split].append(text)
        manifest.append({"file": f"Lib/{path.name}", "split": split, "bytes": len(text.encode()),
                         "sha256": hashlib.sha256(text.encode()).hexdigest()})
    for split, docs in splits.items():
        (OUT / f"{split}.txt").write_text(EOT.join(docs), encoding="utf-8")
    (OUT / "manifest.json").write_text(json.dumps(
        {"source": "CPython v3.11.7, Lib/*.py (top-level modules)", "license": "PSF-2.0",
         "separator": EOT, "files": manifest}, indent=1) + "\n")
    license_file = lib / "LICENSE.txt"
    if license_file.exists():
        (OUT / "LICENSE.txt").write_text(license_file.read_text(encoding="utf-8"), encoding="utf-8")
    for split, docs in splits.items():
        print(f"{split}: {len(docs)} files, {sum(len(d.encode()) for d in docs) / 1e6:.2f} MB")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
