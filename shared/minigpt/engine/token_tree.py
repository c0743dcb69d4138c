"""Token trees (lab 06, part two): verify many candidate continuations in one target forward.

A tree of N nodes is two lists: tokens[i] and parents[i]. Node 0 is the root, the last token of the context (not yet
in the target's cache); every other node's parent comes before it (parents[i] < i; parents[0] == -1). A path from the
root is one candidate continuation; siblings are alternatives for the same position.

    tree tokens   t0 ─┬─ t1 ── t3            parents [-1, 0, 0, 1, 2, 2]
                      └─ t2 ─┬─ t4           depth    [ 0, 1, 1, 2, 2, 2]
                             └─ t5

One forward over the N nodes, after a cache of L positions, gives every node's next-token distribution if node i
sees the cache and exactly its own ancestors (itself included): the tree attention mask (SpecInfer, Medusa, EAGLE),
with node i at position L + depth(i), as if its path were the only continuation. The cache then holds all N nodes
at L..L+N-1; after verification only the accepted path stays (`keep_path`).

Verification walks from the root (`verify_tree`). Greedy: move to the child holding the target's argmax, stop at the
first node with no such child and emit the argmax there. Sampling, with the children of a node drawn independently
from the drafter's q at that node: recursive rejection sampling (SpecInfer's multi-step speculative sampling) tries
the children in order, accepting child x with probability min(1, r(x) / q(x)), where r starts as the target's p and
after each rejection becomes the normalised residual max(0, r - q); if every child is rejected it emits a token from
the last residual. Each try is lab 06's accept/resample step with target r, so each emitted token has the target's
distribution: the guarantee lab 06 proves for a chain holds for the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from minigpt.cache.contiguous import KVCache

__all__ = ["TokenTree", "check_parents", "tree_depths", "tree_attention_inputs", "verify_tree", "keep_path"]


@dataclass
class TokenTree:
    """tokens[i] at node i, its parent parents[i] (-1 for the root, node 0), q[i] the distribution the children of
    node i were drawn from ((N, V); rows of nodes never expanded are unused)."""

    tokens: list[int]
    parents: list[int]
    q: Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


def check_parents(parents: Sequence[int]) -> None:
    """ValueError unless parents describes a tree rooted at node 0: parents[0] == -1, 0 <= parents[i] < i."""
    if not len(parents) or parents[0] != -1:
        raise ValueError(f"a token tree needs its root at node 0 with parent -1, got parents {list(parents)[:8]}")
    for i, parent in enumerate(parents[1:], 1):
        if isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < i:
            raise ValueError(f"node {i}'s parent must be an earlier node (0 <= parent < {i}), got {parent!r}")


def tree_depths(parents: Sequence[int]) -> list[int]:
    """depth[i]: edges from the root to node i."""
    check_parents(parents)
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def tree_attention_inputs(parents: Sequence[int], past_len: int, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(mask (N, past_len + N) bool, positions (N,) int64) for one forward of a tree's N nodes after past_len cached
    positions: node i sees every cached position and its own ancestors and itself; it sits at past_len + depth(i)."""
    check_parents(parents)
    if isinstance(past_len, bool) or not isinstance(past_len, int) or past_len < 0:
        raise ValueError(f"past_len must be an int >= 0, got {past_len!r}")
    n = len(parents)
    mask = torch.zeros(n, past_len + n, dtype=torch.bool, device=device)
    mask[:, :past_len] = True
    positions = torch.full((n,), past_len, dtype=torch.long, device=device)
    mask[0, past_len] = True
    for i in range(1, n):                      # parents come first: their rows are complete
        mask[i] = mask[parents[i]]             # the parent's ancestors and the parent ...
        mask[i, past_len + i] = True           # ... and the node itself
        positions[i] = positions[parents[i]] + 1
    return mask, positions


def verify_tree(tokens: Sequence[int], parents: Sequence[int], p: Tensor, q: Tensor | None = None, *, greedy: bool,
                generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """Walk a tree (tokens, parents) against the target's distributions p (N, V), p[i] being the target's next-token
    distribution after node i's path. Returns (path, emitted): the accepted nodes below the root in order, and their
    tokens followed by one more token (the argmax or the residual's sample where the walk stopped, or a draw from p
    at an accepted leaf).

    greedy: a child is accepted when its token is the target's argmax. Otherwise the children of node i must have
    been drawn independently from q[i] (q (N, V)), and recursive rejection sampling keeps the target's distribution."""
    check_parents(parents)
    n = len(parents)
    if len(tokens) != n or p.ndim != 2 or p.shape[0] != n:
        raise ValueError(f"a tree of {n} nodes needs {n} tokens and p of shape ({n}, V), one row per node; got "
                         f"{len(tokens)} tokens and p {tuple(p.shape)}")
    if not greedy and (q is None or q.shape != p.shape):
        raise ValueError(f"sampled verification needs q of shape {tuple(p.shape)} (the distribution each node's "
                         f"children were drawn from), got {None if q is None else tuple(q.shape)}")
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    path: list[int] = []
    node = 0
    while True:
        if greedy:
            best = int(p[node].argmax())
            match = next((c for c in children[node] if int(tokens[c]) == best), None)
            if match is None:
                return path, [int(tokens[c]) for c in path] + [best]
            path.append(match)
            node = match
            continue
        r, q_node = p[node].float(), q[node].float()
        for child in children[node]:
            x = int(tokens[child])
            ratio = float(r[x]) / max(float(q_node[x]), torch.finfo(torch.float32).tiny)
            if float(torch.rand((), generator=generator, device=p.device)) < min(1.0, ratio):
                path.append(child)
                node = child
                break
            residual = (r - q_node).clamp_min(0.0)
            if residual.sum() > 0:        # r == q up to rounding: a rejection had probability ~0, keep r
                r = residual / residual.sum()
        else:
            token = int(torch.multinomial(r, 1, generator=generator))
            return path, [int(tokens[c]) for c in path] + [token]


def keep_path(cache: KVCache, start: int, nodes: Sequence[int]) -> None:
    """After a tree forward wrote its nodes at cache positions start, start + 1, ...: keep the positions of `nodes`
    (node indices, in path order), moved to start, start + 1, ...; the cache's length becomes start + len(nodes)."""
    length = cache.length
    idx = torch.as_tensor([start + int(n) for n in nodes], dtype=torch.long)
    if len(nodes) and not (start <= int(idx.min()) and int(idx.max()) < length):
        raise ValueError(f"keep_path: nodes {list(nodes)} after position {start} are not all in the cache "
                         f"({length} positions)")
    for layer in cache:
        for buf in (layer.k, layer.v):
            buf[:, start:start + len(nodes)] = buf[:, idx.to(buf.device)]
        layer.length = start + len(nodes)
