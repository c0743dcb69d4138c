"""Lab 06, exercise 7: drafting a chain with a draft head (draft_chain), on the judge's cache."""

from __future__ import annotations

from typing import Callable

import torch

from autograder.harness import call_learner
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.lab06.common import drawn_seeds, where_it_runs
from minigpt.config import ModelConfig
from minigpt.engine.draft_head import DraftHead, head_cache, target_features
from minigpt.engine.head_speculative import draft_chain
from minigpt.model import GPT

# Greedy drafts are compared only where the head's two likeliest tokens are at least this far apart in logits, so
# that the order of a float sum cannot decide the verdict.
CLEAR_GAP = 1e-2


def tiny_target_and_head(seed: int) -> tuple[GPT, DraftHead]:
    """A small random target with peaked logits and a random head for it (seeded; the global RNG left as it was)."""
    cfg = ModelConfig(vocab_size=64, max_seq_len=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = GPT(cfg).eval()
        head = DraftHead(cfg).eval()
    with torch.no_grad():
        target.tok_emb.weight.mul_(20)            # tied: peaked logits, and embeddings the head's fc can tell apart
        head.fc.weight.mul_(4)
    return target, head


def _reference(target: GPT, head: DraftHead, prompt: list[int], read: int, k: int):
    """The reference chain on a head cache holding the prompt's first pairs: (drafts, cache, logits of each draft)."""
    with torch.inference_mode():
        f, _ = target_features(target, torch.tensor([prompt]))
        cache = head_cache(head, 64)
        before = len(prompt) - 1 - read             # pairs (f_{t-1}, x_t), t = 1..len - 1; the last `read` pending
        if before:
            head(f[:, :before], torch.tensor([prompt[1:1 + before]]), target, torch.arange(1, 1 + before), cache)
        margins = []
        x, feats = torch.tensor([prompt[1 + before:]]), f[:, before:len(prompt) - 1]
        for _ in range(k):
            predicted, logits = head(feats, x, target, cache.length + 1 + torch.arange(x.shape[1]), cache)
            top = logits[0, -1].float().topk(2).values
            margins.append(float(top[0] - top[1]))
            feats, x = predicted[:, -1:], logits[:, -1:].argmax(-1)
        return f, margins


def check_draft_chain(fn: Callable) -> None:
    """fn(head, target, cache, features (m, d), tokens (m,), k) -> k greedy draft tokens; the cache then holds the m
    pairs read and the k - 1 drafts fed back."""
    what = "Exercise 7 (draft_chain)"
    own_work(fn, draft_chain, what=what)
    cases = _chain_cases(fn)                    # the expected answers, made before the learner's code runs
    with no_calls_into(draft_chain, what=what):
        _check_draft_chain(fn, what, cases)


def _chain_cases(fn: Callable) -> list[tuple]:
    """(seed, target, head, prompt, features, pairs in the cache, pairs pending, k, drafts, reference cache)."""
    seeds = drawn_seeds(fn)
    out = []
    cases = [(3, 4, 12), (1, 1, 9), (4, 6, 20), (2, 0, 7)]          # (pairs pending, k, prompt length)
    for read, k, length in cases:
        for seed in seeds:
            target, head = tiny_target_and_head(seed % 2 ** 31)
            g = torch.Generator().manual_seed(seed % 2 ** 31)
            prompt = torch.randint(0, target.config.vocab_size, (length,), generator=g).tolist()
            f, margins = _reference(target, head, prompt, read, k)
            if all(m > CLEAR_GAP for m in margins):
                break
        ref_cache = head_cache(head, 64)
        before = length - 1 - read
        with torch.inference_mode():
            if before:
                head(f[:, :before], torch.tensor([prompt[1:1 + before]]), target, torch.arange(1, 1 + before), ref_cache)
            want = draft_chain(head, target, ref_cache, f[0, before:length - 1], prompt[1 + before:], k)
        out.append((seed, target, head, prompt, f, before, read, k, want, ref_cache))
    return out


def _check_draft_chain(fn: Callable, what: str, cases: list) -> None:
    for seed, target, head, prompt, f, before, read, k, want, ref_cache in cases:
        length = len(prompt)
        cache = head_cache(head, 64)
        with torch.inference_mode():
            if before:
                head(f[:, :before], torch.tensor([prompt[1:1 + before]]), target, torch.arange(1, 1 + before), cache)
        kernel_target, kernel_head = where_it_runs(fn, tiny_target_and_head, seed % 2 ** 31, here=(target, head))
        call = (f"{what}: draft_chain(head, target, cache, features, tokens, k={k}) with {read} pair(s) not yet read "
                f"after {before} in the cache")
        got = call_learner(call, fn, kernel_head, kernel_target, cache, f[0, before:length - 1].clone(),
                           list(prompt[1 + before:]), k)
        try:
            got = [int(t) for t in got]
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{call}: return the k draft tokens as a list of ints, got {got!r:.200}") from None
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise AssertionError(
                f"{call}: drafts {got}, expected {want} (first difference at draft {first + 1}). Feed the pending pairs "
                "(features, tokens) at positions cache.length + 1, ...; each draft is the argmax of the head's last "
                "logits; the next input is the head's own predicted feature with the token just drafted, at the next "
                "position, through the cache")
        want_len = ref_cache.length
        if cache.length != want_len:
            raise AssertionError(f"{call}: the head's cache holds {cache.length} positions after the call, expected "
                                 f"{want_len}: the {read} pair(s) read and the {max(k - 1, 0)} draft(s) fed back "
                                 "(the last draft is never fed), each read once through the cache")
        if not torch.allclose(cache[0].k[:, :want_len], ref_cache[0].k[:, :want_len], atol=1e-4, rtol=1e-4):
            raise AssertionError(f"{call}: the head's cache holds other keys than the drafts should have written: "
                                 "feed the head its predicted feature (not the target's last one) with each draft")
