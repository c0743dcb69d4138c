"""minigpt.structured.token_cache: the masks made from cached rule positions (plus the uncertain tokens checked
against the whole stack) equal the trie walk's, at every step of seeded random paths, at any segment depth; a deeper
segment leaves fewer tokens to check."""

from __future__ import annotations

import random

import pytest
import torch

from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import mask_by_trie
from tests.minigpt.test_structured_json import DOCUMENTS


def _walk(grammar, trie, cache, seed, paths=2, steps=24):
    """Masks along seeded random paths; each compared with the trie walk's."""
    rng = random.Random(seed)
    vocab = trie.vocab
    for _ in range(paths):
        state = grammar.start_state()
        for _ in range(steps):
            want = mask_by_trie(grammar, state, trie)
            assert torch.equal(cache.mask(state), want)
            choices = [t for t in torch.nonzero(want).flatten().tolist() if t != vocab.eos_id]
            if not choices:
                break
            state = grammar.walk(state, vocab.texts[rng.choice(choices)])


@pytest.mark.parametrize("frames", [1, 2, 3])
@pytest.mark.parametrize("name", DOCUMENTS)
def test_cached_masks_equal_the_trie_walk(name, frames, trie):
    grammar = compile_json_schema(DOCUMENTS[name][0])
    _walk(grammar, trie, ContextCache(grammar, trie, frames=frames), seed=name, paths=1 if name == "person" else 2)


def test_deeper_segments_leave_fewer_tokens_to_check(trie):
    grammar = compile_json_schema(DOCUMENTS["person"][0])
    shares = []
    for frames in (1, 3):
        cache = ContextCache(grammar, trie, frames=frames)
        _walk(grammar, trie, cache, seed="share", paths=1)
        shares.append(cache.stats.checked_share)
        assert cache.stats.segments == len(cache.entries) and cache.nbytes == 2 * len(cache.entries) * len(trie.vocab)
    assert shares[1] < shares[0]
