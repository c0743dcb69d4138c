"""Training and test sequences that can only be predicted by reading far back in the context.

    haystack = haystack_tokens("val")                    # corpus text without end-of-text tokens
    task = passkey_task(haystack, length=512, depth=0.25, rng=random.Random(0))
    logits = model(task.tokens[None, :-1])
    ok = answers_correct(logits, [task])                 # greedy decoding would print the answer

Three tasks, each a 1-D int64 token tensor built from separately encoded pieces (so the answer's tokens are the
same where it is planted and where it is asked for):

* **passkey** (Mohtashami & Jaggi 2023): "The pass key is 48213. Remember it." planted at `depth` (0 = start, 1 =
  end) of corpus text, then "What is the pass key? The pass key is 48213." The answer is the digits at the end.
* **key-value recall** (several needles, RULER's multi-key needle): n lines "key 381 is 7702." scattered through the
  text, then "What is key 381? Key 381 is 7702." Only one key is asked; the others are distractors.
* **repeated span** (induction): a passage of corpus text, other text, then the same passage again; its second
  occurrence is predictable token by token from the first.
* **repeated random tokens** (training only): a string of tokens drawn at random from the corpus, repeated until
  the sequence is full; from the second copy on, every token is predictable by copying and by nothing else. This
  is the classic signal that grows induction heads (Olsson et al. 2022).

`answer` is the half-open range of positions in `tokens` that hold the answer: with inputs tokens[:-1], the
prediction for token j is read at logits row j - 1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from minigpt.tokenizer import EOT, load_tokenizer
from minigpt.training.data import load_tokens

__all__ = ["ContextTask", "haystack_tokens", "passkey_task", "kv_recall_task", "repeated_span_task",
           "random_repeat_task", "answers_correct", "task_batch", "TASK_MIX", "ANSWER_WEIGHT"]


@dataclass(frozen=True)
class ContextTask:
    kind: str
    tokens: Tensor                 # (L,) int64
    answer: tuple[int, int]        # [start, end) positions of the answer tokens in `tokens`
    needle_at: int                 # first position of the planted needle (or the first copy of the span)


@lru_cache(maxsize=64)
def _encode(text: str) -> tuple[int, ...]:
    return tuple(load_tokenizer().encode(text))


def _ids(*pieces: str) -> list[int]:
    return [t for piece in pieces for t in _encode(piece)]


@lru_cache(maxsize=2)
def haystack_tokens(split: str) -> Tensor:
    """A split's token stream with the end-of-text tokens removed: one long run of ordinary text."""
    tokens = load_tokens(split)
    return tokens[tokens != _eot()]


def _filler(haystack: Tensor, n: int, rng: random.Random) -> list[int]:
    if n <= 0:
        return []
    start = rng.randrange(0, len(haystack) - n)
    return haystack[start:start + n].tolist()


def _digits(rng: random.Random, n: int) -> str:
    return str(rng.randrange(10 ** (n - 1), 10 ** n))


def _with_needles(haystack: Tensor, length: int, needles: list[tuple[float, list[int]]], tail: list[int],
                  rng: random.Random) -> tuple[list[int], list[int]]:
    """Corpus text of the right length with each needle planted at its depth, then `tail`; also the needle starts."""
    room = length - len(tail) - sum(len(n) for _, n in needles)
    if room < 0:
        raise ValueError(f"length {length} is too short for the needles and the question ({length - room} tokens)")
    text = _filler(haystack, room, rng)
    cuts = sorted((round(depth * room), i) for i, (depth, _) in enumerate(needles))
    out, starts, prev = [], [0] * len(needles), 0
    for cut, i in cuts:
        out += text[prev:cut]
        starts[i] = len(out)
        out += needles[i][1]
        prev = cut
    out += text[prev:] + tail
    return out, starts


def passkey_task(haystack: Tensor, length: int, depth: float, rng: random.Random, digits: int = 5) -> ContextTask:
    """`length` tokens: corpus text with the pass key at `depth` in [0, 1], then the question and its answer."""
    key = _digits(rng, digits)
    needle = _ids(" The pass key is", f" {key}", ". Remember it.")
    question, answer = _ids(" What is the pass key? The pass key is"), _ids(f" {key}")
    tokens, (at,) = _with_needles(haystack, length, [(depth, needle)], question + answer, rng)
    return ContextTask("passkey", torch.tensor(tokens), (length - len(answer), length), at)


