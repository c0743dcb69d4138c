"""Train a byte-level BPE vocabulary and write it in tiktoken's rank-file format.

Byte-level BPE starts from the 256 single bytes (rank = byte value) and repeatedly merges the most
frequent adjacent pair of tokens into a new token whose rank is the next integer. The text is first
split into chunks by a regular expression (words, numbers, punctuation, whitespace runs), and merges
never cross a chunk boundary. tiktoken encodes with exactly these ranks.

Run `python -m minigpt.training.bpe` to retrain data/tokenizer/minigpt-4k.tiktoken from the training split.
"""

from __future__ import annotations

import base64
import heapq
from collections import Counter, defaultdict
from pathlib import Path

import regex

from minigpt.paths import data_dir
from minigpt.tokenizer import N_RANKS, SPLIT_PATTERN, TOKENIZER_FILE


def train_bpe(text: str, n_merges: int, separator: str = "<|endoftext|>") -> dict[bytes, int]:
    """Learn `n_merges` merges from `text`; return {token bytes: rank} with 256 + n_merges entries.

    Ties between equally frequent pairs go to the pair with the smaller token ids, so training is
    deterministic.
    """
    pattern = regex.compile(SPLIT_PATTERN)
    chunk_counts: Counter[bytes] = Counter()
    for document in text.split(separator):
        chunk_counts.update(m.encode("utf-8") for m in pattern.findall(document))

    words = [list(chunk) for chunk in chunk_counts]            # token ids of each distinct chunk
    freqs = list(chunk_counts.values())
    pair_counts: Counter[tuple[int, int]] = Counter()
    pair_words: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for w, ids in enumerate(words):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += freqs[w]
            pair_words[pair].add(w)

    heap = [(-c, pair) for pair, c in pair_counts.items()]
    heapq.heapify(heap)
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < 256 + n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count or neg_count == 0:
            continue                                            # stale heap entry
        new_id = len(vocab)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        changed: set[tuple[int, int]] = set()
        for w in list(pair_words[pair]):
            ids, f = words[w], freqs[w]
            for old in zip(ids, ids[1:]):
                pair_counts[old] -= f
                changed.add(old)
                pair_words[old].discard(w)
            words[w] = ids = _merge(ids, pair, new_id)
            for new in zip(ids, ids[1:]):
                pair_counts[new] += f
                changed.add(new)
                pair_words[new].add(w)
        for p in changed:
            if pair_counts[p] > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
            else:
                pair_counts.pop(p, None)
    return {token: rank for rank, token in enumerate(vocab)}


def _merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def write_ranks(ranks: dict[bytes, int], path: Path) -> None:
    """tiktoken's rank file: one `base64(token) rank` line per token, in rank order."""
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    text = (data_dir() / "corpus" / "train.txt").read_text(encoding="utf-8")
    ranks = train_bpe(text, n_merges=N_RANKS - 256)
    out = data_dir() / "tokenizer" / TOKENIZER_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    write_ranks(ranks, out)
    print(f"wrote {len(ranks)} ranks to {out}")


if __name__ == "__main__":
    main()
