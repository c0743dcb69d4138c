"""Winnowed fingerprints of a token stream (Schleimer, Wilkerson and Aiken, SIGMOD 2003).

Every run of K tokens is hashed (blake2b, so the same in every process); of each W consecutive hashes the
smallest is kept (the rightmost on ties). Two streams sharing a run of at least K + W - 1 tokens share a
fingerprint; runs shorter than K never do. Each fingerprint remembers where its runs start and which source lines
they span, so a report can count the tokens shared and highlight the lines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from autograder.grading.normal_form import Token

K = 10        # tokens per hashed run: a line or two of code
W = 6         # window: every shared run of K + W - 1 = 15 tokens (two or three lines) is found


@dataclass(frozen=True)
class Run:
    start: int    # index of its first token
    first: int    # first and last source line of its tokens
    last: int


@dataclass
class Fingerprints:
    """hash -> the runs of tokens that produced it."""
    runs: dict[int, list[Run]] = field(default_factory=dict)

    @property
    def hashes(self) -> set[int]:
        return set(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def without(self, hashes: set[int]) -> Fingerprints:
        return Fingerprints({h: runs for h, runs in self.runs.items() if h not in hashes})

    def merged(self, other: Fingerprints, shift: int = 0) -> Fingerprints:
        """These fingerprints and other's, other's lines moved down by shift (other's token starts kept apart)."""
        out = Fingerprints({h: list(runs) for h, runs in self.runs.items()})
        offset = 1 + max((r.start for runs in self.runs.values() for r in runs), default=-K) + K
        for h, runs in other.runs.items():
            out.runs.setdefault(h, []).extend(Run(r.start + offset, r.first + shift, r.last + shift) for r in runs)
        return out

    def lines_of(self, hashes: set[int]) -> set[int]:
        """Source lines spanned by the runs behind these hashes."""
        return {line for h in hashes & self.runs.keys() for r in self.runs[h] for line in range(r.first, r.last + 1)}

    def tokens_of(self, hashes: set[int], k: int = K) -> int:
        """How many tokens the runs behind these hashes cover."""
        return len({i for h in hashes & self.runs.keys() for r in self.runs[h] for i in range(r.start, r.start + k)})


def _hash(run: list[Token]) -> int:
    digest = hashlib.blake2b("\x1f".join(t.text for t in run).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def fingerprints(tokens: list[Token], *, k: int = K, w: int = W) -> Fingerprints:
    """The winnowed fingerprints of a token stream (none if it is shorter than k tokens)."""
    hashes = [_hash(tokens[i:i + k]) for i in range(len(tokens) - k + 1)]
    out = Fingerprints()
    chosen = -1
    for start in range(max(len(hashes) - w + 1, 1 if hashes else 0)):
        pick = min(reversed(range(start, min(start + w, len(hashes)))), key=hashes.__getitem__)   # rightmost minimum
        if pick != chosen:
            chosen = pick
            run = tokens[pick:pick + k]
            out.runs.setdefault(hashes[pick], []).append(Run(pick, min(t.line for t in run), max(t.line for t in run)))
    return out
