"""Lab 10 interview questions (numeric answers, computed here from the package; none is printed in the notebook)."""

from __future__ import annotations

import math
from typing import Any

from autograder.harness import check_answer
from autograder.lab10.common import vocabulary
from minigpt.structured.regex_automaton import RegexAutomaton

Q1_PATTERN = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"
Q1_VOCAB = 128_256                          # Llama 3's vocabulary
Q2_TEXT = '["Paris","Rome"]'
Q3 = dict(step_s=15e-3, mask_s=60e-6, threads=4)


def check_q1_index_bytes(answer: Any) -> None:
    """An Outlines-style index for Q1_PATTERN at Llama 3's vocabulary, one bit per token and live state: bytes."""
    states = len(RegexAutomaton.compile(Q1_PATTERN).live_states)
    row = math.ceil(Q1_VOCAB / 8)
    check_answer(answer, states * row, "Q1 (bytes of a mask index)",
                 {states * Q1_VOCAB: "one bit per token, not one byte (a bool tensor spends a byte; a bitmask 1/8); "
                                     "or the answer is in bits, not bytes",
                  states * Q1_VOCAB * 4: "one bit per token, not an int32 or a float32 (4 bytes) per token",
                  (states - 1) * row: "every live state needs its row, the start state and the accepting one included",
                  states * math.ceil(4096 / 8): "at Llama 3's vocabulary (128,256 tokens), not the course's"},
                 unit="bytes", hint="Rows = the automaton's live states (compile it and count); a row = one bit per "
                                    "token of the vocabulary, rounded up to whole bytes.")


def _spellings(text: str) -> int:
    """Token sequences of the course vocabulary whose texts concatenate to `text` (dynamic programming on prefixes)."""
    texts = [t for t in vocabulary().texts if t]
    ways = [1] + [0] * len(text)
    for end in range(1, len(text) + 1):
        ways[end] = sum(ways[end - len(t)] for t in texts if len(t) <= end and text.endswith(t, 0, end))
    return ways[-1]


def check_q2_tokenizations(answer: Any) -> None:
    """Token sequences of the course tokenizer that spell Q2_TEXT exactly: what a mask over any tokenization admits."""
    n = len(Q2_TEXT)
    check_answer(answer, _spellings(Q2_TEXT), "Q2 (token sequences that spell the document)",
                 {1: "that is the canonical tokenization alone; a character-level mask admits every split of the "
                     "text into vocabulary tokens",
                  2 ** (n - 1): "not every split of the text is a sequence of vocabulary tokens: count only splits "
                                "whose every piece is a token's text"},
                 unit="token sequences", hint="Count splits of the text into pieces that are token texts: ways[i] = "
                                              "sum of ways[i - len(t)] over tokens t that end the first i characters.")


def check_q3_hidden_batch(answer: Any) -> None:
    """Masks computed on CPU threads while the GPU runs the step: the largest batch whose masks still hide behind it."""
    q = Q3
    quotient = q["threads"] * q["step_s"] / q["mask_s"]
    right = math.floor(quotient + 1e-9)
    mistakes = {math.floor(q["step_s"] / q["mask_s"] + 1e-9): "the masks of a batch are independent: the 4 threads "
                                                                "share them",
                right + 1: "round down: one more sequence and the masks outlast the step"}
    if math.floor(quotient) < right:        # the exact quotient is whole; its double falls just below it
        mistakes[right - 1] = (f"floating point: {q['threads']} * {q['step_s']} / {q['mask_s']} is {quotient!r} in "
                               "doubles, so a plain floor loses one; the exact quotient is a whole number")
    check_answer(answer, right, "Q3 (largest batch whose masks hide behind the step)", mistakes,
                 unit="sequences", hint="Mask work per step = batch x time per mask, split over the threads; it hides "
                                        "while it is no longer than the GPU's step.")
