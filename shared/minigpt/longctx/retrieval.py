"""Retrieval at a distance: pass keys found (or not) against depth and total length, for every way of running a
model past its trained context, beside the perplexity of the same texts.

    policies = context_policies(model.config, factor=8)   # none, pi, ntk, yarn (+/- temperature, both ramps), windows
    grid = retrieval_grid(model, policies["yarn"], lengths=[512, 4096], depths=[0.1, 0.5, 0.9], n=2)
    grid.accuracy        # (len(lengths), len(depths)) fraction of pass keys greedy decoding would print
    grid.band_perplexity # perplexity per band of positions, over the longest texts

Every instance is seeded by (kind, length, depth, index) alone, so a cell is the same texts whichever other cells
are measured with it: `python -m minigpt.longctx.retrieval` measures the whole grid once and stores it in
data/longctx/retrieval.json, and a notebook can re-measure any cell and compare (`--policy NAME` re-measures only
that row and keeps the others).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.config import ModelConfig
from minigpt.longctx import rope_scaling as rs
from minigpt.longctx.long_forward import bucket_perplexity, long_logits
from minigpt.longctx.sliding_window import streaming_attention
from minigpt.model import GPT
from minigpt.paths import data_dir
from minigpt.training.context_tasks import ContextTask, answers_correct, haystack_tokens, kv_recall_task, passkey_task

__all__ = ["ContextPolicy", "context_policies", "task_instances", "RetrievalGrid", "retrieval_grid", "stored_grid",
           "GRID_LENGTHS", "GRID_DEPTHS", "GRID_N", "GRID_FACTOR"]

GRID_LENGTHS = (512, 1024, 2048, 4096)
GRID_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
GRID_N = 4
GRID_FACTOR = 8.0


@dataclass(frozen=True)
class ContextPolicy:
    """How the model runs past its context: RoPE frequencies, a multiplier of q.k, and an attention function."""
    name: str
    inv_freq: Tensor
    logit_scale: float = 1.0
    attention: str | AttentionFn = "sdpa"


def context_policies(cfg: ModelConfig, factor: float = GRID_FACTOR, window: int = 128, n_sinks: int = 4
                     ) -> dict[str, ContextPolicy]:
    """Unchanged RoPE, PI, NTK-aware, YaRN with and without its temperature (all at `factor`; the paper's ramp over
    turns), YaRN with the engines' ramp over the pair index (Transformers, vLLM, DeepSeek: what `rope_type: "yarn"`
    gives, temperature included), and a sliding window of `window` keys without and with `n_sinks` sinks (unchanged
    RoPE)."""
    def freqs(method: str, ramp: str = "turns") -> Tensor:
        return rs.scaled_inv_freq(cfg.head_dim, cfg.rope_theta, factor, method, cfg.max_seq_len, ramp=ramp)

    f0 = freqs("none")
    out = {m: ContextPolicy(m, freqs(m)) for m in ("none", "pi", "ntk")}
    out["yarn"] = ContextPolicy("yarn", freqs("yarn"), rs.yarn_logit_scale(factor))
    out["yarn, no temperature"] = ContextPolicy("yarn, no temperature", freqs("yarn"))
    out["yarn, index ramp"] = ContextPolicy("yarn, index ramp", freqs("yarn", "index"), rs.yarn_logit_scale(factor))
    out[f"window {window}"] = ContextPolicy(f"window {window}", f0, attention=streaming_attention(window))
    out[f"{n_sinks} sinks + window {window - n_sinks}"] = ContextPolicy(
        f"{n_sinks} sinks + window {window - n_sinks}", f0, attention=streaming_attention(window - n_sinks, n_sinks, f0))
    return out


def task_instances(kind: str, length: int, depth: float, n: int, split: str = "val") -> list[ContextTask]:
    """n held-out instances of one cell, each seeded by (kind, length, depth, index) alone."""
    make = {"passkey": passkey_task, "kv_recall": kv_recall_task}[kind]
    haystack = haystack_tokens(split)
    return [make(haystack, length, depth, random.Random(f"{kind}:{length}:{depth:.4f}:{i}")) for i in range(n)]


@dataclass
class RetrievalGrid:
    policy: str
    kind: str
    lengths: list[int]
    depths: list[float]
    accuracy: list[list[float]]                    # [length][depth]
    band_edges: list[int] = field(default_factory=list)
    band_perplexity: list[float] = field(default_factory=list)   # over the longest texts
    seconds: float = 0.0


@torch.no_grad()
def retrieval_grid(model: GPT, policy: ContextPolicy, lengths=GRID_LENGTHS, depths=GRID_DEPTHS, n: int = GRID_N,
                   kind: str = "passkey", band_edges: list[int] | None = None) -> RetrievalGrid:
    """Accuracy per (length, depth) cell, and perplexity per band of positions of the longest length's texts."""
    start = time.perf_counter()
    accuracy, nll_longest = [], []
    for length in lengths:
        tasks = [t for d in depths for t in task_instances(kind, length, d, n)]
        x = torch.stack([t.tokens for t in tasks])
        right = []
        for i in range(0, len(tasks), n):        # one batch per depth
            chunk = x[i:i + n].to(model.device)
            logits = long_logits(model, chunk, policy.inv_freq, attention=policy.attention,
                                 logit_scale=policy.logit_scale).float()
            if length == lengths[-1]:                 # perplexity is reported for the longest texts only
                nll_longest.append(F.cross_entropy(logits[:, :-1].transpose(1, 2), chunk[:, 1:], reduction="none").cpu())
            right += answers_correct(logits, tasks[i:i + n])
        accuracy.append([sum(right[j * n:(j + 1) * n]) / n for j in range(len(depths))])
    edges = band_edges or _default_edges(lengths[-1], model.config.max_seq_len)
    return RetrievalGrid(policy.name, kind, list(lengths), list(depths), accuracy, edges,
                         bucket_perplexity(torch.cat(nll_longest), edges), round(time.perf_counter() - start, 1))


