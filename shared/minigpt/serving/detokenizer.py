"""Incremental detokenization (lab 08): text deltas that concatenate to exactly the final text.

A byte-level BPE token can end in the middle of a UTF-8 character (an emoji spans 4 bytes, often 2-3
tokens). Decoding each token alone would print replacement characters, so the text of ALL output bytes
is decoded every step and only the part that can no longer change is emitted:

    stable = decode(bytes[:cut], errors="replace")   cut = before a trailing incomplete UTF-8 sequence
    delta  = stable[len(emitted):]

With stop strings the last max(len(stop)) - 1 characters are held back too (they may be the start of a
stop string, which the final text leaves out, as OpenAI's API does). At the end the whole text is
decoded and the rest is emitted, so  "".join(deltas) == final text.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["IncrementalDetokenizer", "incomplete_utf8_tail"]


def incomplete_utf8_tail(data: bytes) -> int:
    """Number of trailing bytes that start a UTF-8 character not complete yet (0..3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:                       # not a continuation byte: a lead byte or ASCII
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            return back if need > back else 0
    return 0


class IncrementalDetokenizer:
    """Feed it each step's tokens; it returns the text delta to send."""

    def __init__(self, tokenizer: object, stop_strings: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.holdback = max((len(s) for s in self.stop_strings), default=1) - 1
        self.data = b""
        self.emitted = ""

    def step(self, new_token_ids: Sequence[int], finished: bool) -> str:
        if new_token_ids:
            self.data += self.tokenizer.decode_bytes(list(new_token_ids))
        if finished:
            text = self.final_text()
        else:
            text = self.data[:len(self.data) - incomplete_utf8_tail(self.data)].decode("utf-8", errors="replace")
            text = text[:max(len(text) - self.holdback, 0)]
        if len(text) <= len(self.emitted):
            return ""
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta

    def final_text(self) -> str:
        """The whole text, cut before the first stop string."""
        text = self.data.decode("utf-8", errors="replace")
        cuts = [i for s in self.stop_strings if (i := text.find(s)) >= 0]
        return text[:min(cuts)] if cuts else text
