"""The course tokenizer: exact round trips, the special token, clear errors for broken files."""

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.tokenizer import EOT, EOT_ID, VOCAB_SIZE, TokenizerFileError, load_tokenizer


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(text):
    enc = load_tokenizer()
    assert enc.decode(enc.encode(text, disallowed_special=())) == text


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_round_trip_any_utf8_bytes_as_text(raw):
    text = raw.decode("utf-8", errors="replace")
    enc = load_tokenizer()
    assert enc.decode(enc.encode(text, disallowed_special=())) == text


def test_vocabulary_and_special_token():
    enc = load_tokenizer()
    assert enc.n_vocab == VOCAB_SIZE == 4096
    assert enc.eot_token == EOT_ID == 4095
    assert enc.encode(EOT, allowed_special={EOT}) == [EOT_ID]
    with pytest.raises(ValueError):
        enc.encode(EOT)          # tiktoken refuses special text unless allowed


def test_code_compresses():
    enc = load_tokenizer()
    source = "    def __init__(self, name: str) -> None:\n        self.name = name\n"
    assert len(enc.encode(source)) < len(source.encode()) / 2.5


def test_missing_file(tmp_path):
    with pytest.raises(TokenizerFileError, match="not found"):
        load_tokenizer(tmp_path / "nope.tiktoken")


def test_corrupt_file_names_the_line(tmp_path):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines[10] = "this is not base64!! 10"
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("\n".join(lines))
    with pytest.raises(TokenizerFileError, match=r"bad.tiktoken:11"):
        load_tokenizer(bad)


def test_file_missing_byte_tokens(tmp_path):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(200)]
    partial = tmp_path / "partial.tiktoken"
    partial.write_text("\n".join(lines))
    with pytest.raises(TokenizerFileError, match="single bytes"):
        load_tokenizer(partial)
