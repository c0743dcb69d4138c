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
  itself plus the top budget - obs_window voted positions are kept (SnapKV also smooths the votes with a
  pooling kernel; here none).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn

__all__ = ["POLICIES", "snapkv_keep", "observation_scores", "keep_positions", "kept_attention_mass",
           "compressed_prompt_attention"]

POLICIES = ("full", "window", "sinks+window", "snapkv")
N_SINKS = 4


def snapkv_keep(obs_scores: Tensor, budget: int, obs_window: int) -> Tensor:
    """obs_scores (Hkv, w, N): attention of the last w prompt queries over the N prompt keys (w = obs_window)
    -> (Hkv, budget) kept positions, ascending: N-w..N-1 always, plus the top budget - w of 0..N-w-1 by the
    scores summed over the w queries."""
    H, w, N = obs_scores.shape
    if w != obs_window or not obs_window <= budget <= N:
        raise ValueError(f"need obs_window = w ({w}) <= budget <= N ({N}), got obs_window={obs_window}, budget={budget}")
    votes = obs_scores[:, :, :N - w].sum(1)                                    # (H, N - w)
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
    if policy == "snapkv":
        return snapkv_keep(observation_scores(q, k, prompt_len, obs_window), budget, obs_window)
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


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

    Prompt queries are plain causal (the prefill happened before the eviction); `policy="full"` keeps all.
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
        if policy != "full":
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