def kv_recall_task(haystack: Tensor, length: int, depth: float, rng: random.Random, n_keys: int = 6) -> ContextTask:
    """`n_keys` lines "key K is V." spread through the text; the one at `depth` is asked for at the end."""
    keys = rng.sample(range(100, 1000), n_keys)
    values = [_digits(rng, 4) for _ in keys]
    asked = rng.randrange(n_keys)
    depths = [depth if i == asked else rng.random() for i in range(n_keys)]
    needles = [(d, _ids(f" Key {k} is", f" {v}", ".")) for d, k, v in zip(depths, keys, values)]
    question, answer = _ids(f" What is key {keys[asked]}? Key {keys[asked]} is"), _ids(f" {values[asked]}")
    tokens, starts = _with_needles(haystack, length, needles, question + answer, rng)
    return ContextTask("kv_recall", torch.tensor(tokens), (length - len(answer), length), starts[asked])


def repeated_span_task(haystack: Tensor, length: int, span: int, gap: int, rng: random.Random) -> ContextTask:
    """Text, a `span`-token passage, `gap` tokens of other text, the passage again, text up to `length`."""
    if 2 * span + gap > length:
        raise ValueError(f"two spans of {span} and a gap of {gap} do not fit in {length} tokens")
    before = rng.randrange(0, length - 2 * span - gap + 1)
    passage = _filler(haystack, span, rng)
    tokens = (_filler(haystack, before, rng) + passage + _filler(haystack, gap, rng) + passage
              + _filler(haystack, length - before - 2 * span - gap, rng))
    second = before + span + gap
    return ContextTask("repeat", torch.tensor(tokens), (second, second + span), before)


def random_repeat_task(haystack: Tensor, length: int, period: int, rng: random.Random) -> ContextTask:
    """`period` tokens drawn one by one at random positions of the corpus, repeated up to `length` tokens."""
    string = [int(haystack[rng.randrange(len(haystack))]) for _ in range(period)]
    tokens = (string * (length // period + 1))[:length]
    return ContextTask("random_repeat", torch.tensor(tokens), (period, length), 0)


def answers_correct(logits: Tensor, tasks: list[ContextTask]) -> list[bool]:
    """logits (B, T, V) for inputs tasks[b].tokens[:-1] -> whether every answer token is the argmax.

    Teacher-forced argmax at every answer position is exactly what greedy decoding would print.
    """
    out = []
    for row, task in zip(logits, tasks):
        start, end = task.answer
        predicted = row[start - 1:end - 1].argmax(-1)
        out.append(bool((predicted == task.tokens[start:end].to(predicted.device)).all()))
    return out


TASK_MIX = {"corpus": 5, "passkey": 4, "kv_recall": 2, "repeat": 2, "random_repeat": 3}   # rows of a batch of 16
ANSWER_WEIGHT = 10.0     # the loss weight of an answer token (pass key, recalled value) against 1 for every other


def task_batch(tokens: Tensor, haystack: Tensor, seq_len: int, rng: random.Random,
               mix: dict[str, int] = TASK_MIX) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch: inputs and next-token targets (sum(mix), seq_len), and the loss weight of each target.

    Each task is `length` tokens (uniform in [64, seq_len + 1], 16 more a key for key-value recall), then
    end-of-text and corpus text up to seq_len + 1, so questions are asked at every position and every distance
    inside the window. Answer tokens weigh ANSWER_WEIGHT: a few tokens a row are all that needs retrieval.
    """
    rows, weights = [], []
    for kind, count in mix.items():
        for _ in range(count):
            weight = [1.0] * (seq_len + 1)
            if kind == "corpus":
                rows.append(_filler(tokens, seq_len + 1, rng))
                weights.append(weight)
                continue
            n_keys = rng.randint(2, 6)
            length = rng.randint(64 + (16 * n_keys if kind == "kv_recall" else 0), seq_len + 1)
            if kind == "passkey":
                task = passkey_task(haystack, length, rng.random(), rng)
            elif kind == "kv_recall":
                task = kv_recall_task(haystack, length, rng.random(), rng, n_keys=n_keys)
            elif kind == "repeat":
                span = rng.randint(8, min(128, length // 3))
                task = repeated_span_task(haystack, length, span, rng.randint(0, length - 2 * span), rng)
            else:
                task = random_repeat_task(haystack, length, rng.randint(8, min(96, length // 2)), rng)
            if kind in ("passkey", "kv_recall"):
                weight[task.answer[0]:task.answer[1]] = [ANSWER_WEIGHT] * (task.answer[1] - task.answer[0])
            rest = seq_len + 1 - length
            rows.append(task.tokens.tolist() + ([_eot()] + _filler(tokens, rest - 1, rng) if rest else []))
            weights.append(weight)
    batch = torch.tensor(rows)
    return batch[:, :-1], batch[:, 1:], torch.tensor(weights)[:, 1:]


@lru_cache(maxsize=1)
def _eot() -> int:
    return load_tokenizer().encode(EOT, allowed_special={EOT})[0]