def _default_edges(length: int, trained: int) -> list[int]:
    """[0, L, 2L, 4L, ..., length - 1): the trained context, then bands doubling in length."""
    edges = [0]
    edge = trained
    while edge < length - 1:
        edges.append(edge)
        edge *= 2
    return edges + [length - 1]


def stored_grid(path=None) -> dict:
    """The stored measurement (data/longctx/retrieval.json)."""
    path = path or data_dir() / "longctx" / "retrieval.json"
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure the retrieval grid of every context policy and store it.")
    parser.add_argument("--model", default="target-long")
    parser.add_argument("--kind", default="passkey", choices=["passkey", "kv_recall"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--policy", action="append", help="only this policy's row (repeatable); the stored file's "
                        "other rows are kept, in the order context_policies gives")
    args = parser.parse_args()
    from minigpt.checkpoint import load_model, load_card
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    policies = context_policies(model.config)
    unknown = set(args.policy or ()) - set(policies)
    if unknown:
        parser.error(f"unknown policies {sorted(unknown)}; choose from {list(policies)}")
    kept = {}
    if args.policy:
        old = stored_grid()
        if old["model_sha256"] != load_card(args.model)["sha256"] or old["kind"] != args.kind:
            parser.error("the stored grid was measured on other weights or tasks: measure every row")
        kept = {g["policy"]: g for g in old["grids"]}
    grids = []
    for name, policy in policies.items():
        if args.policy and name not in args.policy:
            grids.append(kept[name])
            continue
        grid = retrieval_grid(model, policy, kind=args.kind)
        grids.append(grid.__dict__ | ({"threads": args.threads} if args.policy else {}))   # a row's own threads
        print(f"{policy.name:24s} " + " | ".join(" ".join(f"{a:.2f}" for a in row) for row in grid.accuracy)
              + f"  ppl {[round(p, 1) for p in grid.band_perplexity]}  ({grid.seconds:.0f} s)", flush=True)
    out = {"model": args.model, "model_sha256": load_card(args.model)["sha256"], "kind": args.kind,
           "factor": GRID_FACTOR, "n_per_cell": GRID_N, "threads": old["threads"] if args.policy else args.threads,
           "grids": grids}
    path = data_dir() / "longctx" / "retrieval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
