"""An HF `tokenizer.json` (through the `tokenizers` library) behind the interface the course's engines call.

    tok = HFTokenizer.from_folder(folder)        # tokenizer.json, tokenizer_config.json, config + generation_config
    ids = tok.encode("Hello")                    # like transformers: BOS added if the tokenizer adds one
    tok.decode_bytes(ids)                        # exact bytes (incremental detokenization cuts UTF-8 safely)
    tok.eos_token_ids                            # every id that ends a reply (config.json + generation_config.json)

The engines, stop rules and the server were written against tiktoken's `Encoding` (encode, decode,
decode_bytes, eot_token, n_vocab); this class offers the same calls, so they run unchanged. Two
differences, both transformers' behaviour: text naming a special token ("<|eot_id|>") is encoded as that
token (chat templates rely on it), and special tokens decode to nothing (vLLM's skip_special_tokens).

Bytes of a token: byte-level vocabularies (GPT-2 style: Llama 3, SmolLM2) spell each byte with one
printable character (`byte_to_unicode`); SentencePiece-style ones (Llama 2, TinyLlama, Mistral) write
a space as "▁" and fall back to byte tokens "<0xE2>".
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from minigpt.hf.config import eos_ids_from

__all__ = ["HFTokenizer", "byte_to_unicode", "read_json"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are
    spelled by the code points 256, 257, ... in byte order (so no token string holds a space or control)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def _decoder_kinds(decoder: dict[str, Any] | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {d.get("type") for d in decoder.get("decoders", [])}
    return {decoder.get("type")}


class HFTokenizer:
    """tiktoken-like calls over a `tokenizers.Tokenizer` (see the module docstring)."""

    def __init__(self, tokenizer: Any, *, eos_token_ids: Sequence[int], bos_token: str | None = None,
                 eos_token: str | None = None, chat_template: str | None = None, name: str = "hf") -> None:
        if not eos_token_ids:
            raise ValueError("the model names no end-of-sequence token (eos_token_id in config.json or "
                             "generation_config.json, or eos_token in tokenizer_config.json)")
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.bos_token, self.eos_token, self.chat_template, self.name = bos_token, eos_token, chat_template, name
        self._bytes = self._token_bytes()

    @classmethod
    def from_folder(cls, folder: str | Path) -> "HFTokenizer":
        """Read tokenizer.json (required), tokenizer_config.json, chat_template.jinja, config.json and
        generation_config.json of an HF model folder."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{folder} has no tokenizer.json (only the fast-tokenizer file is read; "
                                    "save it with transformers' tokenizer.save_pretrained)")
        tok = Tokenizer.from_file(str(path))
        cfg = read_json(folder / "tokenizer_config.json")
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        if isinstance(template, list):          # several named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja = folder / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text(encoding="utf-8")
        eos_ids = eos_ids_from(read_json(folder / "generation_config.json"), read_json(folder / "config.json"))
        if not eos_ids and eos is not None and tok.token_to_id(eos) is not None:
            eos_ids = (tok.token_to_id(eos),)
        return cls(tok, eos_token_ids=eos_ids, bos_token=bos, eos_token=eos, chat_template=template, name=folder.name)

    # --- the tiktoken-style interface ----------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def eot_token(self) -> int:
        """The first end-of-sequence id (tiktoken's name for it)."""
        return self.eos_token_ids[0]

    def encode(self, text: str, *, allowed_special: object = (), disallowed_special: object = ()) -> list[int]:
        """Token ids of `text`, with the tokenizer's own special tokens (BOS) added as transformers does.
        The tiktoken arguments are accepted and ignored: special-token text is always that token."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text` without added special tokens (no BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of the tokens (special tokens give none); may end inside a UTF-8 character."""
        try:
            return b"".join(self._bytes[int(i)] for i in ids)
        except IndexError:
            bad = next(int(i) for i in ids if not 0 <= int(i) < len(self._bytes))
            raise ValueError(f"token id {bad} is outside the tokenizer's vocabulary [0, {len(self._bytes)})") from None

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # --- building the byte table -------------------------------------------------------------------

    def _token_bytes(self) -> list[bytes]:
        spec = json.loads(self.tokenizer.to_str())
        kinds = _decoder_kinds(spec.get("decoder"))
        added = {a["id"]: a for a in spec.get("added_tokens", [])}
        from_char = {c: b for b, c in byte_to_unicode().items()}
        table = []
        for i in range(self.n_vocab):
            s = self.tokenizer.id_to_token(i)
            if s is None or added.get(i, {}).get("special"):
                table.append(b"")
            elif i in added:
                table.append(s.encode())
            elif "ByteLevel" in kinds and all(c in from_char for c in s):
                table.append(bytes(from_char[c] for c in s))
            elif "ByteFallback" in kinds and (m := _BYTE_TOKEN.fullmatch(s)):
                table.append(bytes([int(m.group(1), 16)]))
            else:
                table.append(s.replace("▁", " ").encode())
        return table
