"""Exercises 1 and 2: which tokens may come next from a state of a regular expression's automaton.

    check_mask_by_scan(mask_by_scan)    every token's text walked from the state, for six patterns and every state
                                        along an example of each: the (V,) bool mask equal to the reference's; once
                                        on an automaton the judge holds, which counts the characters read: no fewer
                                        than a scan reads (a mask from the pattern or another library reads none)
    check_mask_by_trie(mask_by_trie)    the same masks from a walk of the token trie, and, on an automaton the
                                        judge holds and counts, exactly the characters a trie walk reads

The learner's function gets the automaton by value (the package's dataclass), and the vocabulary and the trie
built once where it runs (`held_where`: the trie took 0.4 s to send with each call), and returns a tensor; the
judge computes the right mask from its own copies. The counting automaton stays in the judge, which counts every
character it is asked to read. A learner whose Exercise 1 failed can go on: Exercise 2's check never uses the scan.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.remote import held_where
from autograder.harness import call_learner
from autograder.lab10.common import PATTERNS, automaton, describe, states_along, trie, vocabulary
from minigpt.structured import token_masks
from minigpt.structured.regex_automaton import CountingAutomaton

SCAN_WHAT = "Exercise 1 (mask_by_scan)"
TRIE_WHAT = "Exercise 2 (mask_by_trie)"
REFERENCES = (token_masks.mask_by_scan, token_masks.mask_by_trie, token_masks.MaskIndex)
# (pattern, prefix of its example): states whose trie walk reads few characters, where the judge counts them
COUNTED = [("date", ""), ("date", "2024-0"), ("boolean", "f"), ("email", "ada@mail."), ("decimal", "-12")]


def _as_mask(got: Any, where: str) -> torch.Tensor:
    size = len(vocabulary())
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{where}: return a torch.bool tensor of shape ({size},), got {type(got).__name__}")
    if got.dtype != torch.bool:
        raise AssertionError(f"{where}: return a torch.bool tensor (True: allowed), got dtype {got.dtype}")
    if tuple(got.shape) != (size,):
        raise AssertionError(f"{where}: expected shape ({size},), one entry a token, got {tuple(got.shape)}")
    return got


def _diagnose(got: torch.Tensor, want: torch.Tensor, name: str, state: int) -> str:
    """The likeliest mistake behind a wrong mask."""
    vocab, dfa = vocabulary(), automaton(name)
    eos = vocab.eos_id
    if bool(got[eos]) != bool(want[eos]):
        return (f"the end-of-text token (vocab.eos_id = {eos}) must be allowed exactly where the state accepts "
                f"(here it {'does' if want[eos] else 'does not'})")
    extra = [t for t in (got & ~want).nonzero().flatten().tolist()]
    missing = [t for t in (want & ~got).nonzero().flatten().tolist()]
    if extra:
        t = extra[0]
        text = vocab.texts[t]
        if text is None:
            return f"token {t} has no text (a special token or half a character): never allow it"
        if dfa.step(state, text[0]) is not None:
            return (f"token {t} {text!r} is allowed, but only its first character can be read from this state: the "
                    "automaton must read the token's whole text and still be live")
        return f"token {t} {text!r} is allowed, but the automaton cannot read it from this state"
    t = missing[0]
    text = vocab.texts[t]
    after = dfa.walk(state, text)
    if not dfa.accepting(after):
        return (f"token {t} {text!r} is missing: the automaton reads it and stays live (it does not accept yet, "
                "but a string of the language still begins so); a token may end in any live state, and it may run "
                "on past an accepting one")
    if len(text) > 1:
        return (f"token {t} {text!r} is missing: its text takes {len(text)} transitions; follow the automaton "
                "through every character of a token, not just the first")
    return f"token {t} {describe(text)} is missing ({len(missing)} tokens missing in all)"


def _compare(fn: Callable, what: str, structure: Callable[[], Any], reference: Callable) -> None:
    """The learner's masks against the reference's at every state along each pattern's example. `structure`: the
    vocabulary or the trie, built where fn runs for fn, and here for the reference."""
    theirs = held_where(fn, structure)
    for name in PATTERNS:
        dfa = automaton(name)
        for state in dict.fromkeys(states_along(name)):
            where = f"{what}, pattern {PATTERNS[name][0]!r}, state {state}"
            with no_calls_into(*REFERENCES, what=what):
                got = call_learner(what, fn, dfa, state, theirs)
            got = _as_mask(got, where)
            want = reference(dfa, state, structure())
            if not torch.equal(got, want):
                raise AssertionError(f"{where}: {int((got != want).sum())} tokens differ from the right mask; "
                                     + _diagnose(got, want, name, state))


def _counted(fn: Callable, what: str, name: str, prefix: str, structure: Callable[[], Any],
             reference: Callable) -> tuple[int, int]:
    """The learner's mask from an automaton the judge holds and counts: (characters it read, the reference's)."""
    dfa = automaton(name)
    state = dfa.walk(dfa.start, prefix)
    ours, theirs = CountingAutomaton(dfa), CountingAutomaton(dfa)
    want = reference(ours, state, structure())
    where = f"{what}, pattern {PATTERNS[name][0]!r} after {prefix!r}"
    with no_calls_into(*REFERENCES, what=what):
        got = call_learner(what, fn, theirs, state, held_where(fn, structure))
    if not torch.equal(_as_mask(got, where), want):
        raise AssertionError(f"{where}: the mask differs when the automaton is the judge's (use only its "
                             "step / walk / accepting methods)")
    if theirs.steps < ours.steps:
        raise AssertionError(f"{where}: your function read {theirs.steps} characters through the automaton where "
                             f"{'a scan' if reference is token_masks.mask_by_scan else 'a trie walk'} reads "
                             f"{ours.steps}: the mask must come from walking the automaton you are given (not from "
                             "its pattern, a precomputed table or another library)")
    return theirs.steps, ours.steps


def check_mask_by_scan(scan_fn: Callable) -> None:
    """scan_fn(dfa, state, vocab) -> (V,) bool: token t allowed iff dfa.walk(state, vocab.texts[t]) is live; the
    end token (vocab.eos_id) iff dfa.accepting(state); tokens without text never."""
    own_work(scan_fn, REFERENCES, what=SCAN_WHAT)
    _compare(scan_fn, SCAN_WHAT, vocabulary, token_masks.mask_by_scan)
    _counted(scan_fn, SCAN_WHAT, "boolean", "f", vocabulary, token_masks.mask_by_scan)


def check_mask_by_trie(trie_fn: Callable) -> None:
    """trie_fn(dfa, state, trie) -> the same mask, walking `trie` (a TokenTrie: children[node] = {char: child},
    ends[node] = token ids ending there) depth first, each shared prefix read once, dead subtrees dropped."""
    own_work(trie_fn, REFERENCES, what=TRIE_WHAT)
    _compare(trie_fn, TRIE_WHAT, trie, token_masks.mask_by_trie)
    for name, prefix in COUNTED:
        read, needed = _counted(trie_fn, TRIE_WHAT, name, prefix, trie, token_masks.mask_by_trie)
        if read > needed:
            raise AssertionError(
                f"{TRIE_WHAT}, pattern {PATTERNS[name][0]!r} after {prefix!r}: your walk read {read} characters "
                f"through the automaton; a trie walk reads {needed} (one step per trie edge out of a live node). Read "
                "each trie node's character once, carry the state down to its children, and do not descend where "
                "the automaton died" + (" (reading every token's text is the scan of Exercise 1)" if read > 4 * needed
                                        else ""))
