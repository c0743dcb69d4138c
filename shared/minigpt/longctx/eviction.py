"""Evicting KV entries by attention (SnapKV-style) against a sliding window, at the same budget.

    keep = snapkv_keep(obs_scores, budget=64, obs_window=16)      # (Hkv, budget) prompt positions per KV head
    attn = compressed_prompt_attention(prompt_len=448, budget=64, policy="snapkv")
    nll = position_nll(model, tokens, inv_freq, attention=attn)   # the continuation reads only the kept keys

After the prompt (N tokens) is prefilled, each layer keeps `budget` of its N cached positions per KV head and
drops the rest; the tokens that follow attend to the kept prompt keys and to each other. Policies:
* "window": the last `budget` prompt positions (what a sliding window would hold);
* "sinks+window": the first 4 and the last budget - 4 (StreamingLLM);
* "snapkv" (Li et al. 2024): the last `obs_window` prompt queries vote: their attention probabilities over
  the prompt, summed over those queries and over the query heads of each KV head; the observation window
  itself plus the top budget - obs_window voted positions are kept;
* "snapkv pooled": the same, the votes first averaged over a window of `SNAPKV_KERNEL` neighbouring positions (SnapKV's
  own code pools them, `avg_pool1d`), so the tokens next to a voted one are kept with it: an answer of several tokens
  is read one token after another, and the question votes only for where it starts.
* "h2o" (Zhang et al. 2023, Heavy-Hitter Oracle): no question needed. Every key's attention, summed over all the
  queries that have seen it (and the query heads of its KV head), is its score; the cache holds `budget` tokens,
  half of them the most recent, the other half the heavy hitters. After the prefill the prompt is cut to that,
  then it keeps evicting as it decodes: each new token enters, and the non-recent token with the lowest score
  leaves. An evicted token never comes back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn

__all__ = ["POLICIES", "SNAPKV_KERNEL", "snapkv_keep", "observation_scores", "keep_positions", "kept_attention_mass",
           "compressed_prompt_attention", "h2o_mask"]

POLICIES = ("full", "window", "sinks+window", "snapkv", "snapkv pooled", "h2o")
SNAPKV_KERNEL = 7
N_SINKS = 4


def snapkv_keep(obs_scores: Tensor, budget: int, obs_window: int, kernel: int = 1) -> Tensor:
    """obs_scores (Hkv, w, N): attention of the last w prompt queries over the N prompt keys (w = obs_window)
    -> (Hkv, budget) kept positions, ascending: N-w..N-1 always, plus the top budget - w of 0..N-w-1 by the
    scores summed over the w queries (then averaged over `kernel` neighbours, an odd number; 1: not pooled)."""
    H, w, N = obs_scores.shape
    if w != obs_window or not obs_window <= budget <= N:
        raise ValueError(f"need obs_window = w ({w}) <= budget <= N ({N}), got obs_window={obs_window}, budget={budget}")
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel must be a positive odd number, got {kernel}")
    votes = obs_scores[:, :, :N - w].sum(1)                                    # (H, N - w)
    if kernel > 1:
        votes = F.avg_pool1d(votes[:, None], kernel, stride=1, padding=kernel // 2, count_include_pad=False)[:, 0]
    top = votes.topk(budget - w, dim=-1).indices
    recent = torch.arange(N - w, N).expand(H, w)
    return torch.cat([top, recent], dim=-1).sort(dim=-1).values


def observation_scores(q: Tensor, k: Tensor, prompt_len: int, obs_window: int) -> Tensor:
    """Attention probabilities (Hkv, w, N) of the prompt's last w queries over its N keys, causal, summed over
    the query heads that share each KV head. q (1, Hq, T, D), k (1, Hkv, T, D)."""
    Hq, Hkv, D = q.shape[1], k.shape[1], q.shape[-1]
    qo = q[0, :, prompt_len - obs_window:prompt_len].float()
    kp = k[0, :, :prompt_len].float().repeat_interleave(Hq // Hkv, 0)
    scores = qo @ kp.transpose(-1, -2) / math.sqrt(D)                        # (Hq, w, N)
    i = torch.arange(prompt_len - obs_window, prompt_len)[:, None]
    scores = scores.masked_fill(torch.arange(prompt_len)[None, :] > i, float("-inf"))
    return torch.softmax(scores, -1).view(Hkv, Hq // Hkv, obs_window, prompt_len).sum(1)


def keep_positions(policy: str, q: Tensor, k: Tensor, prompt_len: int, budget: int, obs_window: int = 16) -> Tensor:
    """(Hkv, budget) prompt positions each KV head keeps under `policy` (ascending)."""
    Hkv = k.shape[1]
    if policy == "window":
        return torch.arange(prompt_len - budget, prompt_len).expand(Hkv, budget)
    if policy == "sinks+window":
        pos = list(range(N_SINKS)) + list(range(prompt_len - budget + N_SINKS, prompt_len))
        return torch.tensor(pos).expand(Hkv, budget)
    if policy in ("snapkv", "snapkv pooled"):
        kernel = SNAPKV_KERNEL if policy == "snapkv pooled" else 1
        return snapkv_keep(observation_scores(q, k, prompt_len, obs_window), budget, obs_window, kernel)
    if policy == "h2o":
        return h2o_mask(q, k, prompt_len, budget)[:, prompt_len - 1, :prompt_len].nonzero()[:, 1].view(Hkv, -1)
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


def h2o_mask(q: Tensor, k: Tensor, prompt_len: int, budget: int, recent: int | None = None) -> Tensor:
    """H2O's attention mask (Hkv, T, T) for one sequence: prompt rows causal (the prefill), then row t >= prompt_len
    sees only what the heavy-hitter cache of `budget` tokens holds at step t. q (1, Hq, T, D), k (1, Hkv, T, D).

    Row prompt_len - 1 (the last prompt query) is rewritten to the cut prompt, so it lists what the prefill kept.
    """
    Hq, Hkv, D, T = q.shape[1], k.shape[1], q.shape[-1], q.shape[2]
    recent = budget // 2 if recent is None else recent
    if not 0 < recent < budget <= prompt_len:
        raise ValueError(f"need 0 < recent ({recent}) < budget ({budget}) <= prompt_len ({prompt_len})")
    group = Hq // Hkv
    scores = q[0].float() @ k[0].float().repeat_interleave(group, 0).transpose(-1, -2) / math.sqrt(D)   # (Hq, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    prompt_probs = torch.softmax(scores[:, :prompt_len].masked_fill(~causal[:prompt_len], float("-inf")), -1)
    score = prompt_probs.sum(1).view(Hkv, group, T).sum(1)                        # (Hkv, T) accumulated attention
    pos = torch.arange(T)
    heavy = score[:, :prompt_len - recent].topk(budget - recent, dim=-1).indices
    kept = torch.zeros(Hkv, T, dtype=torch.bool)
    kept.scatter_(1, heavy, True)
    kept[:, prompt_len - recent:prompt_len] = True
    mask = causal.expand(Hkv, T, T).clone()
    mask[:, prompt_len - 1] = kept
    for t in range(prompt_len, T):
        kept[:, t] = True
        full = kept.sum(-1) > budget                                              # (Hkv,) one too many
        if full.any():
            evictable = kept & (pos <= t - recent)
            victim = score.masked_fill(~evictable, float("inf")).argmin(-1)
            kept[full, victim[full]] = False
        mask[:, t] = kept
        probs = torch.softmax(scores[:, t].masked_fill(~kept.repeat_interleave(group, 0), float("-inf")), -1)
        score += probs.view(Hkv, group, T).sum(1)
    return mask


def kept_attention_mass(q: Tensor, k: Tensor, prompt_len: int, kept: Tensor) -> float:
    """Of the attention that the queries after the prompt pay to prompt keys under FULL attention, the fraction
    that falls on kept keys (mean over heads and queries). kept: (Hkv, prompt_len) bool. q (1, Hq, T, D)."""
    Hq, Hkv, D, T = q.shape[1], k.shape[1], q.shape[-1], q.shape[2]
    kk = k[0].float().repeat_interleave(Hq // Hkv, 0)
    scores = q[0, :, prompt_len:].float() @ kk.transpose(-1, -2) / math.sqrt(D)          # (Hq, T - N, T)
    rows = torch.arange(prompt_len, T)[:, None]
    probs = torch.softmax(scores.masked_fill(torch.arange(T)[None, :] > rows, float("-inf")), -1)[..., :prompt_len]
    on_kept = (probs * kept.repeat_interleave(Hq // Hkv, 0)[:, None, :]).sum(-1)
    return float((on_kept / probs.sum(-1)).mean())


def compressed_prompt_attention(prompt_len: int, budget: int, policy: str, obs_window: int = 16,
                                record: list[float] | None = None) -> AttentionFn:
    """Attention (batch 1, Tq == Tk) in which queries after the prompt see only the kept prompt keys.

    Prompt queries are plain causal (the prefill happened before the eviction); `policy="full"` keeps all;
    "h2o" goes on evicting after the prompt (`h2o_mask`), the others keep their prompt positions and every later token.
    `record`: a list that receives, per layer call, the `kept_attention_mass` of the policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, Hq, T, _ = q.shape
        if B != 1 or k.shape[2] != T:
            raise ValueError("compressed_prompt_attention runs on one whole sequence (batch 1, Tq == Tk)")
        Hkv = k.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(Hkv, T, T).clone()
        if policy == "h2o":
            mask = h2o_mask(q, k, prompt_len, budget)
            kept = mask[:, prompt_len - 1, :prompt_len].clone()
            mask[:, prompt_len - 1] = torch.arange(T) < prompt_len
            if record is not None:
                record.append(kept_attention_mass(q, k, prompt_len, kept))
        elif policy != "full":
            keep = keep_positions(policy, q, k, prompt_len, budget, obs_window)
            kept = torch.zeros(Hkv, prompt_len, dtype=torch.bool)
            kept.scatter_(1, keep, True)
            mask[:, prompt_len:, :prompt_len] = kept[:, None, :]
            if record is not None:
                record.append(kept_attention_mass(q, k, prompt_len, kept))
        elif record is not None:
            record.append(1.0)
        group = Hq // Hkv
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              attn_mask=mask.repeat_interleave(group, 0)[None])

    return attention
