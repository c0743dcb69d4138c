"""Speculative decoding (lab 06): a cheap drafter proposes k tokens, the target checks them in one forward.

One round, after a context x of L tokens:

    draft    t_i ~ q_i = q(. | x, t_1..t_{i-1})                for i = 1..k     (k cheap steps)
    verify   p_i = p(. | x, t_1..t_{i-1})                      for i = 1..k+1   (ONE target forward, k+1 positions)
    accept   t_i with probability min(1, p_i(t_i) / q_i(t_i)), in order, until the first rejection;
    reject   at i: emit one token from the residual r = max(0, p_i - q_i) / sum_x max(0, p_i - q_i)(x);
    bonus    all k accepted: emit one more token from p_{k+1}.

Each emitted token has exactly the target's distribution (Leviathan et al. 2023; Chen et al. 2023):
P(emit x) = q(x) min(1, p(x)/q(x)) + P(reject) r(x) = min(p, q)(x) + max(0, p - q)(x) = p(x),
since P(reject) = 1 - sum_y min(p, q)(y) = sum_y max(0, p - q)(y) is exactly r's normaliser.

Temperature, top-k and top-p go into both p and q (`sampling_probs`): the guarantee is about the
distribution the target samples from, which is the filtered one; and the q in the ratio must be the
distribution the draft token was really drawn from. Greedy (temperature 0) is the same rule with one-hot
p and q: accept while the draft token is the target's argmax, replace the first mismatch by the
target's argmax; the output is the target's greedy output.

Caches: after a round in which n of the k drafts were accepted, the target keeps L + n positions
(context and accepted drafts; the token emitted last is fed in the next round's verify) and the draft
model keeps L + min(n, k - 1) (its k-th token was sampled but never fed back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.generate import FinishReason, Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, filter_logits, make_generator
from minigpt.tokenizer import EOT_ID

__all__ = ["sampling_probs", "verify_draft", "Drafter", "ModelDrafter", "Round", "SpeculativeGeneration",
           "generate_speculative", "measured_alpha", "acceptance_by_position"]


def sampling_probs(logits: Tensor, sampling: SamplingParams) -> Tensor:
    """logits (..., V) -> the float32 distribution `sample_next` draws from: softmax(filter(logits / T)),
    or the one-hot argmax when greedy (temperature 0)."""
    logits = logits.float()
    if sampling.greedy:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    flat = logits.reshape(-1, logits.shape[-1]) / sampling.temperature
    return torch.softmax(filter_logits(flat, sampling.top_k, sampling.top_p), dim=-1).reshape(logits.shape)


def verify_draft(draft_tokens: Sequence[int], q: Tensor, p: Tensor,
                 generator: torch.Generator | None = None) -> tuple[list[int], Tensor]:
    """The accept / resample rule of one round.

    draft_tokens: the k drafted ids, t_i drawn from q[i]; q (k, V): draft probabilities;
    p (k + 1, V): target probabilities at the same k positions and at the one after them.
    Returns (emitted, accept_probs): the accepted drafts followed by exactly one more token (from the
    normalised residual at the first rejection, else the bonus token from p[k]), and
    accept_probs (k,) = min(1, p_i(t_i) / q_i(t_i)) for every drafted position.
    """
    k = len(draft_tokens)
    if p.ndim != 2 or p.shape[0] != k + 1 or tuple(q.shape) != (k, p.shape[1]):
        raise ValueError(f"verify_draft: {k} draft tokens need q of shape ({k}, V) and p of shape ({k + 1}, V); "
                         f"got q {tuple(q.shape)}, p {tuple(p.shape)}")
    if k == 0:
        return [int(torch.multinomial(p[0], 1, generator=generator))], p.new_zeros(0)
    idx = torch.as_tensor(list(draft_tokens), dtype=torch.long, device=p.device)
    rows = torch.arange(k, device=p.device)
    p_t, q_t = p[rows, idx], q[rows, idx]
    accept_probs = torch.clamp(p_t / q_t.clamp_min(torch.finfo(q_t.dtype).tiny), max=1.0)
    u = torch.rand(k, generator=generator, device=p.device)
    accepted = (u < accept_probs).tolist()
    emitted: list[int] = []
    for i, ok in enumerate(accepted):
        if ok:
            emitted.append(int(draft_tokens[i]))
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        if not residual.sum() > 0:          # p == q up to rounding: a rejection had probability ~0
            residual = p[i]
        emitted.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return emitted, accept_probs
    emitted.append(int(torch.multinomial(p[k], 1, generator=generator)))          # the bonus token
    return emitted, accept_probs


class Drafter(Protocol):
    """Proposes draft tokens; the engine tells it how much of the context is final after each round."""

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[int], Tensor]:
        """Up to k tokens to follow `context`, and the (k', V) distributions they were drawn from."""
        ...

    def rollback(self, length: int) -> None:
        """Only context[:length] is final; forget anything computed past it."""
        ...


class ModelDrafter:
    """Drafts with a small model and its own contiguous KV cache."""

    def __init__(self, model: GPT, max_seq_len: int) -> None:
        self.model = model
        self.cache = KVCache.for_model(model, batch_size=1, max_seq_len=max_seq_len)

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[int], Tensor]:
        new = context[self.cache.length:]          # what the draft has not seen yet (at least 1 token)
        x = torch.tensor([new], device=self.model.device)
        tokens: list[int] = []
        rows: list[Tensor] = []
        for i in range(k):
            logits = self.model(x, positions=self.cache.next_positions(x.shape[1]), kv_caches=self.cache)[0, -1]
            q = sampling_probs(logits, sampling)
            t = int(q.argmax()) if sampling.greedy else int(torch.multinomial(q, 1, generator=generator))
            tokens.append(t)
            rows.append(q)
            if i < k - 1:
                x = torch.tensor([[t]], device=self.model.device)
        return tokens, torch.stack(rows)

    def rollback(self, length: int) -> None:
        truncate_cache(self.cache, min(self.cache.length, length))


