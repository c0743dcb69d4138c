"""The course tokenizer: a 4096-token byte-level BPE (data/tokenizer/minigpt-4k.tiktoken) as a tiktoken Encoding.

    >>> enc = load_tokenizer()
    >>> ids = enc.encode("def f(x):\n    return x\n")
    >>> enc.decode(ids)
    'def f(x):\n    return x\n'

Ranks 0..4094 come from the rank file (0..255 are single bytes); id 4095 is `<|endoftext|>`.
Any UTF-8 string round-trips exactly. `tokenizer_for(name_or_path)` picks a model's tokenizer: this one for
the course's checkpoints, its tokenizer.json (`minigpt.hf.HFTokenizer`, same calls) for a Hugging Face
folder; `stop_token_ids(tokenizer)` are the ids that end a reply. To use OpenAI's encodings instead (needs a network or a filled
tiktoken cache, TIKTOKEN_CACHE_DIR): `tiktoken.get_encoding("cl100k_base")`; the course models,
however, only understand this vocabulary.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

from minigpt.paths import data_dir

TOKENIZER_FILE = "minigpt-4k.tiktoken"
# Chunking rule: contractions, identifiers (letters and underscores) with an optional leading space,
# numbers of at most 3 digits, punctuation runs, newline runs (with the indentation before them), and
# other whitespace runs that leave the last space to the next word.
SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?[\p{L}_]+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}_]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
N_RANKS = 4095                      # mergeable tokens; the special token takes the next id
EOT = "<|endoftext|>"
EOT_ID = N_RANKS
VOCAB_SIZE = N_RANKS + 1


class TokenizerFileError(ValueError):
    """The rank file is missing or does not parse."""


def read_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file, naming the first bad line if it does not parse."""
    if not path.exists():
        raise TokenizerFileError(f"tokenizer file {path} not found; run `make data` (or `python -m minigpt.training.bpe`) to create it")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as err:
            raise TokenizerFileError(
                f"{path}:{lineno} is not a tiktoken rank line ('<base64 token> <rank>'): {line[:60]!r}; "
                "the file is corrupt, restore it from git or retrain with `python -m minigpt.training.bpe`") from err
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerFileError(f"{path}: ranks are not 0..{len(ranks) - 1} without gaps; the file is corrupt")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise TokenizerFileError(f"{path}: some single bytes have no rank, so not every string could be encoded")
    return ranks


@lru_cache(maxsize=None)
def _load(path: str) -> tiktoken.Encoding:
    ranks = read_ranks(Path(path))
    return tiktoken.Encoding(name="minigpt-4k", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})


def load_tokenizer(path: str | Path | None = None) -> tiktoken.Encoding:
    """Load the course tokenizer (cached). `enc.eot_token` is the end-of-text id."""
    return _load(str(path or data_dir() / "tokenizer" / TOKENIZER_FILE))


def tokenizer_for(name_or_path: str | Path = "target") -> Any:
    """The tokenizer of a model: the course's for "target", "draft" or a .safetensors path; an HF folder's own
    tokenizer.json (`minigpt.hf.HFTokenizer`) for a Hugging Face model folder."""
    from minigpt.hf.loading import is_hf_folder
    if is_hf_folder(name_or_path):
        from minigpt.hf.tokenizer import HFTokenizer
        return HFTokenizer.from_folder(name_or_path)
    return load_tokenizer()


def stop_token_ids(tokenizer: Any | None) -> tuple[int, ...]:
    """The ids that end a reply: an HF tokenizer's `eos_token_ids`, else tiktoken's `eot_token` (the course's EOT_ID)."""
    if tokenizer is None:
        return (EOT_ID,)
    ids = getattr(tokenizer, "eos_token_ids", None)
    return tuple(ids) if ids else (int(tokenizer.eot_token),)
