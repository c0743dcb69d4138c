"""Speculative decoding with a draft head and token trees (lab 06, part two).

One round, the context's last token x_L being the root (not yet in the target's cache, which holds L positions):

    head     read the pairs it has not seen, (f_{t-1}, x_t) up to the root's, with the target's real features;
             grow a tree level by level: the children of a node come from the head's q at that node (greedy: its
             `branch` likeliest tokens; sampling: `branch` independent draws), and the `width` likeliest paths of each
             level are fed back, (f^_parent, x_child), to expand the next one: `depth` head calls a round
    verify   ONE target forward over the tree's nodes with the tree attention mask (token_tree.tree_attention_inputs)
    accept   token_tree.verify_tree: the longest accepted path and one more token, the target's distribution kept
    keep     the target's cache keeps the root and the accepted path (token_tree.keep_path); the head's cache drops
             its speculative entries, and the next round's pairs carry the target's features of the accepted nodes

A chain of k drafts is TreeShape(depth=k). The output equals the target's greedy output (greedy) or has its
distribution (sampling), as lab 06's loop does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import Tensor

from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.engine.draft_head import DraftHead, head_cache, target_features, tree_attention, with_attention
from minigpt.engine.speculative import sampling_probs
from minigpt.engine.token_tree import TokenTree, keep_path, tree_attention_inputs, tree_depths, verify_tree
from minigpt.generate import FinishReason, Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator
from minigpt.tokenizer import EOT_ID

__all__ = ["TreeShape", "TreeRound", "HeadGeneration", "draft_chain", "grow_tree", "head_rounds", "generate_with_head",
           "chain_acceptance", "card_acceptance"]


@dataclass(frozen=True)
class TreeShape:
    """depth levels below the root; each node expanded gets `branch` children; `width` nodes a level are expanded.
    TreeShape(k) is a chain of k drafts."""

    depth: int
    width: int = 1
    branch: int = 1

    def __post_init__(self) -> None:
        for name in ("depth", "width", "branch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "depth" else 1):
                raise ValueError(f"TreeShape.{name} must be an int >= {0 if name == 'depth' else 1}, got {value!r}")

    @property
    def nodes(self) -> int:
        """Nodes of the tree `grow_tree` grows (root included): level 1 has `branch`, each next level `branch` per
        node expanded, at most `width` of the level before."""
        total, level = 1, 1
        for _ in range(self.depth):
            level = self.branch * min(level, self.width)
            total += level
        return total


@dataclass(frozen=True)
class TreeRound:
    """One round: the tree drafted below the root (node 0, the context's last token; parents[i] < i), the nodes the
    target accepted, the tokens the round emitted, and what the generation keeps of them."""

    tokens: list[int]
    parents: list[int]
    path: list[int]                     # the accepted nodes below the root, in order (`verify_tree`)
    emitted: list[int]                  # the path's tokens, then the target's token where the walk stopped
    new_tokens: list[int]               # `emitted`, cut where a stop rule ends the generation
    finish_reason: FinishReason | None  # None while the generation goes on

    @property
    def nodes(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(tree_depths(self.parents))

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def extra(self) -> int:
        """The token the target adds after the accepted path."""
        return self.emitted[len(self.path)]


@dataclass
class HeadGeneration(Generation):
    rounds: list[TreeRound] = field(default_factory=list)

    @property
    def tokens_per_round(self) -> float:
        return sum(len(r.emitted) for r in self.rounds) / max(1, len(self.rounds))


def _children(logits: Tensor, q: Tensor, branch: int, sampling: SamplingParams,
              generator: torch.Generator | None) -> list[int]:
    """greedy: the `branch` likeliest tokens by the head's logits (q is one-hot then); else independent draws from q."""
    if sampling.greedy:
        return logits.topk(branch).indices.tolist()
    return torch.multinomial(q, branch, replacement=True, generator=generator).tolist()


def draft_chain(head: DraftHead, target: GPT, cache: KVCache, features: Tensor, tokens: Sequence[int],
                k: int) -> list[int]:
    """Draft k greedy tokens with the head. features (m, d) and tokens (m,) are the pairs (f_{t-1}, x_t) the head has
    not read yet, the last one the root's; the head's cache holds the pairs before them (its positions
    1..cache.length). The cache then also holds the m pairs and the k - 1 drafts fed back (the last is never fed)."""
    f, x = features[None], torch.tensor([list(tokens)], device=features.device)
    drafts: list[int] = []
    for i in range(k):
        predicted, logits = head(f, x, target, cache.length + 1 + torch.arange(x.shape[1]), cache)
        drafts.append(int(logits[0, -1].argmax()))
        if i < k - 1:
            f, x = predicted[:, -1:], torch.tensor([[drafts[-1]]], device=features.device)
    return drafts


def grow_tree(head: DraftHead, target: GPT, cache: KVCache, features: Tensor, tokens: Sequence[int], shape: TreeShape,
              sampling: SamplingParams = SamplingParams(), generator: torch.Generator | None = None) -> TokenTree:
    """A token tree of `shape` below the root tokens[-1] (features, tokens, cache as in `draft_chain`). The head's cache
    keeps the pairs read and the nodes fed; the caller truncates it back after verification."""
    root_position = cache.length + len(tokens)
    tree = TokenTree([int(tokens[-1])], [-1], None)
    V = target.config.vocab_size
    q_rows: dict[int, Tensor] = {}
    scores = {0: 0.0}
    fed: list[int] = []                 # tree nodes in the head's cache after the committed pairs, in order
    committed = cache.length + len(tokens)
    predicted, logits = head(features[None], torch.tensor([list(tokens)]), target,
                             cache.length + 1 + torch.arange(len(tokens)), cache)
    expand = {0: (predicted[0, -1], logits[0, -1].float())}
    for level in range(1, shape.depth + 1):
        new: list[int] = []
        for node, (_, node_logits) in expand.items():
            q_rows[node] = q = sampling_probs(node_logits, sampling)
            logp = torch.log_softmax(node_logits, -1)
            for token in _children(node_logits, q, shape.branch, sampling, generator):
                tree.tokens.append(int(token))
                tree.parents.append(node)
                scores[len(tree.tokens) - 1] = scores[node] + float(logp[token])
                new.append(len(tree.tokens) - 1)
        if level == shape.depth:
            break
        chosen = sorted(new, key=lambda n: -scores[n])[:shape.width]
        feats = torch.stack([expand[tree.parents[n]][0] for n in chosen])[None]
        ids = torch.tensor([[tree.tokens[n] for n in chosen]])
        mask = _head_mask(tree.parents, fed, chosen, committed)
        with with_attention([head.block], tree_attention(mask)):
            predicted, logits = head(feats, ids, target, torch.full((len(chosen),), root_position + level), cache)
        fed += chosen
        expand = {n: (predicted[0, j], logits[0, j].float()) for j, n in enumerate(chosen)}
    tree.q = torch.zeros(len(tree), V)
    for node, q in q_rows.items():
        tree.q[node] = q
    return tree


def _head_mask(parents: list[int], fed: list[int], new: list[int], committed: int) -> Tensor:
    """The head's attention for the nodes `new`, after `committed` real pairs and the nodes `fed` already in its
    cache: each sees every real pair, its fed ancestors, and itself."""
    mask = torch.zeros(len(new), committed + len(fed) + len(new), dtype=torch.bool)
    mask[:, :committed] = True
    where = {n: committed + j for j, n in enumerate(fed)}
    for j, n in enumerate(new):
        mask[j, committed + len(fed) + j] = True
        a = parents[n]
        while a > 0:
            if a in where:
                mask[j, where[a]] = True
            a = parents[a]
    return mask


@torch.inference_mode()
def head_rounds(target: GPT, head: DraftHead, prompt: Sequence[int], max_new_tokens: int,
                sampling: SamplingParams = SamplingParams(), *, shape: TreeShape = TreeShape(4),
                stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                tokenizer: object | None = None) -> Iterator[TreeRound]:
    """Speculative decoding with the head's trees, a round per `next()` (see the module docstring); ends after the
    round whose finish_reason is set, at once when max_new_tokens is 0."""
    ids = check_request(target, prompt, max_new_tokens)
    size = len(ids) + max_new_tokens + shape.nodes
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, target.device)
    cache = KVCache.for_model(target, batch_size=1, max_seq_len=size)
    hcache = head_cache(head, size)
    context = list(ids)
    features = torch.zeros(0, target.config.d_model)
    if len(ids) > 1:
        f, _ = target_features(target, torch.tensor([ids[:-1]]), cache.next_positions(len(ids) - 1), cache)
        features = f[0]
    pending = context[1:]                        # tokens x_t whose pairs (f_{t-1}, x_t) the head has not read
    reason: FinishReason | None = "length" if max_new_tokens == 0 else None
    while reason is None:
        depth = min(shape.depth, max_new_tokens - len(stop.tokens) - 1)
        read = depth > 0 and bool(pending)       # the head reads the pending pairs only when it drafts
        if read:
            committed = hcache.length + len(pending)
            tree = grow_tree(head, target, hcache, features, pending, TreeShape(depth, shape.width, shape.branch),
                             sampling, generator)
        else:
            tree = TokenTree([context[-1]], [-1], torch.zeros(1, target.config.vocab_size))
        L = cache.length
        mask, positions = tree_attention_inputs(tree.parents, L)
        with with_attention(target.layers, tree_attention(mask)):
            f, logits = target_features(target, torch.tensor([tree.tokens]), positions, cache)
        path, emitted = verify_tree(tree.tokens, tree.parents, sampling_probs(logits[0], sampling), tree.q,
                                    greedy=sampling.greedy, generator=generator)
        keep_path(cache, L, [0] + path)
        landed = f[0, [0] + path]                # f at the root and the accepted nodes: the features of `emitted`
        if read:
            truncate_cache(hcache, committed)    # drop the speculative nodes, keep the pairs read
            features, pending = landed, list(emitted)
        else:
            features, pending = torch.cat([features, landed]), pending + emitted
        before = len(stop.tokens)
        for t in emitted:
            reason = stop.add(t)
            context.append(t)
            if reason is not None:
                break
        yield TreeRound(list(tree.tokens), list(tree.parents), path, emitted, stop.tokens[before:], reason)


