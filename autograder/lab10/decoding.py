"""Exercises 4 and 5: constrained decoding on a model the judge holds.

    check_generate_json(generate_json)      greedy decoding under a JSON Schema's token masks: the tokens equal the
                                            reference's (`generate_constrained`) for four schemas on two models, one
                                            of which always prefers the end-of-text token (so a decoder that allows
                                            it where the document is not finished stops early)
    check_jump_forward(jump_forward_json)   the grammar's forced text taken as its own tokens (encoded alone), appended
                                            without a forward pass of their own: the same tokens as the reference,
                                            in the same forward passes (each pass's token count compared)

The model is the judge's: every forward pass the learner's loop makes is recorded where it runs (the tokens each
call feeds), and the tokens returned are compared with the reference's on the same model. The learner computes its
masks with the package's pieces (`compile_json_schema`, `TokenTrie`, `ContextCache`, its own Exercise 2 or the
package's `mask_by_trie`): the decoding loop is the exercise, and the package's `generate_constrained` is refused.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from autograder.lab10.common import DECODING_CASES, SCHEMAS, decoding_model, random_prompt, trie, vocabulary
from minigpt.model import GPT
from minigpt.structured import constrained
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.tokenizer import load_tokenizer

GENERATE_WHAT = "Exercise 4 (generate_json)"
JUMP_WHAT = "Exercise 5 (jump_forward_json)"
REFERENCES = (constrained.generate_constrained,)
MODELS = {"a small random model": dict(seed=5), "a model that always prefers the end token": dict(seed=6, eager_to_end=True),
          # every logit between -7e4 and -5e4: a refused token masked to a finite -1e4 beats every allowed one
          "a model whose logits all lie far below -1e4": dict(seed=7, logit_shift=-1e6)}


@functools.lru_cache(maxsize=None)
def _grammar_and_cache(name: str) -> tuple[Any, ContextCache]:
    grammar = compile_json_schema(SCHEMAS[name])
    return grammar, ContextCache(grammar, trie())


class _Passes:
    """The token count each forward call of `model` feeds, while open."""

    def __init__(self, model: GPT) -> None:
        self.sizes: list[int] = []
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        tokens = args[0] if args else kwargs.get("tokens")
        self.sizes.append(int(tokens.shape[-1]))

    def close(self) -> None:
        self.handle.remove()


def _reference(model: GPT, prompt: list[int], name: str, limit: int, *, jump: bool) -> tuple[list[int], list[int]]:
    grammar, cache = _grammar_and_cache(name)
    passes = _Passes(model)
    try:
        out = constrained.generate_constrained(model, prompt, grammar, trie(), max_new_tokens=limit,
                                               masks=cache.mask, forced=load_tokenizer().encode if jump else None,
                                               jump_forward=jump)
    finally:
        passes.close()
    return out.tokens, passes.sizes


def _learner(fn: Callable, what: str, model: GPT, prompt: list[int], name: str, limit: int,
             label: str = "") -> tuple[list[int], list[int]]:
    passes = _Passes(model)
    try:
        with no_calls_into(*REFERENCES, what=what):
            got = call_learner(what, fn, model, list(prompt), SCHEMAS[name], limit,
                               context=f"schema {name!r}, max_new_tokens={limit}, {label}" if label else "")
    finally:
        passes.close()
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
        raise AssertionError(f"{what}: return the generated token ids as a list of ints, got {type(got).__name__}")
    return list(got), passes.sizes


def _text(tokens: list[int]) -> str:
    texts = vocabulary().texts
    return "".join(texts[t] if 0 <= t < len(texts) and texts[t] is not None else "\ufffd" for t in tokens)


def _diagnose(got: list[int], want: list[int], name: str) -> str:
    eos = vocabulary().eos_id
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    done = _text(want[:i])
    if i == len(want) and len(got) > len(want):
        extra = got[i]
        if extra == eos:
            return "the end-of-text token ends the generation: stop there, without returning it"
        return (f"after {done!r} the reference chose the end-of-text token (allowed once the grammar accepts) and "
                f"stopped; you went on with {_text([extra])!r}")
    if i == len(got):
        return (f"you stopped after {done!r} ({i} tokens) where the reference went on with {_text([want[i]])!r}: "
                "the end-of-text token is allowed only where the grammar accepts; stop at it, where no token is "
                "allowed, or after max_new_tokens")
    grammar, cache = _grammar_and_cache(name)
    state = grammar.walk(grammar.start_state(), done)
    allowed = cache.mask(state) if state is not None else torch.zeros(len(vocabulary()), dtype=torch.bool)
    if got[i] == eos:
        return (f"after {done!r} you chose the end-of-text token, where the document is not finished: it is allowed "
                "only where the grammar accepts")
    if not 0 <= got[i] < len(allowed) or not allowed[got[i]]:
        return (f"after {done!r} you chose {_text([got[i]])!r}, which the grammar does not allow there: set the "
                "logits of every refused token to -inf before choosing, and move the grammar's state on by the "
                "text of every token taken")
    return (f"after {done!r} you chose {_text([got[i]])!r} where the reference chose {_text([want[i]])!r}: greedy "
            "takes the most likely token among the allowed ones")


def _check(fn: Callable, what: str, *, jump: bool) -> None:
    own_work(fn, REFERENCES, what=what)
    for m, (label, spec) in enumerate(MODELS.items()):
        model = decoding_model(**spec)
        for s, (name, limit) in enumerate(DECODING_CASES):
            prompt = random_prompt(10 * m + s)
            want, want_passes = _reference(model, prompt, name, limit, jump=jump)
            got, got_passes = _learner(fn, what, model, prompt, name, limit, label)
            where = f"{what}, schema {name!r} ({SCHEMAS[name]}), max_new_tokens={limit}, {label}"
            if got != want:
                raise AssertionError(f"{where}: generated {_text(got)!r}, expected {_text(want)!r}. "
                                     + _diagnose(got, want, name))
            if jump and got_passes != want_passes:
                raise AssertionError(
                    f"{where}: the right tokens, but your forward passes fed {got_passes} tokens each where "
                    f"jump-forward feeds {want_passes}: forced tokens take no pass of their own, they ride with the "
                    "next one (the prompt's pass or the last sampled token's)"
                    + (" (you ran one pass per token)" if len(got_passes) > len(want_passes) else ""))


def check_generate_json(generate_fn: Callable) -> None:
    """generate_fn(model, prompt, schema, max_new_tokens) -> token ids: greedy, each step's logits masked to the
    tokens the schema's grammar allows; the end-of-text token ends it (not returned)."""
    _check(generate_fn, GENERATE_WHAT, jump=False)


def check_jump_forward(jump_fn: Callable) -> None:
    """jump_fn(model, prompt, schema, max_new_tokens) -> token ids: as generate_json, but where the grammar forces
    text (`Grammar.forced_text`), its tokens (`encode(text)`, at most what max_new_tokens leaves) are appended
    without a forward pass of their own."""
    _check(jump_fn, JUMP_WHAT, jump=True)
