"""What lab 10's checks share: the course vocabulary and its trie, the regular expressions the mask checks use, the
schemas and small models the decoding checks run."""

from __future__ import annotations

import functools

import torch

from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.structured.regex_automaton import RegexAutomaton
from minigpt.structured.token_masks import TokenTrie, Vocabulary
from minigpt.tokenizer import load_tokenizer

# name -> (pattern, a string of its language: the states along it are the ones checked)
PATTERNS = {
    "date": (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-06-30"),
    "boolean": (r"(true|false)", "false"),
    "email": (r"[a-z]+@[a-z]+\.(com|org)", "ada@mail.org"),
    "decimal": (r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", "-12.05"),
    "quoted": (r'"[^"\\]{0,12}"', '"once upon"'),
    "words": (r"( [a-z]+){1,3}\.", " the cat sat."),
}


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    return Vocabulary.from_tokenizer(load_tokenizer())


@functools.lru_cache(maxsize=1)
def trie() -> TokenTrie:
    return TokenTrie(vocabulary())


@functools.lru_cache(maxsize=None)
def automaton(name: str) -> RegexAutomaton:
    return RegexAutomaton.compile(PATTERNS[name][0])


def states_along(name: str) -> list[int]:
    """The start state and the state after each prefix of the pattern's example, each once."""
    dfa, example = automaton(name), PATTERNS[name][1]
    states = [dfa.walk(dfa.start, example[:i]) for i in range(len(example) + 1)]
    return list(dict.fromkeys(s for s in states if s is not None))


def describe(text: str | None) -> str:
    return "(no text)" if text is None else repr(text)


# Decoding: schemas whose documents end within a few dozen tokens whatever the model prefers.
SCHEMAS = {
    "flags": {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["ok", "n"]},
    "shirt": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "size": {"type": "integer", "minimum": 1, "maximum": 12},
                                               "tag": {"type": "string", "maxLength": 4}},
              "required": ["color"]},
    "count": {"type": "integer", "minimum": -50, "maximum": 5000},
    "bits": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    # two characters no token of the course vocabulary spells alone: after '{"s":"' no token is allowed
    "unwritable": {"type": "object", "properties": {"s": {"enum": ["\u2603", "\u2604"]}}, "required": ["s"]},
}
MAX_NEW_TOKENS = 32
# (schema, max_new_tokens): every schema to its end, then two cut short, one of them in the middle of forced text
DECODING_CASES = [(name, MAX_NEW_TOKENS) for name in SCHEMAS] + [("flags", 7), ("shirt", 5)]


def decoding_model(seed: int, *, eager_to_end: bool = False, logit_shift: float = 0.0, d_model: int = 64,
                   n_layers: int = 2, n_kv_heads: int = 2, d_ff: int = 128, max_seq_len: int = 96) -> GPT:
    """A small random model on the course vocabulary (4 heads; the checks use the default shape, the mutation
    contract draws others). `eager_to_end`: the end-of-text token has the largest logit at every step (one
    residual channel is constant and only the end token's head row reads it), so a decoder that allows it anywhere
    the grammar does not accept stops there. `logit_shift` < 0 moves every logit down by about |logit_shift|
    (every head row reads that channel)."""
    cfg = ModelConfig(vocab_size=len(vocabulary()), max_seq_len=max_seq_len, d_model=d_model, n_layers=n_layers,
                      n_heads=4, n_kv_heads=n_kv_heads, d_ff=d_ff, tie_embeddings=False)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim == 2 else 0.1) + (1.0 if p.ndim == 1 else 0.0))
        if eager_to_end or logit_shift:
            model.tok_emb.weight[:, 0] = 4.0
            for block in model.layers:
                block.attn.wo.weight[0] = 0.0
                block.mlp.w_down.weight[0] = 0.0
            model.lm_head.weight[:, 0] += logit_shift / 4.0
            if eager_to_end:
                model.lm_head.weight[vocabulary().eos_id] = 0.0
                model.lm_head.weight[vocabulary().eos_id, 0] = 50.0
    return model


def random_prompt(seed: int, length: int = 5) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=g).tolist()