@dataclass
class Round:
    """What one round did: the drafts, p and q at each drafted token, and what was emitted."""

    drafted: list[int]
    emitted: list[int]                 # accepted drafts + one resampled or bonus token
    p: list[float]                     # p_i(t_i)
    q: list[float]                     # q_i(t_i)
    accept_probs: list[float]          # min(1, p_i(t_i) / q_i(t_i))
    p_last: float                      # target probability of the last emitted token (before any residual)

    @property
    def n_accepted(self) -> int:
        return len(self.emitted) - 1

    @property
    def bonus(self) -> bool:
        """True when every draft was accepted and the last token came from p_{k+1}."""
        return self.n_accepted == len(self.drafted)


@dataclass
class SpeculativeGeneration(Generation):
    """A Generation plus the record of every round."""

    rounds: list[Round] = field(default_factory=list)

    @property
    def tokens_per_round(self) -> float:
        return sum(len(r.emitted) for r in self.rounds) / max(1, len(self.rounds))


@torch.inference_mode()
def generate_speculative(target: GPT, draft: GPT | Drafter, prompt: Sequence[int], max_new_tokens: int,
                         sampling: SamplingParams = SamplingParams(), *, k: int = 4,
                         stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                         tokenizer: object | None = None) -> SpeculativeGeneration:
    """Speculative decoding: same arguments, stopping rules and output distribution as `generate_kv_cache`.

    draft: a small model with the target's vocabulary (drafting with its own KV cache) or any `Drafter`
    (e.g. `minigpt.engine.ngram_draft.PromptLookupDrafter`). k: tokens drafted per round; a round
    drafts fewer near the end so that it never emits more than max_new_tokens. Greedy output equals the
    target's greedy output token for token.
    """
    ids = check_request(target, prompt, max_new_tokens)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k (tokens drafted per round) must be an int >= 0, got {k!r}")
    size = len(ids) + max_new_tokens
    if isinstance(draft, GPT):
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                             f"({target.config.vocab_size}); both must use the same tokenizer")
        draft = ModelDrafter(draft, size)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, target.device)
    cache = KVCache.for_model(target, batch_size=1, max_seq_len=size)
    context = list(ids)
    rounds: list[Round] = []
    reason: FinishReason | None = "length" if max_new_tokens == 0 else None
    V = target.config.vocab_size
    while reason is None:
        k_round = min(k, max_new_tokens - len(stop.tokens) - 1)
        drafted, q = draft.propose(context, k_round, sampling, generator) if k_round > 0 else ([], None)
        if q is None:
            q = torch.zeros(0, V, device=target.device)
        feed = context[cache.length:] + drafted                               # new token(s) + drafts
        logits = target(torch.tensor([feed], device=target.device), positions=cache.next_positions(len(feed)),
                        kv_caches=cache)[0, -(len(drafted) + 1):]             # (k' + 1, V)
        p = sampling_probs(logits, sampling)
        emitted, accept_probs = verify_draft(drafted, q, p, generator)
        n, L = len(emitted) - 1, len(context)
        rows = torch.arange(len(drafted), device=p.device)
        idx = torch.tensor(drafted, dtype=torch.long, device=p.device)
        rounds.append(Round(drafted, emitted, p[rows, idx].tolist(), q[rows, idx].tolist(), accept_probs.tolist(),
                            float(p[n, emitted[-1]])))
        truncate_cache(cache, L + n)            # keep the context and the accepted drafts
        draft.rollback(L + n)
        for t in emitted:
            reason = stop.add(t)
            context.append(t)
            if reason is not None:
                break
    return SpeculativeGeneration(stop.tokens, reason, prompt_tokens=len(ids), rounds=rounds)


def measured_alpha(rounds: Sequence[Round]) -> float:
    """Per-token acceptance rate: accepted drafts / drafts that were tested (a draft after a rejection is not
    tested). Under the i.i.d. model behind E = (1 - a^(k+1)) / (1 - a) this estimates a."""
    accepted = sum(r.n_accepted for r in rounds)
    tested = sum(r.n_accepted + (not r.bonus) for r in rounds if r.drafted)
    return accepted / tested if tested else float("nan")


def acceptance_by_position(rounds: Sequence[Round], k: int) -> list[float]:
    """For draft positions i = 1..k: P(t_i accepted | t_1..t_{i-1} accepted), over rounds that drafted k tokens."""
    reached, accepted = [0] * k, [0] * k
    for r in rounds:
        if len(r.drafted) != k:
            continue
        for i in range(min(r.n_accepted + 1, k)):
            reached[i] += 1
            accepted[i] += i < r.n_accepted
    return [a / n if n else float("nan") for a, n in zip(accepted, reached)]
