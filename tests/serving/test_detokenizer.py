"""Incremental detokenization: the deltas concatenate to exactly the final text, whatever the token boundaries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.serving.detokenizer import IncrementalDetokenizer, incomplete_utf8_tail


@settings(max_examples=200, deadline=None, derandomize=True)
@given(ids=st.lists(st.integers(0, 4094), max_size=40), data=st.data())
def test_deltas_concatenate_to_the_decoded_text(tokenizer, ids, data):
    """Any token ids (byte tokens included, so invalid and split UTF-8), fed in random groups."""
    detok = IncrementalDetokenizer(tokenizer)
    parts, i = [], 0
    while i < len(ids):
        n = data.draw(st.integers(1, 3))
        parts.append(detok.step(ids[i:i + n], finished=False))
        assert "\ufffd" not in parts[-1] or "\ufffd" in tokenizer.decode(ids[:i + n])
        i += n
    parts.append(detok.step([], finished=True))
    assert "".join(parts) == tokenizer.decode(ids)


def test_split_emoji_is_held_back_until_complete(tokenizer):
    data = "a🙂b".encode()
    byte_ids = [tokenizer.encode_single_token(bytes([b])) for b in data]
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.step([t], finished=False) for t in byte_ids]
    assert deltas == ["a", "", "", "", "🙂", "b"]
    assert incomplete_utf8_tail("🙂".encode()[:3]) == 3 and incomplete_utf8_tail(b"ab") == 0


def test_stop_string_is_left_out_and_held_back(tokenizer):
    """As the engine uses it: tokens until the stop string shows up in the text (StopRule), then finished."""
    ids = tokenizer.encode("one two\n\nUser: three")
    detok = IncrementalDetokenizer(tokenizer, stop_strings=("\n\nUser:",))
    parts = []
    for i, t in enumerate(ids):
        done = "\n\nUser:" in tokenizer.decode(ids[:i + 1])
        parts.append(detok.step([t], finished=done))
        if done:
            break
        assert "\n\nU" not in "".join(parts)             # a possible start of the stop string is held back
    assert "".join(parts) == "one two"