def generate_with_head(target: GPT, head: DraftHead, prompt: Sequence[int], max_new_tokens: int,
                       sampling: SamplingParams = SamplingParams(), *, shape: TreeShape = TreeShape(4),
                       stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                       tokenizer: object | None = None) -> HeadGeneration:
    """Speculative decoding with the head's trees; arguments, stops and output distribution as `generate_kv_cache`."""
    rounds = list(head_rounds(target, head, prompt, max_new_tokens, sampling, shape=shape,
                              stop_token_ids=stop_token_ids, stop_strings=stop_strings, tokenizer=tokenizer))
    tokens = [t for r in rounds for t in r.new_tokens]
    reason = rounds[-1].finish_reason if rounds else "length"
    return HeadGeneration(tokens, reason, prompt_tokens=len(prompt), rounds=rounds)


def chain_acceptance(rounds: Sequence[TreeRound], depth: int) -> list[float]:
    """For chain rounds of `depth` drafts: P(draft i accepted | drafts 1..i-1 accepted), i = 1..depth."""
    reached, accepted = [0] * depth, [0] * depth
    for r in rounds:
        if r.depth != depth:
            continue
        for i in range(min(r.accepted + 1, depth)):
            reached[i] += 1
            accepted[i] += i < r.accepted
    return [round(a / n, 4) if n else float("nan") for a, n in zip(accepted, reached)]


def card_acceptance(target: GPT, head: DraftHead, depth: int, prompts: int = 8, prompt_len: int = 64,
                    new_tokens: int = 64) -> list[float]:
    """Greedy chains of `depth` drafts on `prompts` held-out prompts (validation text at evenly spaced offsets)."""
    from minigpt.training.data import load_tokens
    val = load_tokens("val")
    step = (len(val) - prompt_len) // prompts
    rounds: list[TreeRound] = []
    for i in range(prompts):
        prompt = val[i * step:i * step + prompt_len].tolist()
        rounds += generate_with_head(target, head, prompt, new_tokens, shape=TreeShape(depth), stop_token_ids=()).rounds
    return chain_acceptance(rounds, depth)
